"""optkit package: tuned settings -> Triton config fields, versions kept for rollback, lineage, bad input."""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from optkit.core.artifact import Artifact
from optkit.core.errors import UsageError
from optkit.package.build import package
from optkit.package.signature import read_signature
from optkit.package.targets import triton
from optkit.package.tuned import Tuned, defaults

from conftest import no_result_files, one_error_line

CNN = "sample_models/torch_cnn.onnx"


def best_json(path, model, **setting) -> str:
    """A best.json as `optkit tune -o` writes it, for `model`."""
    session = {"inter_op_threads": 2, "execution_mode": "parallel", "graph_optimization": "extended",
               "cpu_mem_arena": False, "mem_pattern": False, **setting.pop("session", {})}
    s = {"provider": "cpu", "threads": 1, "batch": 8, "concurrency": 2, "sessions": "per-thread",
         "session": session, **setting}
    path.write_text(json.dumps({"model": str(model), "model_sha256": Artifact.load(model).sha256,
                                "objective": ["throughput"], "best": {"setting": s, "label": "test setting",
                                "figures": {"throughput_per_s": 1000.0},
                                "confirmed": {"figure": "throughput_per_s", "mean": 990.0, "ci95": [950, 1030]}}}))
    return str(path)


def config_of(**setting) -> str:
    sig = read_signature(CNN)
    base = defaults().setting
    tuned = Tuned(setting={**base, **setting, "session": {**base["session"], **setting.get("session", {})}})
    batching = sig.batchable and int(tuned.get("batch")) > 0
    return triton.build_config("cnn", sig, tuned, {"input": [1, 8, 8]}, 3).text if batching else ""


# one case per tuned field: (setting, the config line it must produce)
FIELDS = [
    ({"batch": 16}, "max_batch_size: 16"),
    ({"batch": 16}, "dynamic_batching { preferred_batch_size: [ 16 ] max_queue_delay_microseconds: 100 }"),
    ({"concurrency": 3, "sessions": "per-thread"}, "instance_group [ { count: 3 kind: KIND_CPU } ]"),
    ({"provider": "cuda"}, "instance_group [ { count: 1 kind: KIND_GPU } ]"),
    ({"provider": "tensorrt"}, 'gpu_execution_accelerator [ { name: "tensorrt" } ]'),
    ({"threads": 2}, 'parameters { key: "intra_op_thread_count" value { string_value: "2" } }'),
    ({"session": {"execution_mode": "parallel", "inter_op_threads": 2}},
     'parameters { key: "inter_op_thread_count" value { string_value: "2" } }'),
    ({"session": {"execution_mode": "parallel"}}, 'parameters { key: "execution_mode" value { string_value: "1" } }'),
    ({"session": {"execution_mode": "sequential"}},
     'parameters { key: "execution_mode" value { string_value: "0" } }'),
    ({"session": {"cpu_mem_arena": False}}, 'parameters { key: "enable_mem_arena" value { string_value: "0" } }'),
    ({"session": {"mem_pattern": False}}, 'parameters { key: "enable_mem_pattern" value { string_value: "0" } }'),
    ({"session": {"graph_optimization": "basic"}}, "optimization { graph { level: -1 } }"),
    ({"session": {"graph_optimization": "extended"}}, "optimization { graph { level: 1 } }"),
    ({"session": {"graph_optimization": "disable"}}, "optimization { graph { level: 2 } }"),
    ({}, "version_policy { specific { versions: [ 3 ] } }"),
    ({}, 'model_warmup [ { name: "zeros" batch_size: 1 inputs { key: "input" value { data_type: TYPE_FP32 '
         'dims: [ 1, 8, 8 ] zero_data: true } } } ]'),
]


@pytest.mark.parametrize("setting,line", FIELDS, ids=[f"{i}-{line.split()[0]}" for i, (_, line) in enumerate(FIELDS)])
def test_each_tuned_field_has_its_triton_field(setting, line):
    assert line in config_of(**setting).splitlines() or line in config_of(**setting)


def test_defaults_are_stated_and_all_means_no_graph_level():
    text = config_of()
    assert "optimization" not in text  # graph_optimization all: the backend's default, level absent
    assert "dynamic_batching" not in text and "intra_op_thread_count" not in text
    assert "max_batch_size: 1" in text


