"""Packaging for OpenVINO (issue 42 item 4): the tuned runtime carried into Triton's OpenVINO backend (or --backend
over it, said), KServe manifests for OpenVINO Model Server checked against the kubernetes client's typed models,
and careless input refused with one line, the right exit code and nothing written. The package served by a real
tritonserver: tests/test_served_openvino.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_manifests_capacity import typed
from test_openvino import needs_ov
from test_package import _external_data_model, best_json
from test_package_ensemble import with_uint8_preprocessing

from optkit.core.errors import PassError, UsageError

from conftest import ROOT, SAMPLES, one_error_line, run_cli

CNN = SAMPLES / "torch_cnn.onnx"
OV_TUNE = {"runtime": "openvino", "threads": 2, "batch": 8, "concurrency": 2, "sessions": "per-thread"}


def _tuned(tmp_path: Path, model=CNN, **setting) -> str:
    return best_json(tmp_path / f"best_{setting.get('runtime', 'onnxruntime')}.json", model, **setting)


def _lineage(version: Path) -> dict:
    return json.loads((version / "optkit-package.json").read_text())


@needs_ov
def test_a_tune_that_picked_openvino_is_packaged_for_the_openvino_backend(tmp_path):
    r = run_cli("package", CNN, "--to", "triton", "-o", tmp_path / "repo", "--name", "cnn", "--tuned",
                _tuned(tmp_path, **OV_TUNE))
    assert r.rc == 0, r.err
    v = tmp_path / "repo" / "cnn" / "1"
    assert sorted(p.name for p in v.iterdir() if p.name.startswith("model")) == ["model.bin", "model.xml"]
    text = (v / "config.pbtxt").read_text()
    assert 'backend: "openvino"' in text and 'key: "INFERENCE_NUM_THREADS" value { string_value: "2" }' in text
    assert "max_batch_size: 8" in text and "count: 2 kind: KIND_CPU" in text
    lin = _lineage(v)
    assert {"setting": "runtime", "value": "openvino", "field": "backend", "written": "openvino"} in lin["mapping"]
    assert not any("--backend" in n for n in lin["notes"])


def test_an_ensemble_tuned_on_openvino_is_served_on_onnxruntime_and_says_so(tmp_path):
    model = with_uint8_preprocessing(CNN, tmp_path / "cnn_u8.onnx", "input")
    best = _tuned(tmp_path, model=model, **OV_TUNE)
    r = run_cli("package", model, "--to", "triton", "-o", tmp_path / "repo", "--name", "cnn", "--tuned", best)
    assert r.rc == 0, r.err
    said = " ".join(r.out.split())
    assert f"--tuned {best} picked openvino; the parts of an ensemble are served on onnxruntime" in said
    assert "--backend" not in said
    parts = [p.read_text() for p in (tmp_path / "repo").glob("*/1/config.pbtxt")]
    parts = [t for t in parts if 'platform: "ensemble"' not in t]
    assert len(parts) == 2 and all('backend: "onnxruntime"' in t for t in parts)


@needs_ov
def test_an_openvino_ir_is_packaged_as_it_is(tmp_path):
    """An IR (`optkit convert -o M.xml`, `quantize --runtime openvino -o Q.xml`) is served by the OpenVINO backend
    without --backend: its files copied byte for byte, its ports as the served signature; the MLflow target, which
    runs onnxruntime, says to package the ONNX model instead."""
    ir = _ir_copy(tmp_path)
    r = run_cli("package", ir, "--to", "triton", "-o", tmp_path / "repo", "--name", "cnn")
    assert r.rc == 0, r.err
    v = tmp_path / "repo" / "cnn" / "1"
    assert (v / "model.xml").read_bytes() == ir.read_bytes()
    assert (v / "model.bin").read_bytes() == ir.with_suffix(".bin").read_bytes()
    text = (v / "config.pbtxt").read_text()
    assert 'backend: "openvino"' in text and 'input [ { name: "input" data_type: TYPE_FP32 dims: [ 1, 8, 8 ] } ]' in text
    assert {"setting": "model format", "value": "openvino-ir", "field": "backend",
            "written": "openvino"} in _lineage(v)["mapping"]
    r = run_cli("package", ir, "--to", "mlflow", "-o", tmp_path / "ml")
    assert r.rc == 2 and "package the ONNX model it was converted from" in one_error_line(r)
    assert not (tmp_path / "ml").exists()


@needs_ov
def test_rollback_across_backends(tmp_path):
    """An onnxruntime version and an OpenVINO one side by side: serve-version switches the served config's backend
    with the version, both ways."""
    repo = tmp_path / "repo"
    for flags in ((), ("--backend", "openvino")):
        assert run_cli("package", CNN, "--to", "triton", "-o", repo, "--name", "cnn", *flags).rc == 0
    for version, backend in (("1", "onnxruntime"), ("2", "openvino")):
        r = run_cli("package", "serve-version", repo / "cnn", "--version", version)
        assert r.rc == 0, r.err
        assert f'backend: "{backend}"' in (repo / "cnn" / "config.pbtxt").read_text()


@needs_ov
@pytest.mark.parametrize("tuned, backend, files", [
    ("onnxruntime", "openvino", ["model.bin", "model.xml"]),
    ("openvino", "onnxruntime", ["model.onnx"]),
])
def test_backend_over_another_tuned_runtime_says_which_it_used(tmp_path, tuned, backend, files):
    """--backend wins over the tuned runtime, and the package says so: which runtime the figures are from and which
    settings do not carry over."""
    best = _tuned(tmp_path, **(OV_TUNE if tuned == "openvino" else {}))
    r = run_cli("package", CNN, "--to", "triton", "-o", tmp_path / "repo", "--name", "cnn", "--tuned", best,
                "--backend", backend)
    assert r.rc == 0, r.err
    v = tmp_path / "repo" / "cnn" / "1"
    assert sorted(p.name for p in v.iterdir() if p.name.startswith("model")) == files
    assert f'backend: "{backend}"' in (v / "config.pbtxt").read_text()
    said = f"--backend {backend}, though --tuned {best} picked {tuned}: its figures were measured on {tuned}"
    assert said in " ".join(r.out.split()) and any(n.startswith(said) for n in _lineage(v)["notes"])


@pytest.mark.skipif(__import__("importlib").util.find_spec("mlflow") is None, reason="pip install 'optkit[serve]'")
def test_mlflow_says_it_serves_onnxruntime_where_tune_picked_openvino(tmp_path):
    best = _tuned(tmp_path, **OV_TUNE)
    r = run_cli("package", CNN, "--to", "mlflow", "-o", tmp_path / "repo", "--name", "cnn", "--tuned", best)
    assert r.rc == 0, r.err
    assert f"--tuned {best} picked openvino; MLflow's onnx flavor runs onnxruntime" in " ".join(r.out.split())


@needs_ov
def test_kserve_manifests_for_openvino_model_server(tmp_path):
    """--manifests kserve,seldon on an OpenVINO package: an InferenceService served by OVMS (its ServingRuntime
    beside it) reading the model folder OVMS's way, the tuned settings as its plugin_config; each standard piece
    loads into the kubernetes client's typed models with nothing dropped. An odd, long --name gives valid names."""
    pytest.importorskip("kubernetes", reason="pip install kubernetes (the test extra)")
    name = "Cnn.V2_" + "x" * 90
    best = Path(_tuned(tmp_path, **OV_TUNE))
    doc = json.loads(best.read_text())
    doc["best"]["figures"]["memory_mb"] = 100.0
    best.write_text(json.dumps(doc))
    r = run_cli("package", CNN, "--to", "triton", "-o", tmp_path / "repo", "--name", name, "--tuned", best,
                "--manifests", "kserve,seldon", "--storage-uri", "s3://b/models")
    assert r.rc == 0, r.err
    v = tmp_path / "repo" / name / "1"
    docs = {p.stem: yaml.safe_load(p.read_text()) for p in (v / "manifests").glob("*.yaml")}
    assert sorted(docs) == ["kserve", "kserve-ovms", "seldon"]
    isvc, runtime = docs["kserve"], docs["kserve-ovms"]
    model = isvc["spec"]["predictor"]["model"]
    assert (runtime["apiVersion"], runtime["kind"]) == ("serving.kserve.io/v1alpha1", "ServingRuntime")
    assert model["runtime"] == runtime["metadata"]["name"] and len(model["runtime"]) <= 63
    assert model["modelFormat"] == {"name": "openvino_ir"} and model["protocolVersion"] == "v2"
    assert {"name": "openvino_ir", "autoSelect": False} in runtime["spec"]["supportedModelFormats"]
    assert "v2" in runtime["spec"]["protocolVersions"]
    # OVMS's layout: the storageUri is the model folder, whose numbered folders hold model.xml + model.bin
    assert model["storageUri"] == f"s3://b/models/{name}" and (v / "model.xml").is_file() and (v / "model.bin").is_file()
    container = typed(runtime["spec"]["containers"][0], "V1Container")
    assert container.image.startswith("openvino/model_server:")
    assert {"--model_path=/mnt/models", "--rest_port=8080", "--model_name={{.Name}}"} <= set(container.args)
    typed({"name": "kserve-container", "args": model["args"]}, "V1Container")
    # 2 requests in flight x 2 threads: the cores OVMS's plugin_config gives the model
    assert typed(model["resources"], "V1ResourceRequirements").requests == {"memory": "150Mi", "cpu": "4"}
    args = dict(a.split("=", 1) for a in model["args"])
    assert json.loads(args["--plugin_config"]) == {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "2",
                                                  "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": "4"}
    assert args["--nireq"] == "2" and json.loads(args["--model_version_policy"]) == {"specific": {"versions": [1]}}
    assert docs["seldon"]["spec"]["requirements"] == ["openvino"]
    for doc in docs.values():
        meta = typed(doc["metadata"], "V1ObjectMeta")
        assert len(meta.name) <= 63 and meta.name.replace("-", "").isalnum() and meta.name == meta.name.lower()


