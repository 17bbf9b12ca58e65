"""Hostile and careless data (#11): optkit refuses what it cannot measure instead of reporting a figure.

Bad input data and bad options are exit 2 with one line, model outputs with NaN / Inf fail (exit 3, or a
fidelity cosine of -1), and a failed command writes no report or model.
"""
from __future__ import annotations

import json
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optkit.core.errors import PassError, UsageError

from conftest import one_error_line

EVAL = "digits_eval_nchw.npz"
MODEL = "torch_cnn.onnx"


@pytest.fixture(scope="module")
def digits(samples):
    with np.load(samples / EVAL) as z:
        return z["input"], z["labels"]


def _npz(path, **arrays):
    np.savez(path, **arrays)
    return path


@pytest.fixture(scope="module")
def nan_model(samples, tmp_path_factory):
    """torch_cnn.onnx with its logits multiplied by a constant holding one NaN (class 3): every row has a NaN."""
    m = onnx.load(samples / MODEL)
    out = m.graph.output[0].name
    for node in m.graph.node:
        node.output[:] = ["pre_logits" if o == out else o for o in node.output]
    mask = np.ones((1, 10), np.float32)
    mask[0, 3] = np.nan
    m.graph.initializer.append(numpy_helper.from_array(mask, "nan_mask"))
    m.graph.node.append(helper.make_node("Mul", ["pre_logits", "nan_mask"], [out]))
    path = tmp_path_factory.mktemp("nanmodel") / "nan_logits.onnx"
    onnx.save(m, path)
    return path


@pytest.fixture(scope="module")
def three_classes(tmp_path_factory):
    """A tiny ONNX model [N, 4] -> [N, 3] and labelled data for it."""
    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["input", "w"], ["logits"])], "three",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    folder = tmp_path_factory.mktemp("three")
    onnx.save(model, folder / "three.onnx")
    x = np.random.default_rng(1).standard_normal((20, 4)).astype(np.float32)
    _npz(folder / "three.npz", input=x, labels=np.arange(20) % 3)
    return folder / "three.onnx", folder / "three.npz"


def _eval(cli, samples, data, *extra, model=None):
    return cli("eval", model or samples / MODEL, "--data", data, *extra)


def _refused(result, code, *parts, report=None):
    assert result.rc == code, (result.rc, result.err)
    line = one_error_line(result)
    for part in parts:
        assert part in line, line
    if report is not None:
        assert not report.exists()
    return line


# ---- non-finite input data: exit 2 at load time, naming the file, the array and the count

def test_all_nan_inputs_are_refused(cli, samples, tmp_path, digits):
    x, y = digits
    data = _npz(tmp_path / "nan.npz", input=np.full_like(x, np.nan), labels=y)
    report = tmp_path / "r.json"
    _refused(_eval(cli, samples, data, "--report", report), 2, str(data), "'input'",
             f"{x.size} non-finite values", report=report)


def test_one_inf_input_is_refused(cli, samples, tmp_path, digits):
    x, y = digits
    x = x.copy()
    x[5, 0, 3, 3] = np.inf
    data = _npz(tmp_path / "inf.npz", input=x, labels=y)
    _refused(_eval(cli, samples, data), 2, "'input' has 1 non-finite values")


def test_nan_labels_are_refused(cli, samples, tmp_path, digits):
    x, y = digits
    labels = y.astype(np.float64)
    labels[:7] = np.nan
    data = _npz(tmp_path / "nanlab.npz", input=x, labels=labels)
    _refused(_eval(cli, samples, data), 2, "'labels' has 7 non-finite values")


def test_bench_refuses_nan_data(cli, samples, tmp_path, digits):
    x, _ = digits
    data = _npz(tmp_path / "nan.npz", input=np.full_like(x, np.nan))
    report = tmp_path / "r.json"
    _refused(cli("bench", samples / MODEL, "--data", data, "--runs", "5", "--report", report), 2,
             "non-finite", report=report)