def test_shared_sessions_with_requests_in_flight_is_said_and_written_as_instances():
    cfg = triton.build_config("cnn", read_signature(CNN),
                              Tuned(setting={**defaults().setting, "concurrency": 2, "sessions": "shared"}),
                              {"input": [1, 8, 8]}, 1)
    assert "count: 2" in cfg.text
    assert any("sessions shared with 2 in flight cannot be expressed" in n for n in cfg.notes)


def test_tune_then_package_for_triton(cli, tmp_path):
    best = tmp_path / "best.json"
    r = cli("tune", CNN, "--objective", "throughput", "--trials", "3", "--trial-seconds", "0.3", "--confirm", "0",
            "--space", "batch=1,8", "--space", "runtime=onnxruntime", "-o", best)
    assert r.rc == 0, r.err
    tuned = json.loads(best.read_text())
    assert tuned["model_sha256"] == Artifact.load(CNN).sha256
    repo = tmp_path / "repo"
    r = cli("package", CNN, "--to", "triton", "-o", repo, "--tuned", best, "--name", "cnn", "--tag", "v1.0")
    assert r.rc == 0, r.err
    config = (repo / "cnn" / "config.pbtxt").read_text()
    setting = tuned["best"]["setting"]
    assert f"max_batch_size: {setting['batch']}" in config
    assert f"count: {setting['concurrency']}" in config
    assert 'backend: "onnxruntime"' in config and "version_policy { specific { versions: [ 1 ] } }" in config
    assert (repo / "cnn" / "1" / "model.onnx").read_bytes() == open(CNN, "rb").read()
    lin = json.loads((repo / "cnn" / "1" / "optkit-package.json").read_text())
    assert lin["source"]["sha256"] == Artifact.load(CNN).sha256 and lin["tag"] == "v1.0"
    assert lin["tuned"]["setting"] == setting and lin["machine"]["cpu_count"] and lin["created"]
    assert lin["files"]["model.onnx"] == Artifact.load(CNN).sha256
    # inputs, outputs, dtypes and dims equal the graph's (batch axis dropped)
    io = re.findall(r'name: "(\w+)" data_type: (\w+) dims: \[ ([\d, -]+) \]', config)
    assert io == [("input", "TYPE_FP32", "1, 8, 8"), ("logits", "TYPE_FP32", "10")]


def test_versions_tags_rollback_inspect_compare(cli, tmp_path):
    repo = tmp_path / "repo"
    best = best_json(tmp_path / "best.json", CNN)
    first = package(CNN, target="triton", output=str(repo), name="cnn", tag="v1.0")
    second = package(CNN, target="triton", output=str(repo), name="cnn", tag="v1.1", tuned_path=best)
    assert (first.version, second.version, second.served_before) == (1, 2, 1)
    model = repo / "cnn"
    assert "versions: [ 2 ]" in (model / "config.pbtxt").read_text()
    assert "max_batch_size: 8" in (model / "config.pbtxt").read_text()
    with pytest.raises(UsageError, match="version 2 exists; optkit never overwrites a version"):
        package(CNN, target="triton", output=str(repo), name="cnn", version="2")
    with pytest.raises(UsageError, match="--tag v1.1 is already version 2"):
        package(CNN, target="triton", output=str(repo), name="cnn", tag="v1.1")

    r = cli("package", "serve-version", model, "--tag", "v1.0")
    assert r.rc == 0, r.err
    assert "serving version 1 (v1.0), was 2; versions kept: 1, 2" in r.out
    served = (model / "config.pbtxt").read_text()
    assert "versions: [ 1 ]" in served and "max_batch_size: 1" in served  # version 1's own config
    assert (model / "2" / "model.onnx").exists()
    r = cli("package", "serve-version", model, "--version", "2", "--json")
    assert json.loads(r.out)["before"] == 1

    r = cli("package", "inspect", repo, "--json")
    assert r.rc == 0, r.err
    m = json.loads(r.out)["models"][0]
    assert [(v["version"], v["tag"], v["served"]) for v in m["versions"]] == [(1, "v1.0", False), (2, "v1.1", True)]
    assert m["versions"][1]["lineage"]["tuned"] == "test setting"
    assert [h["served"] for h in m["history"]] == [1, 2, 1, 2]
    plain = cli("inspect", repo, "--json")  # plain inspect on a package reads it as package inspect does
    assert plain.rc == 0 and json.loads(plain.out) == json.loads(r.out), plain.err
    r = cli("inspect", model / "2")
    assert r.rc == 0 and "v1.1" not in r.err and "tuned: test setting" in r.out, r.err
    r = cli("report", "compare", model / "1", model / "2", "--json")
    assert r.rc == 0, r.err and json.loads(r.out)


