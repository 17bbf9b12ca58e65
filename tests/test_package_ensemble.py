"""A model in parts packaged as a Triton ensemble: optkit split's folder (split.json and its part files, made here
with onnx.utils.Extractor as the split writes them) and a model with preprocessing in its graph (metadata
optkit.preprocess), each part a Triton model, the ensemble wiring them. Checked against Triton itself: every
config parsed by tritonclient's model_config_pb2, the repository loaded by a real tritonserver (its ensemble
scheduler is in the server core; the parts run on its Python backend: tests/_triton.py), and the answers equal
to the unsplit model's run by onnxruntime. Bad split folders are exit 2, one line, nothing written."""
from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import _triton
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.utils import Extractor
from test_package import best_json

from optkit.core.errors import UsageError
from optkit.package.build import package
from optkit.package.manage import serve_version

from conftest import REALCASES, SAMPLES, one_error_line, run_cli

CNN = SAMPLES / "torch_cnn.onnx"
CNN_CUTS = {"pre": (["input"], ["relu"]), "core": (["relu"], ["view"]), "post": (["view"], ["logits"])}
EFFNET = REALCASES / "efficientnet_lite1.onnx"
EFFNET_CUTS = {"pre": (["inputs"], ["hardtanh"]), "core": (["hardtanh"], ["mean"]), "post": (["mean"], ["output"])}


# ------------------------------------------------------------------ split folders and preprocessing, made here

def _shape(vi) -> list:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in vi.type.tensor_type.shape.dim]


def _spec(vi) -> dict:
    return {"name": vi.name, "dtype": helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type).name,
            "shape": _shape(vi)}


def make_split(src: Path, out: Path, cuts: dict) -> Path:
    """A folder as `optkit split SRC -o OUT` writes it (its contract: split.json and one file per part)."""
    out.mkdir(parents=True)
    proto = onnx.shape_inference.infer_shapes(onnx.load(str(src)))
    ex = Extractor(proto)
    parts = []
    for role, (ins, outs) in cuts.items():
        part = ex.extract_model(ins, outs)
        onnx.save(part, str(out / f"{role}.onnx"))
        ops: dict[str, int] = {}
        for n in part.graph.node:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
        parts.append({"name": role, "file": f"{role}.onnx", "device": "gpu" if role == "core" else "cpu",
                      "why": "test cut", "ops": ops, "inputs": [_spec(v) for v in part.graph.input],
                      "outputs": [_spec(v) for v in part.graph.output]})
    inits = {i.name for i in proto.graph.initializer}
    doc = {"schema": 1, "model": src.name, "provider": "tensorrt",
           "inputs": [_spec(v) for v in proto.graph.input if v.name not in inits],
           "outputs": [_spec(v) for v in proto.graph.output], "parts": parts,
           "cuts": [{"from": a["name"], "to": b["name"], "tensors": [{**t, "bytes_per_sample": 0} for t in a["outputs"]],
                     "bytes_per_sample": 0} for a, b in zip(parts, parts[1:])],
           "naive_cut_bytes_per_sample": None}
    (out / "split.json").write_text(json.dumps(doc, indent=1))
    return out


def with_uint8_preprocessing(src: Path, dest: Path, input_name: str) -> Path:
    """SRC behind a uint8 NHWC input: cast, (x - 127) / 128, to NCHW, as `optkit preprocess` puts it in the graph,
    with its metadata (the boundary is SRC's own input)."""
    proto = onnx.load(str(src))
    g = proto.graph
    x = next(i for i in g.input if i.name == input_name)
    n, c, h, w = _shape(x)
    image = helper.make_tensor_value_info("image", TensorProto.UINT8, [n, h, w, c])
    nodes = [helper.make_node("Cast", ["image"], ["pp_f"], to=TensorProto.FLOAT),
             helper.make_node("Sub", ["pp_f", "pp_mean"], ["pp_c"]),
             helper.make_node("Mul", ["pp_c", "pp_scale"], ["pp_n"]),
             helper.make_node("Transpose", ["pp_n"], [input_name], perm=[0, 3, 1, 2])]
    g.initializer.extend([helper.make_tensor("pp_mean", TensorProto.FLOAT, [], [127.0]),
                          helper.make_tensor("pp_scale", TensorProto.FLOAT, [], [1 / 128])])
    old = list(g.node)
    del g.node[:]
    g.node.extend(nodes + old)
    kept = [i for i in g.input if i.name != input_name]
    del g.input[:]
    g.input.extend([image, *kept])
    helper.set_model_props(proto, {"optkit.preprocess": json.dumps(
        {"input": "image", "outputs": [input_name], "spec": {"layout": "NHWC", "mean": 127, "std": 128}})})
    onnx.checker.check_model(proto)
    onnx.save(proto, str(dest))
    return dest