def test_quantize_refuses_nan_eval_data(cli, samples, tmp_path, digits):
    x, y = digits
    data = _npz(tmp_path / "nan.npz", input=np.full_like(x, np.nan), labels=y)
    out = tmp_path / "q.onnx"
    _refused(cli("quantize", samples / MODEL, "-o", out, "--mode", "dynamic", "--eval-data", data,
                 "--metric", "top1", "--max-accuracy-drop", "0.01"), 2, "non-finite")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nan.npz"]


# ---- labels that do not fit the output or the metric: exit 2

def test_labels_outside_the_classes(cli, samples, tmp_path, digits):
    x, y = digits
    labels = y.copy()
    labels[labels == 9] = 12
    data = _npz(tmp_path / "lab12.npz", input=x, labels=labels)
    report = tmp_path / "r.json"
    line = _refused(_eval(cli, samples, data, "--report", report), 2, report=report)
    assert line == "error: labels range 0..12 but the model's output has 10 classes"


def test_negative_labels(cli, samples, tmp_path, digits):
    x, y = digits
    data = _npz(tmp_path / "neg.npz", input=x, labels=y - 1)
    _refused(_eval(cli, samples, data), 2, "labels range -1..8", "10 classes")


def test_fractional_labels(cli, samples, tmp_path, digits):
    x, y = digits
    data = _npz(tmp_path / "half.npz", input=x, labels=y + 0.5)
    _refused(_eval(cli, samples, data), 2, "not whole class indices")


def test_quantize_refuses_labels_outside_the_classes(cli, samples, tmp_path, digits):
    x, y = digits
    data = _npz(tmp_path / "lab12.npz", input=x, labels=np.where(y == 9, 12, y))
    out = tmp_path / "q.onnx"
    _refused(cli("quantize", samples / MODEL, "-o", out, "--mode", "dynamic", "--eval-data", data,
                 "--metric", "top1", "--max-accuracy-drop", "0.01"), 2, "labels range 0..12", "10 classes")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lab12.npz"]


def test_one_hot_labels_score_like_class_indices(cli, samples, tmp_path, digits):
    x, y = digits
    data = _npz(tmp_path / "onehot.npz", input=x, labels=np.eye(10, dtype=np.float32)[y])
    one_hot = _eval(cli, samples, data, "--json")
    plain = _eval(cli, samples, samples / EVAL, "--json")
    assert one_hot.rc == 0 and plain.rc == 0, one_hot.err + plain.err
    acc = [json.loads(r.out)["stages"][0]["measurements"]["accuracy"]["top1"] for r in (one_hot, plain)]
    assert acc[0] == acc[1] > 0.9


def test_soft_labels_are_refused(cli, samples, tmp_path, digits):
    x, y = digits
    soft = np.full((len(y), 10), 0.05, np.float32)
    soft[np.arange(len(y)), y] = 0.55
    data = _npz(tmp_path / "soft.npz", input=x, labels=soft)
    _refused(_eval(cli, samples, data), 2, "not one-hot")


def test_mse_on_class_labels_suggests_top1(cli, samples):
    _refused(_eval(cli, samples, samples / EVAL, "--metric", "mse"), 2, "class indices", "use --metric top1")


def test_top5_needs_five_classes(cli, three_classes, tmp_path):
    model, data = three_classes
    report = tmp_path / "r.json"
    _refused(cli("eval", model, "--data", data, "--metric", "top5", "--report", report), 2,
             "at least 5 classes", "has 3", report=report)


def test_top1_on_three_classes_works(cli, three_classes):
    model, data = three_classes
    r = cli("eval", model, "--data", data, "--json")
    assert r.rc == 0, r.err
    assert 0 <= json.loads(r.out)["stages"][0]["measurements"]["accuracy"]["top1"] <= 1


# ---- empty and malformed files: exit 2

def test_zero_samples_eval(cli, samples, tmp_path, digits):
    x, y = digits
    data = _npz(tmp_path / "zero.npz", input=x[:0], labels=y[:0])
    report = tmp_path / "r.json"
    _refused(_eval(cli, samples, data, "--report", report), 2, "holds 0 samples", report=report)


