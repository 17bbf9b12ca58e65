"""optkit profile (onnxruntime's profiler: per op type and node, --compare, --trace, --logdir), the profile.onnx
pass in a recipe, and prune / qat --tensorboard."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from _digits import digits_train

from conftest import ROOT, no_result_files, one_error_line

HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


def _matmul_chain(path, n=4, width=384, rows=64):
    """A model whose time is all in its kernels: n MatMuls of [rows, width] x [width, width]."""
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32) / width ** 0.5,
                                       f"w{i}") for i in range(n)]
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", f"w{i}"], [f"h{i + 1}"], name=f"mm{i}")
             for i in range(n)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", 1, [rows, width])],
                              [helper.make_tensor_value_info(f"h{n}", 1, [rows, width])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def int8_copy(samples, tmp_path_factory):
    """The sample CNN with its Gemms quantized (dynamic INT8) and its Convs left in float."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = tmp_path_factory.mktemp("int8") / "cnn_int8.onnx"
    quantize_dynamic(str(samples / "torch_cnn.onnx"), str(out), weight_type=QuantType.QInt8,
                     op_types_to_quantize=["MatMul", "Gemm"])
    return out


def test_per_op_totals_add_up_to_p50(tmp_path):
    from optkit.core.artifact import Artifact
    from optkit.measure.profile import profile_onnx

    p = profile_onnx(Artifact.load(_matmul_chain(tmp_path / "chain.onnx")), runs=20, threads=1)
    assert [n["node"] for n in p["nodes"]] and {n["op"] for n in p["nodes"]} == {"MatMul"}
    assert p["ops"][0]["nodes"] == 4
    assert sum(o["ms"] for o in p["ops"]) == pytest.approx(p["total_ms"])
    assert sum(n["share"] for n in p["nodes"]) == pytest.approx(1.0)
    # how close the kernels' total comes to a plain call's p50 is a timing claim (10%: benchmarks/profile_totals.py);
    # here only that the figure is there and is the ratio it names, on any CPU and load
    assert p["total_vs_p50"] == pytest.approx(p["total_ms"] / p["p50_ms"]) and p["total_vs_p50"] > 0, p


def test_profiler_overhead_is_measured_and_taken_off(samples):
    """onnxruntime's profiler adds its own cost to each kernel: measured here (a Relu chain, plain and profiled)
    and taken off every kernel event, the raw figures kept beside the corrected ones."""
    from optkit.core.artifact import Artifact
    from optkit.measure.profile import calibrate_overhead, profile_onnx

    p = profile_onnx(Artifact.load(samples / "torch_cnn.onnx"), runs=20, threads=1)
    overhead = p["profiler_overhead_us_per_kernel"]
    assert 0 <= overhead < 50, p
    assert overhead == calibrate_overhead(1)["overhead_us"]  # cached per process: the same figure again
    assert 0 < p["total_ms"] <= p["total_raw_ms"]
    assert p["total_raw_ms"] - p["total_ms"] <= p["node_count"] * overhead / 1e3 + 1e-9
    assert all(0 <= n["ms"] <= n["raw_ms"] for n in p["nodes"]) and all(o["ms"] <= o["raw_ms"] for o in p["ops"])
    assert sum(o["raw_ms"] for o in p["ops"]) == pytest.approx(p["total_raw_ms"])
    assert sum(n["share"] for n in p["nodes"]) == pytest.approx(1.0)  # shares of the corrected times
    assert p["raw_vs_p50"] == pytest.approx(p["total_raw_ms"] / p["p50_ms"]) and p["call_overhead_us"] >= 0


def test_control_flow_is_not_counted_twice(realcases):
    """silero VAD runs most of its nodes inside If branches: an If's time is its own, not its subgraph's."""
    from optkit.core.artifact import Artifact
    from optkit.measure.profile import profile_onnx

    p = profile_onnx(Artifact.load(realcases / "silero_vad.onnx"), runs=10, threads=1, values={"sr": 16000})
    assert any(n["node"].startswith("If_0_then_branch") for n in p["nodes"])
    assert p["total_ms"] <= p["run_ms"] * 1.05, p  # kernels of one call fit inside the call