def test_lineage_carries_the_passes_and_figures_of_the_report(tmp_path):
    from optkit.report.schema import ArtifactRef, Report, Stage

    src = Artifact.load(CNN)
    out = tmp_path / "m.onnx"
    shutil.copy(CNN, out)
    ref = ArtifactRef(path=CNN, format="onnx", sha256=src.sha256)
    # the "output" stands for a pass's result: same bytes here, so the same sha256
    rep = Report(command="optkit run r.yaml", stages=[
        Stage(name="input", output=ref, measurements={"size": {"bytes": 1}}),
        Stage(name="int8", **{"pass": "quantize.onnx-static"}, input=ref, output=ref.model_copy(),
              config={"mode": "static"}, measurements={"latency": {"p50_ms": 0.02, "ci95_pct": 3.0},
                                                       "accuracy": {"top1": 0.97}, "memory": {"peak_mb": 3.2}})])
    rep.save(tmp_path / "report.json")
    res = package(str(out), target="triton", output=str(tmp_path / "repo"), report_path=str(tmp_path / "report.json"))
    lin = json.loads((tmp_path / "repo" / "m" / "1" / "optkit-package.json").read_text())
    assert [p["pass"] for p in lin["passes"]] == [None, "quantize.onnx-static"]
    assert lin["passes"][1]["config"] == {"mode": "static"}
    assert lin["measured"]["latency"]["ci95_pct"] == 3.0 and lin["measured"]["memory"]["peak_mb"] == 3.2
    assert res.version == 1


def _external_data_model(tmp_path):
    m = onnx.load(CNN)
    dest = tmp_path / "ext" / "big.onnx"
    dest.parent.mkdir()
    onnx.save_model(m, str(dest), save_as_external_data=True, location="big.onnx.data")
    return dest


def test_external_data_model_is_packaged_with_its_data(tmp_path):
    model = _external_data_model(tmp_path)
    package(str(model), target="triton", output=str(tmp_path / "repo"))
    v = tmp_path / "repo" / "big" / "1"
    assert sorted(p.name for p in v.iterdir()) == ["big.onnx.data", "config.pbtxt", "model.onnx",
                                                    "optkit-package.json", "optkit-report.json"]
    import onnxruntime as ort

    x = np.zeros((1, 1, 8, 8), np.float32)
    a = ort.InferenceSession(str(v / "model.onnx")).run(None, {"input": x})[0]
    b = ort.InferenceSession(CNN).run(None, {"input": x})[0]
    np.testing.assert_allclose(a, b, rtol=1e-6)


def _model(path, inputs, outputs, nodes):
    g = helper.make_graph(nodes, "g", inputs, outputs)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return str(path)


def test_dynamic_dims_need_a_shape_and_say_where_it_came_from(tmp_path):
    model = _model(tmp_path / "seq.onnx", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])],
                   [helper.make_node("Relu", ["x"], ["y"])])
    with pytest.raises(UsageError, match=r"input 'x' has dynamic dims \[batch, seq\]; the warm-up needs them"):
        package(model, target="triton", output=str(tmp_path / "repo"))
    assert not (tmp_path / "repo").exists()
    res = package(model, target="triton", output=str(tmp_path / "repo"), shapes={"x": [1, 16]})
    text = (tmp_path / "repo" / "seq" / "config.pbtxt").read_text()
    assert 'name: "x" data_type: TYPE_FP32 dims: [ -1 ]' in text and "dims: [ 16 ] zero_data" in text
    assert "warm-up dims of 'x': [16] from --shape" in res.notes
    np.savez(tmp_path / "d.npz", x=np.zeros((3, 32), np.float32))
    res = package(model, target="triton", output=str(tmp_path / "repo"), data=str(tmp_path / "d.npz"))
    assert "warm-up dims of 'x': [32] from the data (d.npz)" in res.notes