def test_zero_samples_bench(cli, samples, tmp_path, digits):
    x, _ = digits
    data = _npz(tmp_path / "zero.npz", input=x[:0])
    report = tmp_path / "r.json"
    _refused(cli("bench", samples / MODEL, "--data", data, "--report", report), 2, "holds 0 samples",
             report=report)


def test_empty_image_folder(cli, samples, tmp_path):
    (tmp_path / "images" / "cat").mkdir(parents=True)
    (tmp_path / "images" / "cat" / "notes.txt").write_text("not an image")
    _refused(_eval(cli, samples, tmp_path / "images"), 2, "no images found")


def test_scalar_input_array(cli, samples, tmp_path):
    data = _npz(tmp_path / "scalar.npz", input=np.float32(1.0))
    _refused(_eval(cli, samples, data), 2, "'input' is a scalar (0-d)")


def test_scalar_labels(cli, samples, tmp_path, digits):
    x, _ = digits
    data = _npz(tmp_path / "scalar.npz", input=x, labels=np.int64(3))
    _refused(_eval(cli, samples, data), 2, "'labels' is a scalar (0-d)")


def test_mismatched_sample_counts(cli, samples, tmp_path, digits):
    x, y = digits
    data = _npz(tmp_path / "short.npz", input=x, labels=y[:10])
    _refused(_eval(cli, samples, data), 2, "different sample counts", "497", "10")


def test_max_samples_zero_is_refused(samples):
    from optkit.measure.datasets import load_dataset

    with pytest.raises(UsageError, match="max_samples 0"):
        load_dataset(samples / EVAL).subset(0)