# ------------------------------------------------------------------ served by tritonserver

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One repository: `cnn` (the sample CNN in 3 parts, the core tuned), `cnnu8` (the CNN behind uint8
    preprocessing: pre + core) and, with ../shared, `effnet` (EfficientNet-Lite1 in 3 parts), served by one
    tritonserver for the module. Yields (url, repo, tmp)."""
    _triton.skip_unless_tool()
    tmp = tmp_path_factory.mktemp("ensemble")
    repo = tmp / "repo"
    split = make_split(CNN, tmp / "cnn_split", CNN_CUTS)
    package(str(split), {"to": "triton", "output": str(repo), "name": "cnn", "tag": "v1",
                         "tuned": best_json(tmp / "best.json", split / "core.onnx")})
    package(str(with_uint8_preprocessing(CNN, tmp / "cnn_u8.onnx", "input")), to="triton", output=str(repo),
            name="cnnu8")
    if EFFNET.exists():
        package(str(make_split(EFFNET, tmp / "eff_split", EFFNET_CUTS)), to="triton", output=str(repo),
                name="effnet")
    proof = _triton.proof_repository(repo, tmp / "proof")
    with _triton.tritonserver(proof, tmp, start_timeout=90) as (url, _):
        assert url, _triton.log_tail(tmp)
        yield url, repo, tmp


def _answer(url: str, model: str, feeds: dict) -> np.ndarray:
    out = _triton.infer(url, model, feeds)
    (dtype, shape, data), = out.values()
    return np.array(data, np.float32).reshape(shape)


def test_configs_are_tritons_and_wire_the_parts(served):
    _, repo, _ = served
    parsed = _triton.check_config(*(repo / m / "config.pbtxt" for m in ("cnn", "cnn.pre", "cnn.core", "cnn.post")))
    ens, pre, core, post = parsed
    assert ens["platform"] == "ensemble" and ens["max_batch_size"] == 8
    assert [(t["name"], t["data_type"], t["dims"]) for t in ens["input"]] == [("input", "TYPE_FP32", ["1", "8", "8"])]
    assert [(t["name"], t["dims"]) for t in ens["output"]] == [("logits", ["10"])]
    steps = ens["ensemble_scheduling"]["step"]
    assert [(s["model_name"], s["model_version"], s["input_map"], s["output_map"]) for s in steps] == [
        ("cnn.pre", "1", {"input": "input"}, {"relu": "relu"}), ("cnn.core", "1", {"relu": "relu"}, {"view": "view"}),
        ("cnn.post", "1", {"view": "view"}, {"logits": "logits"})]
    assert [c["instance_group"][0]["kind"] for c in (pre, core, post)] == ["KIND_CPU"] * 3
    assert all(c["max_batch_size"] == 8 and c["instance_group"][0]["count"] == 2 for c in (pre, core, post))
    assert core["parameters"]["intra_op_thread_count"] == {"string_value": "1"}  # the tuned setting: the core's
    assert "intra_op_thread_count" not in pre.get("parameters", {})
    assert pre["output"][0]["dims"] == ["16", "8", "8"] and core["input"][0]["dims"] == ["16", "8", "8"]
    lin = json.loads((repo / "cnn" / "1" / "optkit-package.json").read_text())
    assert lin["split"]["kind"] == "split" and [p["name"] for p in lin["split"]["parts"]] == ["pre", "core", "post"]
    assert set(lin["split"]["models"]) == {"cnn.pre", "cnn.core", "cnn.post"}
    assert set(lin["split"]["models"]["cnn.core"]) == {"model.onnx", "config.pbtxt"}
    assert lin["tuned"]["label"] == "test setting"
    index = json.loads((repo / "cnn" / "optkit-versions.json").read_text())
    assert index["parts"] == ["cnn.core", "cnn.post", "cnn.pre"]


def test_tritonserver_answers_like_the_unsplit_model(served):
    url, _, _ = served
    x = np.load(SAMPLES / "digits_eval_nchw.npz")["input"][:4].astype(np.float32)
    want = ort.InferenceSession(str(CNN)).run(None, {"input": x})[0]
    # not bit-exact: the tuned core runs onnxruntime's extended graph optimisations, and fusions stop at a cut
    np.testing.assert_allclose(_answer(url, "cnn", {"input": x}), want, rtol=1e-5, atol=1e-5)


def test_a_model_with_preprocessing_is_served_as_pre_and_core(served):
    url, repo, tmp = served
    pre = _triton.check_config(repo / "cnnu8.pre" / "config.pbtxt")
    assert [(t["name"], t["data_type"], t["dims"]) for t in pre["input"]] == [("image", "TYPE_UINT8", ["8", "8", "1"])]
    assert pre["instance_group"][0]["kind"] == "KIND_CPU"
    assert not (repo / "cnnu8.post").exists()
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (1, 8, 8, 1), dtype=np.uint8)  # max_batch_size 1: not tuned
    want = ort.InferenceSession(str(tmp / "cnn_u8.onnx")).run(None, {"image": image})[0]
    np.testing.assert_allclose(_answer(url, "cnnu8", {"image": image}), want, rtol=1e-6, atol=1e-6)
    lin = json.loads((repo / "cnnu8" / "1" / "optkit-package.json").read_text())
    assert lin["split"]["kind"] == "preprocess" and lin["split"]["cuts"][0]["tensors"][0]["name"] == "input"


def test_efficientnet_split_is_served_like_the_whole_model(served):
    url, repo, _ = served
    if not EFFNET.exists():
        pytest.skip("../shared/realcases is not present")
    x = np.random.default_rng(1).standard_normal((1, 3, 240, 240)).astype(np.float32)
    want = ort.InferenceSession(str(EFFNET)).run(None, {"inputs": x})[0]
    got = _answer(url, "effnet", {"inputs": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert got.argmax() == want.argmax()
    with urllib.request.urlopen(f"{url}/v2/models/effnet.core/ready", timeout=10) as r:
        assert r.status == 200


def test_rollback_switches_the_ensemble_and_its_parts(tmp_path):
    split = make_split(CNN, tmp_path / "split", CNN_CUTS)
    repo = tmp_path / "repo"
    package(str(split), to="triton", output=str(repo), name="cnn")
    package(str(split), {"to": "triton", "output": str(repo), "name": "cnn", "gpu": True})
    core = (repo / "cnn.core" / "config.pbtxt").read_text()
    assert "KIND_GPU" in core and "versions: [ 2 ]" in core
    assert "KIND_CPU" in (repo / "cnn.pre" / "config.pbtxt").read_text()
    out = serve_version(str(repo / "cnn"), version="1")
    assert (out["served"], out["before"]) == (1, 2)
    for model in ("cnn", "cnn.pre", "cnn.core", "cnn.post"):
        assert "versions: [ 1 ]" in (repo / model / "config.pbtxt").read_text()
    assert "KIND_CPU" in (repo / "cnn.core" / "config.pbtxt").read_text()
    (repo / "cnn.core" / "2" / "model.onnx").write_bytes(b"damaged")
    with pytest.raises(UsageError, match="edited after optkit packaged it"):
        serve_version(str(repo / "cnn"), version="2")
    (repo / "cnn.post" / "junk.txt").write_text("x")
    with pytest.raises(UsageError, match="holds 'junk.txt', which optkit did not create"):
        package(str(split), to="triton", output=str(repo), name="cnn")


# ------------------------------------------------------------------ bad input: exit 2, one line, nothing written

def _edit(doc: dict, path: str, value) -> dict:
    *keys, last = path.split(".")
    at = doc
    for k in keys:
        at = at[int(k)] if isinstance(at, list) else at[k]
    at[int(last) if isinstance(at, list) else last] = value
    return doc


BAD = {
    "corrupt": (lambda d, f: f.write_text('{"schema": 1, "parts": ['), "not JSON"),
    "not-a-split": (lambda d, f: f.write_text(json.dumps(_edit(d, "schema", 4))), "key schema"),
    "schema-3-no-model": (lambda d, f: f.write_text(json.dumps(_edit(d, "schema", 3))), "key model_sha256: missing"),
    "no-hash": (lambda d, f: f.write_text(json.dumps(_edit(d, "schema", 2))), "key parts.0.sha256: missing"),
    "missing-file": (lambda d, f: (f.parent / "core.onnx").unlink(), "key parts.1.file: .*core.onnx is missing"),
    "outside": (lambda d, f: f.write_text(json.dumps(_edit(d, "parts.0.file", "../pre.onnx"))),
                "is not a file of the split folder"),
    "unproduced": (lambda d, f: (f.write_text(json.dumps(_edit(d, "parts.2.inputs.0.name", "nowhere"))),
                                 _rename_input(f.parent / "post.onnx", "view", "nowhere")),
                   "'nowhere' is neither an input of the model nor an output of an earlier part"),
    "hash": (lambda d, f: f.write_text(json.dumps(_edit(d, "parts.1.sha256", "0" * 64))),
             "key parts.1.sha256: core.onnx is not the file the split wrote"),
    "inputs": (lambda d, f: f.write_text(json.dumps(_edit(d, "parts.1.inputs.0.shape", ["batch", 3, 8, 8]))),
               r"key parts.1.inputs.0.shape: .* does not fit 'relu'"),
    "dtype": (lambda d, f: f.write_text(json.dumps(_edit(d, "parts.1.inputs.0.dtype", "uint8"))),
              "key parts.1.inputs.0.dtype"),
    "swapped-file": (lambda d, f: shutil.copyfile(f.parent / "post.onnx", f.parent / "core.onnx"),
                     r"key parts.1.inputs: \['relu'\] are not the inputs of core.onnx"),
    "no-output": (lambda d, f: f.write_text(json.dumps(_edit(d, "outputs.0.name", "probs"))),
                  "'probs' is an output of the model that no part produces"),
}


def _rename_input(path: Path, old: str, new: str) -> None:
    proto = onnx.load(str(path))
    for vi in proto.graph.input:
        if vi.name == old:
            vi.name = new
    for n in proto.graph.node:
        n.input[:] = [new if i == old else i for i in n.input]
    onnx.save(proto, str(path))


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_split_folder_is_refused_before_anything_is_written(tmp_path, case):
    split = make_split(CNN, tmp_path / "split", CNN_CUTS)
    edit, why = BAD[case]
    edit(json.loads((split / "split.json").read_text()), split / "split.json")
    with pytest.raises(UsageError, match=why) as e:
        package(str(split / "split.json"), to="triton", output=str(tmp_path / "repo"))
    assert e.value.exit_code == 2 and "\n" not in e.value.message
    assert not (tmp_path / "repo").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["split"]


def test_the_command_says_one_line_and_writes_nothing(tmp_path):
    split = make_split(CNN, tmp_path / "split", CNN_CUTS)
    (split / "pre.onnx").unlink()
    r = run_cli("package", split, "--to", "triton", "-o", tmp_path / "repo")
    assert r.rc == 2 and "pre.onnx is missing" in one_error_line(r)
    assert not (tmp_path / "repo").exists()
    (split / "pre.onnx").write_bytes(b"")
    make_split(CNN, tmp_path / "ok", CNN_CUTS)
    r = run_cli("package", tmp_path / "ok", "--to", "mlflow", "-o", tmp_path / "ml")
    assert r.rc == 2 and "--to mlflow packages one model" in one_error_line(r)
    r = run_cli("package", tmp_path / "ok", "--to", "mlflow", "-o", tmp_path / "ml", "--gpu")
    assert r.rc == 2 and "--gpu" in one_error_line(r) and not (tmp_path / "ml").exists()


def test_a_part_folder_name_taken_by_another_model_is_refused(tmp_path):
    repo = tmp_path / "repo"
    package(str(CNN), to="triton", output=str(repo), name="cnn.core")
    split = make_split(CNN, tmp_path / "split", CNN_CUTS)
    with pytest.raises(UsageError, match="cnn.core is a model of its own"):
        package(str(split), to="triton", output=str(repo), name="cnn")
    assert sorted(p.name for p in repo.iterdir()) == ["cnn.core"]
