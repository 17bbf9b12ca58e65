"""Full-int8 TFLite models convert with no flags: their outputs are judged in quantization steps (int8 kernels of
onnxruntime and TFLite round differently), and a conversion int8 rounding cannot explain is still refused."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REALCASES, ROOT, Result, one_error_line

# Runs `optkit ARGS` with the converter's output scales multiplied by FACTOR and zero points moved by SHIFT after
# the conversion: a conversion that gets an output's scale or zero point wrong, as a converter bug would. LIMITS
# "plain" keeps plain tf2onnx's conversion as the reference for the step limits, "depth" drops it (limits from the
# requantization depth).
BROKEN = """
import runpy, sys
import numpy as np
import onnx
from onnx import numpy_helper
import optkit.passes.convert.fromtflite as tf_convert

factor, shift, limits = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
plain = tf_convert.tflite_io

def edit(init, fn):
    init.CopyFrom(numpy_helper.from_array(fn(numpy_helper.to_array(init)), init.name))

def broken(path, session, source_path):
    steps = plain(path, session, source_path)
    model = onnx.load(str(path))
    outputs = {o.name for o in model.graph.output}
    inits = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.output[0] in outputs:
            edit(inits[node.input[1]], lambda a: a * np.float32(factor))
            edit(inits[node.input[2]], lambda a: (a.astype(np.int64) + shift).astype(a.dtype))
    onnx.save(model, str(path))
    return steps

tf_convert.tflite_io = broken
if limits == "depth":
    tf_convert.plain_tf2onnx = lambda model, session: None