def test_idx_float_labels_with_nan(tmp_path):
    import struct

    from optkit.measure.datasets import load_dataset

    def write(path, arr, code):
        path.write_bytes(struct.pack(">HBB", 0, code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
                         + arr.tobytes())

    write(tmp_path / "t-images-idx3-ubyte", np.zeros((3, 4, 4), np.uint8), 0x08)
    write(tmp_path / "t-labels-idx1-ubyte", np.array([1, np.nan, 2], ">f4"), 0x0D)
    with pytest.raises(UsageError, match="'labels' has 1 non-finite"):
        load_dataset(tmp_path / "t-images-idx3-ubyte")


def test_images_with_zero_std_are_refused(tmp_path):
    from PIL import Image

    from optkit.measure.datasets import load_dataset

    (tmp_path / "a").mkdir()
    Image.new("L", (4, 4), 7).save(tmp_path / "a" / "x.png")
    with pytest.raises(UsageError, match=r"preprocess std: \[0.0\] would divide pixels by 0"):
        load_dataset(tmp_path, {"color": "gray", "std": [0.0]})


# ---- non-finite model outputs

def test_nan_logits_fail_accuracy(cli, samples, tmp_path, nan_model):
    report = tmp_path / "r.json"
    line = _refused(_eval(cli, samples, samples / EVAL, "--report", report, model=nan_model), 3, report=report)
    assert "model output 'logits' has 497 non-finite values" in line


def test_nan_logits_fidelity_never_passes(cli, samples, nan_model):
    r = _eval(cli, samples, samples / EVAL, "--no-metric", "--reference", samples / MODEL, "--json",
              model=nan_model)
    assert r.rc == 0, r.err
    fid = json.loads(r.out)["stages"][0]["measurements"]["fidelity"]
    assert fid["cosine"] == -1.0 and fid["nonfinite"] == 497 and fid["reference_nonfinite"] == 0
    assert fid["top1_agreement"] == 0.0
    assert fid["outputs"]["logits"]["worst_index"] == [0, 3]


def test_compare_outputs_with_nan_on_both_sides():
    from optkit.measure.fidelity import compare_outputs

    a = np.ones((4, 10))
    a[:, 2] = np.nan
    fid = compare_outputs([a], [a.copy()], ["y"])
    assert fid["cosine"] == -1.0 and fid["nonfinite"] == 4 and fid["reference_nonfinite"] == 4
    assert fid["max_abs_error"] == float("inf") and fid["top1_agreement"] == 0.0
    clean = compare_outputs([np.ones((4, 10))], [np.ones((4, 10))], ["y"])
    assert clean["cosine"] == pytest.approx(1.0) and clean["nonfinite"] == 0 and clean["top1_agreement"] == 1.0


def test_custom_metric_returning_nan_fails(tmp_path):
    from optkit.measure.accuracy import compute

    (tmp_path / "nanmetric.py").write_text("def score(pred, labels):\n    return float('nan')\n")
    with pytest.raises(PassError, match="non-finite figure"):
        compute(f"{tmp_path / 'nanmetric.py'}:score", [np.zeros((3, 2), np.float32)], np.zeros(3))


def test_topk_ties_go_to_the_lowest_index_like_argmax():
    from optkit.measure.accuracy import compute

    logits = [np.zeros((6, 10), np.float32)]  # all tied: argmax says class 0, top-5 is classes 0..4
    assert compute("top1", logits, np.zeros(6, np.int64))["top1"] == 1.0
    assert compute("top1", logits, np.ones(6, np.int64))["top1"] == 0.0
    assert compute("top5", logits, np.full(6, 4))["top5"] == 1.0
    assert compute("top5", logits, np.full(6, 5))["top5"] == 0.0


# ---- option bounds: exit 2 naming the option, and latency loops that stop on time

@pytest.mark.parametrize("args, words", [
    (["--threads", "100000"], "--threads 100000 is out of range"),
    (["--duration", "inf"], "--duration inf is out of range"),
    (["--duration", "7200"], "--duration 7200 is out of range"),
    (["--runs", "100000000000000000000"], "--runs 100000000000000000000 is out of range"),
    (["--warmup", "200000"], "--warmup 200000 is out of range"),
    (["--batch", "100000"], "--batch 100000 is out of range"),
])
def test_bench_option_bounds(cli, samples, tmp_path, args, words):
    report = tmp_path / "r.json"
    start = time.monotonic()
    _refused(cli("bench", samples / MODEL, *args, "--report", report), 2, words, report=report)
    assert time.monotonic() - start < 60


def test_batch_larger_than_the_data(cli, samples, tmp_path, digits):
    x, _ = digits
    data = _npz(tmp_path / "five.npz", input=x[:5])
    _refused(cli("bench", samples / MODEL, "--data", data, "--batch", "8"), 2,
             "--batch 8 is more than the 5 samples")


def test_measure_settings_raise_usage_errors():
    from optkit.measure.model import MeasureSettings

    for bad in ({"threads": 10 ** 5}, {"threads": 0}, {"duration": float("nan")}, {"duration": -1.0},
                {"runs": 0}, {"runs": 10 ** 20}, {"warmup": -1}, {"batch": 0}):
        with pytest.raises(UsageError, match=f"--{next(iter(bad))} "):
            MeasureSettings(**bad)
    assert MeasureSettings(threads=64, runs=10 ** 6, duration=3600, batch=65536).threads == 64


def test_latency_loop_stops_on_time(samples):
    from optkit.core.artifact import Artifact
    from optkit.measure.inputs import synthesize
    from optkit.measure.latency import measure_latency
    from optkit.runtimes.base import open_session

    session = open_session(Artifact.load(str(samples / MODEL)), provider="cpu", threads=1)
    feeds = synthesize(session.inputs, batch=1)
    start = time.monotonic()
    lat = measure_latency(session, feeds, warmup=10 ** 5, runs=10 ** 6, limit_s=0.3)
    assert time.monotonic() - start < 10
    assert lat["time_limited"] is True and 1 <= lat["runs"] < 10 ** 6
    session.close()


def test_values_overflowing_a_float16_input(tmp_path):
    from optkit.core.shapes import TensorSpec
    from optkit.measure.datasets import load_dataset

    ds = load_dataset(_npz(tmp_path / "big.npz", input=np.full((2, 3), 1e6, np.float32)))
    with pytest.raises(UsageError, match="does not fit float16: 6 values overflow"):
        ds.bind([TensorSpec("input", [None, 3], "float16")])
    assert ds.bind([TensorSpec("input", [None, 3], "float32")])["input"].shape == (2, 3)