def test_bad_inputs_one_line_exit_2_nothing_written(cli, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.txt").write_text("mine")
    r = cli("package", CNN, "--to", "triton", "-o", repo)
    assert r.rc == 2 and "holds 'notes.txt', which optkit did not create" in one_error_line(r)
    assert no_result_files(repo) == ["notes.txt"]

    other = _model(tmp_path / "other.onnx", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                   [helper.make_node("Relu", ["x"], ["y"])])
    best = best_json(tmp_path / "best.json", other)
    out = tmp_path / "out"
    r = cli("package", CNN, "--to", "triton", "-o", out, "--tuned", best)
    assert r.rc == 2 and "was made for another model" in one_error_line(r)
    assert not out.exists() and not list(tmp_path.glob(".out.tmp-*"))

    seq = tmp_path / "seq.onnx"
    g = helper.make_graph([helper.make_node("SequenceConstruct", ["x"], ["s"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(seq))
    r = cli("package", seq, "--to", "triton", "-o", out)
    assert r.rc == 2 and "output 's' is a sequence_type, not a tensor" in one_error_line(r)
    assert not out.exists()

    r = cli("package", "sample_models/keras_cnn.tflite", "--to", "triton", "-o", out)
    assert r.rc == 2 and "package takes an ONNX model: convert it first" in one_error_line(r)
    r = cli("package", CNN, "--to", "torchserve", "-o", out)
    assert r.rc == 2 and "--to 'torchserve': choose triton or mlflow" in one_error_line(r)
    assert not out.exists()


def test_an_unknown_file_in_a_model_folder_is_refused(tmp_path):
    repo = tmp_path / "repo"
    package(CNN, target="triton", output=str(repo), name="cnn")
    (repo / "cnn" / "7").mkdir()
    with pytest.raises(UsageError, match="holds '7', which optkit did not create"):
        package(CNN, target="triton", output=str(repo), name="cnn")
    with pytest.raises(UsageError, match="is a triton package, not mlflow"):
        package(CNN, target="mlflow", output=str(repo), name="cnn")


def test_manifests_parse_hold_their_keys_and_the_measured_memory(tmp_path):
    import yaml

    from optkit.package import manifests

    best = best_json(tmp_path / "best.json", CNN)
    json_best = json.loads(open(best).read())
    json_best["best"]["figures"]["memory_mb"] = 100.0
    (tmp_path / "best.json").write_text(json.dumps(json_best))
    res = package(CNN, target="triton", output=str(tmp_path / "repo"), name="cnn", tuned_path=best,
                  manifests="kserve,seldon,kubedl", storage_uri="s3://b/models/")
    docs = {k: yaml.safe_load((tmp_path / "repo" / "cnn" / "1" / "manifests" / f"{k}.yaml").read_text())
            for k in manifests.KINDS}
    for kind, doc in docs.items():
        manifests.check(kind, doc)
    assert docs["kserve"]["spec"]["predictor"]["model"]["modelFormat"] == {"name": "onnx"}
    assert docs["kserve"]["spec"]["predictor"]["model"]["storageUri"] == "s3://b/models"
    assert docs["kserve"]["spec"]["predictor"]["model"]["resources"]["requests"]["memory"] == "150Mi"
    assert docs["seldon"]["spec"] == {"storageUri": "s3://b/models/cnn", "requirements": ["onnx"], "memory": "150Mi"}
    assert docs["kubedl"]["kind"] == "ModelVersion" and docs["kubedl"]["spec"]["modelName"] == "cnn"
    assert any("measured peak 100.0 MiB" in n and "50% margin" in n for n in res.notes)
    with pytest.raises(UsageError, match="--manifests 'kserve,helm'"):
        package(CNN, target="triton", output=str(tmp_path / "repo"), manifests="kserve,helm")
    from optkit.core.errors import PassError

    with pytest.raises(PassError, match="lacks spec.requirements"):
        manifests.check("seldon", {"apiVersion": "x", "kind": "Model", "metadata": {"name": "a"},
                                   "spec": {"storageUri": "s3://x"}})


def test_a_failure_while_building_leaves_nothing(tmp_path, monkeypatch):
    from optkit.package import lineage

    repo = tmp_path / "repo"
    package(CNN, target="triton", output=str(repo), name="cnn")
    before = no_result_files(repo)

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(lineage, "file_hashes", boom)
    with pytest.raises(KeyboardInterrupt):
        package(CNN, target="triton", output=str(repo), name="cnn")
    assert no_result_files(repo) == before and sorted(p.name for p in (repo / "cnn").iterdir()) == [
        "1", "config.pbtxt", "optkit-versions.json"]
    with pytest.raises(KeyboardInterrupt):
        package(CNN, target="triton", output=str(tmp_path / "new"), name="cnn")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]


def test_a_scalar_input_is_served_as_one_element(tmp_path, realcases):
    """silero_vad's sample rate `sr` is a scalar, which Triton serves in no model without batching: the package's
    model.onnx takes it as [1] (a Reshape in front), computes what the source computes, and says so."""
    import onnxruntime as ort

    src = realcases / "silero_vad.onnx"
    res = package(str(src), target="triton", output=str(tmp_path / "repo"), name="vad",
                  shapes={"input": [1, 512], "state": [2, 1, 128]})
    text = (tmp_path / "repo" / "vad" / "config.pbtxt").read_text()
    assert '{ name: "sr" data_type: TYPE_INT64 dims: [ 1 ] }' in text and "max_batch_size: 0" in text
    assert 'inputs { key: "sr" value { data_type: TYPE_INT64 dims: [ 1 ] zero_data: true } }' in text
    assert any("'sr' is a scalar" in n for n in res.notes)
    served = tmp_path / "repo" / "vad" / "1" / "model.onnx"
    assert [i.shape for i in ort.InferenceSession(str(served)).get_inputs()] == [[None, None], [2, None, 128], [1]]
    rng = np.random.default_rng(0)
    x = {"input": rng.standard_normal((1, 512)).astype(np.float32) * 0.1, "state": np.zeros((2, 1, 128), np.float32)}
    want = ort.InferenceSession(str(src)).run(None, {**x, "sr": np.array(16000, np.int64)})
    got = ort.InferenceSession(str(served)).run(None, {**x, "sr": np.array([16000], np.int64)})
    assert all(np.array_equal(a, b) for a, b in zip(want, got))
    lin = json.loads((tmp_path / "repo" / "vad" / "1" / "optkit-package.json").read_text())
    assert lin["source"]["sha256"] == Artifact.load(str(src)).sha256 != lin["files"]["model.onnx"]


def test_scalar_outputs_and_batched_vectors(tmp_path):
    """A scalar output gets the same [1] (a Reshape at the end); with batching, a [batch] tensor is served as
    dims [1] reshaped to [] (Triton's own way; no graph change)."""
    import onnxruntime as ort

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    total = helper.make_tensor_value_info("total", TensorProto.FLOAT, [])
    g = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0)], "g", [x], [total])
    scalar_out = tmp_path / "sum.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), scalar_out)
    package(str(scalar_out), target="triton", output=str(tmp_path / "a"), name="sum")
    assert '{ name: "total" data_type: TYPE_FP32 dims: [ 1 ] }' in (tmp_path / "a" / "sum" / "config.pbtxt").read_text()
    (got,) = ort.InferenceSession(str(tmp_path / "a" / "sum" / "1" / "model.onnx")).run(None, {"x": np.ones(4, np.float32)})
    assert got.shape == (1,) and got[0] == 4.0

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, ["N"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])
    g = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, axes=[1]),
                           helper.make_node("Mul", ["s", "w"], ["y"])], "g", [x, w], [y])
    vec = tmp_path / "vec.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)]), vec)
    package(str(vec), target="triton", output=str(tmp_path / "b"), name="vec",
            tuned_path=best_json(tmp_path / "best.json", str(vec)))
    text = (tmp_path / "b" / "vec" / "config.pbtxt").read_text()
    assert "max_batch_size: 8" in text
    for name in ("w", "y"):
        assert f'{{ name: "{name}" data_type: TYPE_FP32 dims: [ 1 ] reshape {{ shape: [ ] }} }}' in text
    assert Artifact.load(str(tmp_path / "b" / "vec" / "1" / "model.onnx")).sha256 == Artifact.load(str(vec)).sha256
