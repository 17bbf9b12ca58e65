"""Bias correction (passes/quantize/bias.py) with onnxruntime's real quantizer: the shift that rounding the
weights puts on each output channel's mean is taken off the bias, for Conv, depthwise Conv and Gemm."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optkit.onnx import session as onnx_session
from optkit.passes.quantize import bias
from optkit.passes.quantize.candidates import Settings
from optkit.passes.quantize.config import QuantizeConfig
from optkit.passes.quantize.engine import Static


def _model(path, rng):
    """x[N,8,6,6] -> Conv 8->8 3x3 -> depthwise Conv 3x3 (no bias) -> GlobalAveragePool -> Flatten -> Gemm 8->5.
    Every weight row holds one large value, so int8 rounding of the rest is coarse."""
    def weights(*shape):
        w = rng.normal(0, 0.05, shape).astype(np.float32)
        w.reshape(shape[0], -1)[:, 0] = 2.0
        return w

    inits = [numpy_helper.from_array(weights(8, 8, 3, 3), "w1"), numpy_helper.from_array(np.zeros(8, np.float32), "b1"),
             numpy_helper.from_array(weights(8, 1, 3, 3), "w2"),
             numpy_helper.from_array(weights(5, 8), "w3"), numpy_helper.from_array(np.zeros(5, np.float32), "b3")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c1", "w2"], ["c2"], name="dw", group=8, pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c2"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], name="fc", transB=1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


class _Reader:
    def __init__(self, x):
        self.x, self.i = x, 0

    def get_next(self):
        if self.i >= len(self.x):
            return None
        self.i += 1
        return {"x": self.x[self.i - 1:self.i]}

    def rewind(self):
        self.i = 0


def _run(path, x, names):
    import onnxruntime as ort

    from optkit.onnx import graph

    m = graph.with_outputs(onnx.load(path), names)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(names, sess.run(names, {"x": x})))


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_bias_correction_removes_the_mean_shift_of_rounded_weights(tmp_path, fmt):
    rng = np.random.default_rng(0)
    _model(tmp_path / "f.onnx", rng)
    x = rng.normal(6.0, 0.5, (64, 8, 6, 6)).astype(np.float32)  # inputs far from zero mean: the shift shows
    strategy = Static(QuantizeConfig(mode="static"), tmp_path)
    base = Settings(format=fmt, activation_type="uint8", weight_type="int8", per_channel=True, reduce_range=False,
                    calibration="minmax")
    reader = lambda: _Reader(x[:32])  # noqa: E731 - the search hands the strategy a reader factory
    strategy.build(tmp_path / "f.onnx", base, tmp_path / "q.onnx", calibration=reader)
    strategy.build(tmp_path / "f.onnx", Settings(**{**base.__dict__, "bias_correction": True}), tmp_path / "qbc.onnx",
                   calibration=reader)
    held_out = x[32:]
    ref = _run(tmp_path / "f.onnx", held_out, ["y"])["y"]
    plain = _run(tmp_path / "q.onnx", held_out, ["y"])["y"]
    corrected = _run(tmp_path / "qbc.onnx", held_out, ["y"])["y"]
    shift_plain = np.abs((plain - ref).mean(axis=0)).mean()
    shift_corrected = np.abs((corrected - ref).mean(axis=0)).mean()
    assert shift_corrected < 0.5 * shift_plain, (shift_plain, shift_corrected)
    # the layers corrected: the two Conv (one depthwise, without a bias until now) and the Gemm
    model = onnx.load(tmp_path / "f.onnx")
    means = bias.input_means(model, _Reader(x[:32]), tmp_path / "means.onnx")
    assert bias.correct(model, onnx.load(tmp_path / "q.onnx"), means) == 3
    assert len([n for n in model.graph.node if n.name == "dw"][0].input) == 3
    onnx_session.session(tmp_path / "qbc.onnx")  # loads in onnxruntime


def test_layers_left_alone(tmp_path):
    """Weights the build left float, and a bias shared by two layers, are not corrected."""
    rng = np.random.default_rng(1)
    _model(tmp_path / "f.onnx", rng)
    model = onnx.load(tmp_path / "f.onnx")
    means = {"x": np.ones(8), "c1": np.ones(8), "f": np.ones(8)}
    assert bias.correct(model, model, means) == 0  # no <w>_quantized anywhere: nothing was rounded
    for n in model.graph.node:
        if n.name == "dw":
            n.input.append("b1")  # b1 now shared by conv and dw
    assert [n.name for n in bias.layers(model)] == ["fc"]


def test_bias_correction_is_tried_first_when_the_first_tier_misses(tmp_path):
    strategy = Static(QuantizeConfig(mode="static"), tmp_path)
    best = [Settings(format="qdq", per_channel=True, calibration="minmax"),
            Settings(format="qoperator", per_channel=True, calibration="minmax")]
    tier = strategy.slower_tier(best)
    assert [(s.format, s.bias_correction) for s in tier[:2]] == [("qdq", True), ("qoperator", True)]
    assert [s.calibration for s in tier[2:]] == ["percentile", "percentile", "entropy", "entropy"]
    assert tier[0].label().endswith("minmax bc") and not any(s.bias_correction for s in tier[2:])
    given = Static(QuantizeConfig(mode="static", calibration_method="minmax"), tmp_path).slower_tier(best)
    assert [s.bias_correction for s in given] == [True, True]