def test_cli_table_trace_and_json(cli, samples, tmp_path):
    trace = tmp_path / "cnn.trace.json"
    r = cli("profile", samples / "torch_cnn.onnx", "--threads", "1", "--runs", "10", "--trace", trace)
    assert r.rc == 0, r.err
    assert "time per op type" in r.out and "slowest nodes" in r.out and "Conv" in r.out
    assert "p50 latency" in r.out and "10%" in r.out and str(trace) in r.out
    events = json.loads(trace.read_text())["traceEvents"]  # the Chrome trace format Perfetto opens
    kernels = [e for e in events if e.get("cat") == "Node"]
    assert kernels and all(e["ph"] == "X" and "dur" in e and "ts" in e for e in kernels)
    assert [p.name for p in tmp_path.iterdir()] == [trace.name]  # no temporary left beside it

    r = cli("profile", ROOT.parent / "shared" / "realcases" / "mnist.onnx", "--threads", "1", "--runs", "5",
            "--top", "2", "--json") if (ROOT.parent / "shared" / "realcases" / "mnist.onnx").exists() else \
        cli("profile", samples / "torch_cnn.onnx", "--threads", "1", "--runs", "5", "--top", "2", "--json")
    assert r.rc == 0, r.err
    d = json.loads(r.out)
    assert len(d["ops"]) == 2 and len(d["nodes"]) == 2 and d["trace"] is None
    assert d["p50_ms"] > 0 and d["total_ms"] > 0 and isinstance(d["within_10pct"], bool)
    assert 0 < d["total_ms"] <= d["total_raw_ms"] and 0 <= d["profiler_overhead_us_per_kernel"] < 50


def test_cli_data_feeds_real_samples(cli, samples):
    r = cli("profile", samples / "torch_cnn.onnx", "--data", samples / "digits_eval_nchw.npz", "--runs", "5",
            "--threads", "1", "--json")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["ops"][0]["op"] == "Conv"