def _custom_op_model(folder: Path) -> Path:
    """Valid ONNX with an operator of a domain of its own: no runtime converts it."""
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Frobnicate", ["x"], ["y"], domain="example.custom")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = folder / "custom.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                  helper.make_opsetid("example.custom", 1)]), str(path))
    return path


def _ir_copy(folder: Path) -> Path:
    """The sample CNN as IR, written by `optkit convert` (a command of its own: optkit before openvino)."""
    r = run_cli("convert", CNN, "-o", folder / "cnn.xml")
    assert r.rc == 0, r.err
    return folder / "cnn.xml"


def _case(name: str, tmp_path: Path) -> tuple[list, dict]:
    """(the CLI's MODEL and flags, the same as package()'s keywords) for each careless input."""
    if name == "not-convertible":
        return [_custom_op_model(tmp_path), "--backend", "openvino"], {"backend": "openvino"}
    if name == "gpu":
        best = _tuned(tmp_path, **OV_TUNE)
        return [CNN, "--tuned", best, "--gpu"], {"tuned_path": best, "gpu": True}
    if name == "external-data":
        return [_external_data_model(tmp_path), "--backend", "openvino"], {"backend": "openvino"}
    if name == "ir-on-a-gpu":
        return [_ir_copy(tmp_path), "--gpu"], {"gpu": True}
    if name == "ir-on-onnxruntime":
        return [_ir_copy(tmp_path), "--backend", "onnxruntime"], {"backend": "onnxruntime"}
    if name == "ensemble":
        model = with_uint8_preprocessing(CNN, tmp_path / "cnn_u8.onnx", "input")
        return [model, "--backend", "openvino"], {"backend": "openvino"}
    best = _tuned(tmp_path, model=SAMPLES / "quickstart_cnn.onnx", **OV_TUNE)  # another model's tune
    return [CNN, "--tuned", best, "--backend", "openvino"], {"tuned_path": best, "backend": "openvino"}


