"""OpenVINO as a runtime (issue 42 item 1): --runtime openvino on bench, eval and profile, recipes' measure.runtime,
the settings each report records, OpenVINO IR written by convert -o NAME.xml and read by every command, paired
timing across runtimes, and exit 4 with the install command where OpenVINO is missing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SAMPLES, one_error_line, run_cli

CNN = SAMPLES / "torch_cnn.onnx"
EVAL = SAMPLES / "digits_eval_nchw.npz"


def _has_openvino() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    import platform
    return platform.machine().lower() in ("x86_64", "amd64")


needs_ov = pytest.mark.skipif(not _has_openvino(), reason="OpenVINO is not installed or this CPU is not x86-64")


@pytest.fixture(scope="module")
def ir(tmp_path_factory) -> Path:
    if not _has_openvino():
        pytest.skip("OpenVINO is not installed")
    out = tmp_path_factory.mktemp("ir") / "cnn.xml"
    r = run_cli("convert", CNN, "-o", out, "--data", EVAL)
    assert r.rc == 0, r.err
    return out


def _stage(r) -> dict:
    assert r.rc == 0, r.err
    return json.loads(r.out)["stages"][-1]


@needs_ov
def test_bench_records_the_runtime_and_its_settings():
    m = _stage(run_cli("bench", CNN, "--runtime", "openvino", "--threads", "1", "--runs", "10", "--json"))["measurements"]
    rt = m["runtime"]
    assert rt["name"] == "openvino" and rt["version"].startswith("20")
    s = rt["settings"]
    assert (s["PERFORMANCE_HINT"], s["NUM_STREAMS"], s["INFERENCE_NUM_THREADS"], s["INFERENCE_PRECISION_HINT"]) == \
        ("LATENCY", "1", "1", "f32")
    assert s["reshaped_to"] == {"input": [1, 1, 8, 8]}       # the dynamic batch, reshaped to what was measured
    assert m["io"]["runtime"] == "openvino" and m["latency"]["p50_ms"] > 0
    ort = _stage(run_cli("bench", CNN, "--runs", "5", "--json"))["measurements"]["runtime"]
    assert ort["name"] == "onnxruntime" and ort["settings"]["provider"] == "cpu"


@needs_ov
def test_ir_written_and_read_back_by_eval_bench_and_profile(ir):
    assert ir.is_file() and ir.with_suffix(".bin").is_file()
    m = _stage(run_cli("eval", ir, "--data", EVAL, "--reference", CNN, "--json"))["measurements"]
    assert m["runtime"]["name"] == "openvino"
    assert m["fidelity"]["cosine"] > 0.9999 and m["fidelity"]["top1_agreement"] == 1.0
    ort = _stage(run_cli("eval", CNN, "--data", EVAL, "--json"))["measurements"]
    assert m["accuracy"]["top1"] == pytest.approx(ort["accuracy"]["top1"], abs=0.002)
    r = run_cli("profile", ir, "--runs", "5", "--json")
    assert r.rc == 0, r.err
    p = json.loads(r.out)
    assert p["runtime"]["name"] == "openvino" and p["ops"] and all(n["kernel"] for n in p["nodes"])
    assert {o["op"] for o in p["ops"]} >= {"Convolution"}


@needs_ov
def test_profile_on_openvino_names_the_kernels_and_refuses_a_trace(tmp_path):
    r = run_cli("profile", CNN, "--runtime", "openvino", "--runs", "5")
    assert r.rc == 0, r.err
    assert "kernel" in r.out and "per-layer counters" in r.out
    r = run_cli("profile", CNN, "--runtime", "openvino", "--trace", tmp_path / "t.json")
    assert r.rc == 2 and "--trace" in one_error_line(r)
    assert not (tmp_path / "t.json").exists()


@needs_ov
def test_paired_timing_across_runtimes():
    """The same loop times two sessions whatever their runtime: the ratio carries its interval and each side
    names its runtime."""
    from optkit.core.artifact import Artifact
    from optkit.measure.model import MeasureSettings
    from optkit.measure.paired import paired_latency

    a = Artifact.load(CNN)
    r = paired_latency(a, a, MeasureSettings(threads=1, runs=30, warmup=3), trials=2,
                       runtimes=("onnxruntime", "openvino"))
    assert (r["before"]["runtime"], r["after"]["runtime"]) == ("onnxruntime", "openvino")
    lo, hi = r["ratio_ci95"]
    assert 0 < lo <= r["ratio"] <= hi


@needs_ov
def test_recipe_measure_runtime_and_run_pass(tmp_path):
    """measure: {runtime: openvino} in a recipe (here through optkit.run_pass): ONNX stages measured on OpenVINO;
    convert.openvino through the Python API writes the IR."""
    import optkit

    rep = optkit.run_pass("convert.openvino", str(CNN), str(tmp_path / "m.xml"), measure={"runtime": "openvino"})
    assert (tmp_path / "m.xml").is_file() and (tmp_path / "m.bin").is_file()
    assert [s.measurements["runtime"]["name"] for s in rep.stages] == ["openvino", "openvino"]
    assert rep.stages[-1].output.format == "openvino-ir"


@pytest.mark.parametrize("args, words", [
    (("bench", CNN, "--runtime", "openvino", "--provider", "cuda"), "--provider cuda is onnxruntime's"),
    (("bench", SAMPLES / "keras_cnn.tflite", "--runtime", "openvino"), "does not run tflite models"),
    (("eval", CNN, "--data", EVAL, "--runtime", "nosuch"), "no such runtime"),
])
def test_bad_runtime_choices_are_exit_2(args, words):
    r = run_cli(*args)
    assert r.rc == 2 and words in one_error_line(r)


def test_convert_to_ir_needs_an_onnx_model(tmp_path):
    r = run_cli("convert", SAMPLES / "keras_cnn.tflite", "-o", tmp_path / "m.xml")
    assert r.rc == 2 and "convert" in one_error_line(r) and ".onnx first" in one_error_line(r)
    assert list(tmp_path.iterdir()) == []


@needs_ov
def test_an_ir_without_its_weights_is_exit_2(ir, tmp_path):
    lone = tmp_path / "lone.xml"
    lone.write_bytes(ir.read_bytes())
    r = run_cli("bench", lone)
    assert r.rc == 2 and "lone.bin is missing" in one_error_line(r)
    bad = tmp_path / "bad.xml"
    bad.write_text("<model/>")
    r = run_cli("eval", bad, "--data", EVAL)
    assert r.rc == 2 and "not an OpenVINO IR" in one_error_line(r)


def run_without_openvino(args, tmp_path: Path) -> subprocess.CompletedProcess:
    """`optkit ARGS` in a subprocess where OpenVINO cannot be imported (as where it is not installed), in
    tmp_path, which holds a stub IR m.xml + m.bin."""
    hide = tmp_path / "hide"
    if not hide.is_dir():
        hide.mkdir()
        (hide / "sitecustomize.py").write_text("import sys\nsys.modules['openvino'] = None\n")
        (tmp_path / "m.xml").write_text('<?xml version="1.0"?>\n<net name="m" version="11"></net>\n')
        (tmp_path / "m.bin").write_bytes(b"")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), str(ROOT)]), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "optkit", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)


def test_without_openvino_the_runtime_is_exit_4(tmp_path):
    """OpenVINO hidden from a subprocess (as where it is not installed): every way in says the one install
    command, and writes nothing."""
    for args in (("bench", CNN, "--runtime", "openvino"), ("eval", CNN, "--data", EVAL, "--runtime", "openvino"),
                 ("profile", CNN, "--runtime", "openvino"), ("convert", CNN, "-o", tmp_path / "out.xml"),
                 ("bench", tmp_path / "m.xml")):
        p = run_without_openvino(args, tmp_path)
        assert p.returncode == 4, (args, p.stderr)
        assert "pip install 'optkit[openvino]'" in p.stderr.strip().splitlines()[-1] and "Traceback" not in p.stderr
    assert not (tmp_path / "out.xml").exists() and not (tmp_path / "out.bin").exists()


@needs_ov
def test_a_real_cnn_on_openvino(realcases):
    """EfficientNet-Lite1 (a real ImageNet CNN, NHWC uint8-range float input) on OpenVINO: its static shape
    compiled once, timed, and the settings recorded."""
    m = _stage(run_cli("bench", realcases / "efficientnet_lite1.onnx", "--runtime", "openvino", "--threads", "1",
                       "--runs", "5", "--warmup", "2", "--json"))["measurements"]
    assert m["runtime"]["name"] == "openvino" and m["runtime"]["settings"]["INFERENCE_NUM_THREADS"] == "1"
    assert m["latency"]["runs"] == 5


@needs_ov
def test_quantize_for_openvino_within_budget_and_as_ir(tmp_path):
    """quantize --runtime openvino: static QDQ candidates scored and timed on OpenVINO, the chosen file checked to
    run int8 kernels there (per-layer counters), the accuracy budget held; -o NAME.xml writes the IR."""
    base = ("quantize", CNN, "--mode", "static", "--runtime", "openvino", "--calibration-data",
            SAMPLES / "digits_calib_nchw.npz", "--eval-data", EVAL, "--metric", "top1", "--max-accuracy-drop", "0.01",
            "--allow-slower", "--activation-type", "uint8", "--per-channel", "--max-samples", "200", "--json")
    r = run_cli(*base, "-o", tmp_path / "q.xml")
    assert r.rc == 0, r.err
    stages = json.loads(r.out)["stages"]
    q = next(s for s in stages if s["pass"] == "quantize.onnx-static")
    assert q["config"]["runtime"] == "openvino" and q["measurements"]["runtime"]["name"] == "openvino"
    ran = next(n for n in q["notes"] if n.startswith("OpenVINO ran"))
    assert int(ran.split()[2]) > 0                                   # layers that ran int8 kernels
    assert q["measurements"]["accuracy"]["top1"] >= stages[0]["measurements"]["accuracy"]["top1"] - 0.01
    assert stages[-1]["output"]["format"] == "openvino-ir"
    assert (tmp_path / "q.xml").is_file() and (tmp_path / "q.bin").is_file()


@pytest.mark.parametrize("extra, words", [
    (("--mode", "dynamic", "--runtime", "openvino", "-o", "q.onnx"), "run in float on OpenVINO"),
    (("--mode", "static", "--synthetic-calibration", "-o", "q.xml"), "add it"),
    (("--mode", "static", "--runtime", "openvino", "--format", "qoperator", "--synthetic-calibration", "-o",
      "q.onnx"), "use format qdq"),
])
def test_quantize_runtime_refusals(tmp_path, extra, words):
    r = run_cli("quantize", CNN, *extra, cwd=tmp_path)
    assert r.rc == 2 and words in one_error_line(r)
    assert list(tmp_path.iterdir()) == []


@needs_ov
def test_tune_searches_the_runtime_and_names_the_faster(tmp_path):
    """The runtime is a dimension of tune's space: the best of each runtime is measured again in interleaved rounds,
    and the result says which is faster here, by how much, with the noise (whichever it is on this CPU)."""
    r = run_cli("tune", CNN, "--objective", "latency", "--trials", "4", "--trial-seconds", "0.2", "--space",
                "threads=1", "--space", "runtime=onnxruntime,openvino", "-o", tmp_path / "best.json", "--json")
    assert r.rc == 0, r.err
    tune = json.loads(r.out)["stages"][-1]["measurements"]["tune"]
    rt = tune["runtimes"]
    assert sorted(rt["compared"]) == ["onnxruntime", "openvino"] and rt["rounds"] >= 2
    lo, hi = rt["ci95"]
    assert lo <= rt["ratio"] <= hi and rt["faster"] in (None, *rt["compared"])
    assert rt["text"].startswith("runtimes: ")
    best = json.loads((tmp_path / "best.json").read_text())["best"]["setting"]
    assert best["runtime"] in ("onnxruntime", "openvino")


@needs_ov
def test_a_file_made_for_onnxruntime_measured_on_openvino_says_when_slower(tmp_path):
    """A recipe measuring on OpenVINO a file quantized for onnxruntime (dynamic int8, which OpenVINO runs in float):
    the stage names both runtimes in a warning exactly when it is slower than its input there, beyond the noise."""
    import optkit

    rep = optkit.run_pass("quantize.onnx-dynamic", str(CNN), str(tmp_path / "q.onnx"), measure={"runtime": "openvino"},
                          allow_slower=True, measure_candidates=False, latency_search=False)
    stage = rep.stages[-1]
    assert stage.measurements["runtime"]["name"] == "openvino"
    change = stage.measurements["latency_change"]
    said = [w for w in stage.warnings if "made for onnxruntime" in w and "on openvino" in w]
    assert bool(said) == (change["significant"] and change["ratio"] > 1)


@needs_ov
def test_package_for_triton_openvino_backend(tmp_path):
    """package --to triton --backend openvino: the version holds the IR (model.xml + model.bin) and a config for
    Triton's OpenVINO backend with optkit's OpenVINO settings, parsed by Triton's own ModelConfig where the Triton
    tool folder is there; the IR runs on OpenVINO as the ONNX file does."""
    r = run_cli("package", CNN, "--to", "triton", "-o", tmp_path / "repo", "--name", "cnn", "--backend", "openvino")
    assert r.rc == 0, r.err
    v = tmp_path / "repo" / "cnn" / "1"
    assert sorted(p.name for p in v.iterdir() if p.name.startswith("model")) == ["model.bin", "model.xml"]
    text = (v / "config.pbtxt").read_text()
    assert 'backend: "openvino"' in text and 'default_model_filename: "model.xml"' in text
    for key, value in (("PERFORMANCE_HINT", "LATENCY"), ("NUM_STREAMS", "1"), ("INFERENCE_PRECISION_HINT", "f32")):
        assert f'key: "{key}" value {{ string_value: "{value}" }}' in text
    tool = ROOT / "tools" / "triton" / ".venv" / "bin" / "python"
    if tool.exists():
        from optkit.package.targets import triton_check

        p = subprocess.run([str(tool), triton_check.__file__, "cnn/1/config.pbtxt"], cwd=tmp_path / "repo",
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
    m = _stage(run_cli("eval", v / "model.xml", "--data", EVAL, "--reference", CNN, "--json"))["measurements"]
    assert m["fidelity"]["top1_agreement"] == 1.0


def test_package_openvino_backend_refuses_gpu(tmp_path):
    r = run_cli("package", CNN, "--to", "triton", "-o", tmp_path / "repo", "--backend", "openvino", "--gpu")
    assert r.rc == 2 and "--backend openvino" in one_error_line(r)
    assert not (tmp_path / "repo" / "torch_cnn" / "1").exists()


@needs_ov
def test_quantize_a_transformer_for_openvino_keeps_its_outputs_finite(tmp_path):
    """A sentence encoder quantized for OpenVINO: only its products with weights are int8 (onnxruntime's default
    QDQ also wrapped the attention mask's Add, whose -3.4e38 values made every candidate's embeddings NaN on
    OpenVINO, and the whole command failed on the first one); the written file's outputs are finite there."""
    import numpy as np
    import onnx
    import openvino as ov
    from _hf_models import build

    folder = build("sentence-embeddings", tmp_path / "encoder")
    model = tmp_path / "enc.onnx"
    assert run_cli("convert", folder, "-o", model, "--runs", "3").rc == 0
    sts = ROOT / "tests" / "data" / "sts-test.csv"
    out = tmp_path / "q.onnx"
    r = run_cli("quantize", model, "-o", out, "--mode", "static", "--runtime", "openvino", "--calibration-data", sts,
                "--calibration-size", "16", "--columns", "text=5,text_pair=6,label=4", "--max-fidelity-loss", "0.5",
                "--allow-slower", "--activation-type", "uint8", "--per-channel")
    assert r.rc == 0, r.err
    q = onnx.load(out, load_external_data=False)
    inits = {i.name for i in q.graph.initializer}
    dq = {n.output[0]: n for n in q.graph.node if n.op_type == "DequantizeLinear"}
    weights = {o for o, n in dq.items() if n.input[0] in inits}
    assert weights and {n.op_type for n in q.graph.node if set(n.input) & weights} == {"MatMul"}
    assert not any(set(n.input) & set(dq) for n in q.graph.node if n.op_type == "Attention")
    compiled = ov.Core().compile_model(ov.Core().read_model(str(out)), "CPU")
    feeds = {p.get_any_name(): np.ones([1, 8], np.int64) for p in compiled.inputs}
    for value in compiled(feeds).values():
        assert np.isfinite(value).all()