sys.argv = ["optkit", *sys.argv[4:]]
runpy.run_module("optkit", run_name="__main__")
"""


def run_broken(model: Path, out: Path, data: Path, factor: float = 1.0, shift: int = 0,
               limits: str = "plain") -> Result:
    """`optkit convert MODEL -o OUT --data DATA` with the conversion's output scale and zero point broken."""
    proc = subprocess.run([sys.executable, "-c", BROKEN, str(factor), str(shift), limits, "convert", str(model),
                           "-o", str(out), "--data", str(data), "--runs", "3"], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def images(n: int = 100, size: int = 96, keras: bool = False) -> np.ndarray:
    """Real ImageNet images (../shared/realcases/imagenet100), normalized as torchvision does (or as Keras's
    MobileNetV2 does: x / 127.5 - 1); random ones when that folder is absent."""
    files = sorted((REALCASES / "imagenet100").glob("*.JPEG"))[:n]
    if not files:
        return np.random.default_rng(0).standard_normal((n, size, size, 3)).astype(np.float32)
    from PIL import Image

    x = np.stack([np.asarray(Image.open(f).convert("RGB").resize((size, size), Image.BILINEAR), np.float32)
                  for f in files])
    return (x / 127.5 - 1 if keras else (x / 255 - 0.45) / 0.225).astype(np.float32)


def mobilenet_like_int8(dest: Path, x: np.ndarray, classes: int = 1000) -> None:
    """A MobileNetV2-shaped classifier (inverted residual blocks: pointwise expand, depthwise, pointwise project,
    residual adds; ReLU6; 1000 logits), batch-norm statistics from `x`, full-integer quantized with `x` as the
    representative dataset, int8 input and output."""
    from optkit.runtimes.tf import import_tf

    tf = import_tf()
    import tf_keras as keras

    keras.utils.set_random_seed(0)
    L = keras.layers

    def bn(h, act=True):
        h = L.BatchNormalization(momentum=0.0)(h)   # one training call sets the statistics from x
        return L.ReLU(6.0)(h) if act else h

    inp = L.Input(x.shape[1:], name="input_1")  # named: Keras numbers names per process (input_2 after another test)
    h = bn(L.Conv2D(16, 3, strides=2, padding="same", use_bias=False)(inp))
    cin = 16
    for filters, stride, reps in [(24, 2, 2), (32, 2, 3), (64, 2, 3), (96, 1, 2)]:
        for r in range(reps):
            s = stride if r == 0 else 1
            y = bn(L.Conv2D(cin * 6, 1, use_bias=False)(h))
            y = bn(L.DepthwiseConv2D(3, strides=s, padding="same", use_bias=False)(y))
            y = bn(L.Conv2D(filters, 1, use_bias=False)(y), act=False)
            h = L.Add()([h, y]) if s == 1 and cin == filters else y
            cin = filters
    h = L.GlobalAveragePooling2D()(bn(L.Conv2D(320, 1, use_bias=False)(h)))
    model = keras.Model(inp, L.Dense(classes, name="dense")(h))
    model(x, training=True)
    full_int8(tf.lite.TFLiteConverter.from_keras_model(model), x, dest)


def full_int8(conv, x: np.ndarray, dest: Path) -> None:
    """Full-integer TFLite from a converter: `x` one sample at a time as the representative dataset, int8 ops,
    int8 input and outputs; written to `dest`."""
    import tensorflow as tf

    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([x[i:i + 1]] for i in range(len(x)))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = conv.inference_output_type = tf.int8
    dest.write_bytes(conv.convert())


@pytest.fixture(scope="module")
def int8_cnn(tmp_path_factory):
    pytest.importorskip("tensorflow")
    folder = tmp_path_factory.mktemp("int8cnn")
    x = images()
    path = folder / "mnet_int8.tflite"
    mobilenet_like_int8(path, x)
    np.savez(folder / "data.npz", input_1=x)
    return path, folder / "data.npz"


def _validation(r: Result) -> dict:
    return json.loads(r.out)["stages"][-1]["measurements"]["validation"]


@pytest.mark.parametrize("with_data", [False, True])
def test_int8_cnn_converts_with_no_flags(cli, int8_cnn, tmp_path, with_data):
    """Refused before (real images: 3 steps > atol of 2 steps): now judged as int8 rounding, with the figures."""
    model, data = int8_cnn
    out = tmp_path / "m.onnx"
    r = cli("convert", model, "-o", out, "--json", "--runs", "3", *(["--data", data] if with_data else []))
    assert r.rc == 0, r.err
    val = _validation(r)
    o = val["outputs"]["dense"]
    q = o["step_error"]
    assert q["step"] == o["steps"] > 0
    assert q["median"] <= 1 and q["p90"] <= 2 and q["max"] <= 32 and q["p99"] >= q["p90"]
    assert {"clear_samples", "clear_margin", "top1_agreement_clear"} <= set(q)
    if with_data:
        assert "64 samples" in val["inputs"] and q["clear_samples"] > 0 and q["top1_agreement_clear"] == 1.0
    notes = json.loads(r.out)["stages"][-1].get("notes", [])
    assert any("judged in quantization steps" in n and "p99" in n for n in notes), notes


@pytest.mark.parametrize("factor", [2.0, 0.5])
def test_int8_cnn_with_a_wrong_output_scale_is_refused(int8_cnn, tmp_path, factor):
    model, data = int8_cnn
    out = tmp_path / "m.onnx"
    r = run_broken(model, out, data, factor=factor)
    assert r.rc == 3, r.err
    line = one_error_line(r)
    assert "more than int8 rounding explains" in line and "steps of" in line
    assert not out.exists()


def test_step_check_refuses_what_rounding_cannot_explain():
    from optkit.core.errors import ValidationError
    from optkit.passes.convert.common import check_steps

    rng = np.random.default_rng(0)
    ref = rng.integers(-60, 60, (64, 100)).astype(np.float64)
    ref[:, 7] = ref.max(1) + 10                         # class 7 leads by 10 steps on every sample: clear
    noise = rng.choice([-1, 0, 0, 0, 1], ref.shape)     # rounding: mostly no step, some one step
    noise[0, :3] = [4, -5, 6]                           # and a few elements a handful of steps off
    fig = {"outputs": {"y": {}}}
    check_steps("y", ref, ref + noise, 1.0, "TFLite", fig)
    q = fig["outputs"]["y"]["step_error"]
    assert q["max"] == 6 and q["median"] == 0 and q["top1_agreement_clear"] == 1.0
    for broken, why in [(ref * 1.25, "25.0% larger"),                  # a wrong scale
                        (ref.T.reshape(ref.shape), "hardly follows"),  # a wrong layout
                        (ref + np.where(np.arange(100) == 3, 40, 0), "more than 32 steps"),
                        (ref - 12 * (np.arange(100) == 7), "change it")]:   # 12 steps flip the top class
        with pytest.raises(ValidationError, match=why):
            check_steps("y", ref, broken, 1.0, "TFLite", {"outputs": {"y": {}}})


def test_one_step_on_too_few_distinct_values_is_rounding_not_a_zero_point():
    """A 1- or 2-element output, or one whose values are all equal (a constant, a saturated output), one step
    off: the same inputs round alike, so there is no telling a systematic step from rounding; judged by the
    median / p90 / max limits only (two steps are still refused). With many values, a zero point off by one and
    a 10% scale still are."""
    from optkit.core.errors import ValidationError
    from optkit.passes.convert.common import check_steps

    for ref in (np.array([[5.0]]), np.array([[5.0], [3.0]]), np.full((64, 10), 3.0)):
        check_steps("y", ref, ref + 1, 1.0, "TFLite", {"outputs": {"y": {}}})
        with pytest.raises(ValidationError, match="more than 1 steps"):
            check_steps("y", ref, ref + 2, 1.0, "TFLite", {"outputs": {"y": {}}})
    ref = np.random.default_rng(0).integers(-60, 60, (64, 1)).astype(np.float64)   # a 1-element output, 64 samples
    for broken, why in [(ref + 1, "shifted by"), (ref - 1, "shifted by"), (np.round(ref * 1.1), "larger"),
                        (np.round(ref * 0.9), "smaller")]:
        with pytest.raises(ValidationError, match=why):
            check_steps("y", ref, broken, 1.0, "TFLite", {"outputs": {"y": {}}})
