"""Real third-party models through optkit as a new user runs them: no flag beyond the data, and every figure
reproducible with plain onnxruntime (+ numpy) on the written file.

Models: ../shared/realcases (silero VAD: a scalar `sr` and a [2,batch,128] state; PicoDet layout detector:
8 outputs; the MNIST CNN with its 10k test set; int8 TFLite files), plus models these tests build: an int8
TFLite whose tensor names collide with its signature names (as PyTorch-exported files do).
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.conftest import no_result_files, one_error_line

SILERO = "silero_vad.onnx"
LAYOUT = "layout_cdla.onnx"


def _speechlike(n: int, seed: int = 0) -> np.ndarray:
    """576-sample chunks (512 new + 64 context at 16 kHz): tones with harmonics, half of them silent."""
    rng = np.random.default_rng(seed)
    t = np.arange(576) / 16000
    rows = []
    for i in range(n):
        f0 = rng.uniform(100, 300)
        voiced = sum(np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 6)) / k for k in range(1, 6))
        rows.append((0.3 * voiced if i % 2 else 0) + 0.003 * rng.standard_normal(576))
    return np.asarray(rows, np.float32)


@pytest.fixture(scope="module")
def silero_data(tmp_path_factory, realcases):
    """Chunks as samples: `input` [N,576] (batched), `state` [N,2,1,128] (a whole input per sample: the
    model's batch axis is its second), `sr` [N] (a scalar per sample)."""
    n = 24
    path = tmp_path_factory.mktemp("silero") / "chunks.npz"
    np.savez(path, input=_speechlike(n), state=np.zeros((n, 2, 1, 128), np.float32),
             sr=np.full(n, 16000, np.int64))
    return path


def _ort_outputs(model, feeds_per_call):
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return [sess.run(None, feeds) for feeds in feeds_per_call]


def test_silero_bench_and_simplify_need_no_flag(cli, realcases, tmp_path):
    r = cli("bench", realcases / SILERO, "--runs", "5", "--json")
    assert r.rc == 0, r.err
    inputs = json.loads(r.out)["stages"][0]["measurements"]["inputs"]
    assert inputs["shapes"]["state"] == [2, 1, 128] and inputs["shapes"]["sr"] == []
    out = tmp_path / "s.onnx"
    r = cli("simplify", realcases / SILERO, "-o", out)
    assert r.rc == 0, r.err
    onnx.checker.check_model(str(out))


def test_silero_data_layouts_and_quantize(cli, realcases, silero_data, tmp_path):
    out = tmp_path / "q.onnx"
    r = cli("quantize", realcases / SILERO, "--mode", "dynamic", "--eval-data", silero_data, "-o", out, "--json")
    if r.rc == 3:  # refused: nothing written
        assert no_result_files(tmp_path) == []
        return
    assert r.rc == 0, r.err
    # faithful: speech probability moves by at most 0.05 on every chunk, as plain onnxruntime sees it
    data = np.load(silero_data)
    calls = [{"input": data["input"][i:i + 1], "state": data["state"][i], "sr": np.asarray(data["sr"][i])}
             for i in range(len(data["sr"]))]
    ref = np.array([o[0] for o in _ort_outputs(realcases / SILERO, calls)]).ravel()
    got = np.array([o[0] for o in _ort_outputs(out, calls)]).ravel()
    assert np.abs(ref - got).max() <= 0.05


def test_data_layout_that_fits_no_rule_names_the_shapes(cli, realcases, tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, input=np.zeros((4, 576), np.float32), state=np.zeros((4, 2, 128, 1), np.float32),
             sr=np.full(4, 16000, np.int64))
    r = cli("bench", realcases / SILERO, "--data", bad, "--runs", "2")
    assert r.rc == 2
    line = one_error_line(r)
    assert "'state'" in line and "[2,128,1]" in line and "[2,?,128]" in line


def test_layout_detector_bench_and_simplify(cli, realcases, tmp_path):
    r = cli("bench", realcases / LAYOUT, "--runs", "3")
    assert r.rc == 0, r.err
    out = tmp_path / "s.onnx"
    r = cli("simplify", realcases / LAYOUT, "-o", out)
    assert r.rc == 0, r.err
    assert len(onnx.load(str(out)).graph.output) == 8


# ------------------------------------------------------------------------------ int8 TFLite exported from PyTorch

@pytest.fixture(scope="module")
def colliding_tflite(tmp_path_factory):
    """A full-int8 TFLite classifier (int8 input and output) whose inner tensors are named like its signature's
    `input.5` and `output.3`, as PyTorch-exported files name theirs."""
    tf = pytest.importorskip("tensorflow")
    from tensorflow.lite.tools import flatbuffer_utils as fu

    folder = tmp_path_factory.mktemp("tfl")
    rng = np.random.default_rng(0)
    x = rng.random((64, 8, 8, 1), dtype=np.float32)
    model = tf.keras.Sequential([tf.keras.layers.Input((8, 8, 1)), tf.keras.layers.Conv2D(4, 3, activation="relu"),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(10), tf.keras.layers.Softmax()])

    @tf.function(input_signature=[tf.TensorSpec([1, 8, 8, 1], tf.float32, name="input.5")])
    def fn(inp):
        return {"output.3": model(inp)}

    conv = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()], model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([x[i:i + 1]] for i in range(32))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = conv.inference_output_type = tf.int8
    plain = folder / "plain.tflite"
    plain.write_bytes(conv.convert())
    flat = fu.read_model(str(plain))
    graph = flat.subgraphs[0]
    produced = [o for op in graph.operators for o in op.outputs if o not in set(graph.outputs)]
    graph.tensors[produced[0]].name = b"input.5"
    graph.tensors[produced[-1]].name = b"output.3"
    path = folder / "collide.tflite"
    fu.write_model(flat, str(path))
    np.savez(folder / "data.npz", **{"input.5": x})
    return path, folder / "data.npz"


def test_int8_tflite_with_colliding_names_converts_faithfully(cli, colliding_tflite, tmp_path):
    model, data = colliding_tflite
    out = tmp_path / "m.onnx"
    r = cli("convert", model, "-o", out, "--data", data, "--json")
    assert r.rc == 0, r.err
    onnx.checker.check_model(str(out), full_check=True)
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["input.5"] and [o.name for o in sess.get_outputs()] == ["output.3"]
    validation = json.loads(r.out)["stages"][-1]["measurements"]["validation"]["outputs"]["output.3"]
    assert validation["steps"] > 0 and validation["atol"] == pytest.approx(2.01 * validation["steps"])
    assert validation["top1_agreement"] == 1.0