HOSTILE = {
    "not-convertible": (3, "OpenVINO cannot convert", "No conversion rule found for operations: "
                        "example.custom.Frobnicate", PassError),
    "gpu": (2, "the tuned runtime openvino (--tuned", "serves on the CPU: drop --gpu", UsageError),
    "external-data": (2, "--backend openvino:", "external data files", UsageError),
    "ensemble": (2, "--backend openvino serves one model", "drop --backend openvino", UsageError),
    "ir-on-a-gpu": (2, "cnn.xml, an OpenVINO IR, serves on the CPU",
                    "drop --gpu, or package the ONNX model it was converted from", UsageError),
    "ir-on-onnxruntime": (2, "is OpenVINO IR, which Triton serves with --backend openvino only",
                          "package the ONNX model it was converted from", UsageError),
    "other-models-tune": (2, "key model_sha256: the file was made for another model", "tune this model", UsageError),
}


@needs_ov
@pytest.mark.usefixtures("fresh_home_and_tmp")
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_careless_input_is_one_line_and_writes_nothing(tmp_path, case):
    """By the command and by the Python API: the exit code, one line naming what to do, no repository, and no
    temporary IR left behind (HOME and TMPDIR are checked empty by the fixture)."""
    code, says, then, error = HOSTILE[case]
    args, keywords = _case(case, tmp_path)
    r = run_cli("package", *args, "--to", "triton", "-o", tmp_path / "repo", "--manifests", "kserve")
    line = one_error_line(r)
    assert r.rc == code and says in line and then in line, r.err
    # the API in a Python of its own that imports optkit first, as a user does: optkit keeps OpenVINO's converter
    # from reporting usage only when it is imported before openvino (core/telemetry.py), and this test process
    # imported openvino first (test_openvino's skip mark)
    api = (f"import optkit, sys\nfrom optkit.package.build import package\ntry:\n    package({str(args[0])!r}, "
           f"target='triton', output={str(tmp_path / 'repo')!r}, manifests='kserve', **{keywords!r})\n"
           f"except optkit.core.errors.{error.__name__} as e:\n    print(e.message)\n    sys.exit(0)\nsys.exit(9)")
    p = subprocess.run([sys.executable, "-c", api], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0 and says in p.stdout and then in p.stdout, p.stdout + p.stderr
    assert not (tmp_path / "repo").exists()


def test_a_recipe_refuses_backend_openvino_on_a_gpu_before_any_stage(tmp_path):
    from test_package_recipe import RECIPE

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "package": [
        {"to": "triton", "output": str(tmp_path / "repo"), "backend": "openvino", "gpu": True}]}))
    r = run_cli("run", recipe, "--workspace", tmp_path / "runs")
    assert r.rc == 2 and "--backend openvino serves on the CPU: drop --gpu" in one_error_line(r), r.err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "repo").exists()


@pytest.mark.usefixtures("fresh_home_and_tmp")
def test_without_openvino_it_is_exit_4_with_the_install_command(tmp_path):
    """OpenVINO hidden from the command (as where it is not installed): --backend openvino, and a tune that picked
    OpenVINO, say the one command that installs it (the latter also what serves without it); nothing written."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['openvino'] = None\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), str(ROOT)]), "COLUMNS": "200"}
    best = _tuned(tmp_path, **OV_TUNE)
    for flags, says in ((["--backend", "openvino"], "error: --backend openvino needs OpenVINO"),
                        (["--tuned", best], f"error: the tuned runtime openvino (--tuned {best}) needs OpenVINO")):
        p = subprocess.run([sys.executable, "-m", "optkit", "package", str(CNN), "--to", "triton", "-o",
                            str(tmp_path / "repo"), *flags], capture_output=True, text=True, env=env, timeout=120)
        line = p.stderr.strip().splitlines()[-1]
        assert p.returncode == 4 and line.startswith(says) and "pip install 'optkit[openvino]'" in line, p.stderr
        assert "Traceback" not in p.stderr
    assert line.endswith("; or give --backend onnxruntime")
    assert not (tmp_path / "repo").exists()