def test_compare_names_float_ops_left_in_int8(cli, samples, int8_copy):
    r = cli("profile", samples / "torch_cnn.onnx", "--compare", int8_copy, "--threads", "1", "--runs", "10",
            "--json")
    assert r.rc == 0, r.err
    c = json.loads(r.out)["compare"]
    ops = {o["op"]: o for o in c["ops"]}
    assert ops["DynamicQuantizeMatMul"]["a_ms"] == 0 and ops["DynamicQuantizeMatMul"]["b_ms"] > 0
    assert {n["op"] for n in c["float_in_b"]} == {"Conv"} and len(c["float_in_b"]) == 3
    assert c["float_in_a"] == []  # the FP32 model runs no quantized kernel
    gemm = [n for n in c["nodes"] if n["b_op"] == "DynamicQuantizeMatMul"]
    assert len(gemm) == 2  # both Gemms matched to their quantized nodes by name
    assert c["profile"]["total_ms"] == pytest.approx(c["b_total_ms"])

    env = {**os.environ, "COLUMNS": "80"}  # the human tables fit 80 columns without cutting figures
    proc = subprocess.run([sys.executable, "-m", "optkit", "profile", str(samples / "torch_cnn.onnx"), "--compare",
                           str(int8_copy), "--threads", "1", "--runs", "5"], capture_output=True, text=True, env=env,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "float compute still running in the quantized model b" in proc.stdout and "Conv x3" in proc.stdout
    assert "…" not in proc.stdout and max(len(line) for line in proc.stdout.splitlines()) <= 80


def test_recipe_profile_stage(cli, samples, tmp_path):
    recipe = tmp_path / "profile.yaml"
    recipe.write_text(f"""version: 1
name: prof
model:
  path: {samples / "torch_cnn.onnx"}
data:
  eval:
    path: {samples / "digits_eval_nchw.npz"}
    metric: top1
stages:
  - pass: profile.onnx
    name: profile
    config: {{runs: 10, threads: 1, top: 3}}
measure:
  threads: 1
  runs: 10
  trials: 1
""")
    r = cli("run", recipe, "--workspace", tmp_path / "runs")
    assert r.rc == 0, r.err
    report = json.loads((tmp_path / "runs" / "prof" / "latest" / "report.json").read_text())
    stage = report["stages"][1]
    p = stage["measurements"]["profile"]
    assert len(p["ops"]) <= 3 and p["ops"][0]["op"] == "Conv" and 0 < len(p["nodes"]) <= 20
    assert p["runs"] == 10 and p["total_ms"] > 0 and p["p50_ms"] > 0 and p["trace"] == "model.trace.json"
    folder = tmp_path / "runs" / "prof" / "latest" / "01-profile"
    assert json.loads((folder / p["trace"]).read_text())["traceEvents"]
    assert (folder / "model.onnx").read_bytes() == (samples / "torch_cnn.onnx").read_bytes()
    assert stage["measurements"]["accuracy"]["top1"] > 0.9  # the stage is measured like any other


@pytest.mark.parametrize("case", ["missing", "corrupt", "compare-missing", "compare-corrupt", "trace-over-input",
                                  "keras-without-logdir", "tflite", "logdir-for-onnx"])
def test_bad_input_is_one_line_and_writes_nothing(cli, samples, tmp_path, case):
    out = tmp_path / "out"
    out.mkdir()
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07garbage" * 50)
    cnn = samples / "torch_cnn.onnx"
    before = cnn.read_bytes()
    args, expect = {
        "missing": ([tmp_path / "nope.onnx"], "not found"),
        "corrupt": ([corrupt], "is corrupt or truncated"),
        "compare-missing": ([cnn, "--compare", tmp_path / "nope.onnx"], "not found"),
        "compare-corrupt": ([cnn, "--compare", corrupt], "cannot load"),
        "trace-over-input": ([cnn, "--compare", cnn, "--trace", cnn], "input"),
        "keras-without-logdir": ([samples / "keras_cnn.keras"], "--logdir"),
        "tflite": ([samples / "keras_cnn.tflite"], "convert it to ONNX"),
        "logdir-for-onnx": ([cnn, "--logdir", out / "tb"], "--trace"),
    }[case]
    r = cli("profile", *args, "--runs", "2", *([] if "--trace" in args else ["--trace", out / "t.json"]))
    assert r.rc == 2, (r.rc, r.err)
    assert expect in one_error_line(r)
    assert no_result_files(out) == [] and not (out / "tb").exists()
    assert cnn.read_bytes() == before


def test_keras_logdir_writes_a_tensorboard_profile(cli, samples, tmp_path):
    logdir = tmp_path / "tb"
    r = cli("profile", samples / "keras_cnn.keras", "--logdir", logdir, "--runs", "3", "--json")
    assert r.rc == 0, r.err
    d = json.loads(r.out)
    assert d["files"] and all(f.endswith(".xplane.pb") for f in d["files"]) and d["p50_ms"] > 0
    assert list(logdir.glob("plugins/profile/*/*.xplane.pb"))  # where TensorBoard's profile plugin looks


# ----------------------------------------------------------------------------------- prune / qat --tensorboard
@pytest.mark.skipif(HAS_TENSORBOARD, reason="tensorboard is installed")
def test_tensorboard_missing_is_exit_4(cli, samples, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    train = digits_train(tmp_path, "nchw", 64)
    r = cli("prune", f"{samples}/torch_cnn.py:make_model", "--weights", samples / "torch_cnn_state.pt", "-o",
            out / "p.pt2", "--train", train, "--epochs", "1", "--tensorboard", out / "tb")
    assert r.rc == 4 and "pip install tensorboard" in one_error_line(r)
    assert no_result_files(out) == [] and not (out / "tb").exists()


def test_tensorboard_on_a_file_is_a_usage_error(cli, samples, tmp_path):
    if not HAS_TENSORBOARD:
        pytest.skip("tensorboard is not installed (the exit-4 test covers this case)")
    taken = tmp_path / "taken"
    taken.write_text("x")
    r = cli("qat", samples / "keras_cnn.keras", "-o", tmp_path / "q.h5", "--train", samples / "digits_eval_nhwc.npz",
            "--tensorboard", taken)
    assert r.rc == 2 and "exists and is not a folder" in one_error_line(r)
    assert not (tmp_path / "q.h5").exists()


def _scalar_tags(folder) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return set(acc.Tags()["scalars"]) | set(acc.Tags().get("tensors", []))


@pytest.mark.skipif(not HAS_TENSORBOARD, reason="tensorboard is not installed")
def test_prune_torch_writes_tensorboard_curves(samples, tmp_path):
    pytest.importorskip("torch")
    from optkit.core.artifact import Artifact
    from optkit.measure.datasets import load_dataset
    from optkit.pipeline.stage import run_pass

    tb = tmp_path / "tb"
    data = {"train": load_dataset(digits_train(tmp_path, "nchw", 128))}
    src = Artifact.load(f"{samples}/torch_cnn.py:make_model", weights=str(samples / "torch_cnn_state.pt"))
    result = run_pass(src, "prune.torch", {"method": "unstructured", "epochs": 2, "tensorboard": str(tb),
                                           "max_accuracy_drop": None}, tmp_path / "p.pt2", data=data)
    assert result.ctx.measurements["finetune"]["epochs"] == 2
    assert list((tb / "train").glob("events.out.tfevents.*"))
    assert {"epoch_loss", "epoch_accuracy"} <= _scalar_tags(tb / "train")


@pytest.mark.skipif(not HAS_TENSORBOARD, reason="tensorboard is not installed")
def test_qat_keras_writes_tensorboard_curves(samples, tmp_path):
    pytest.importorskip("tensorflow_model_optimization")
    from optkit.core.artifact import Artifact
    from optkit.measure.datasets import load_dataset
    from optkit.pipeline.stage import run_pass

    tb = tmp_path / "tb"
    data = {"train": load_dataset(digits_train(tmp_path, "nhwc", 128))}
    run_pass(Artifact.load(samples / "keras_cnn.keras"), "qat.keras",
             {"epochs": 1, "tensorboard": str(tb), "max_accuracy_drop": None}, tmp_path / "q.h5", data=data)
    assert list((tb / "train").glob("events.out.tfevents.*"))
    assert {"epoch_loss", "epoch_accuracy"} <= _scalar_tags(tb / "train")
