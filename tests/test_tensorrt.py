"""TensorRT: the CPU-only checker, the build pass's planning and its failure without TensorRT or a GPU, and
(marked `gpu`) real engine builds and measurements where TensorRT and an NVIDIA GPU are present."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import no_result_files, one_error_line

# -- small real ONNX models --------------------------------------------------------------------------------


def _save(model, path: Path) -> Path:
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def conv_model(path: Path, shape=(1, 3, 8, 8), opset: int = 17) -> Path:
    """input -> Conv(4 filters, 3x3, pad 1) -> Relu -> output."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, shape[1], 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(4, np.float32), "b")
    nodes = [helper.make_node("Conv", ["input", "w", "b"], ["c"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["output"], name="relu0")]
    out_shape = [shape[0], 4, shape[2], shape[3]]
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, out_shape)], [w, b])
    return _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), path)


def unsupported_op_model(path: Path) -> Path:
    """A supported Relu, then Unique (which TensorRT's ONNX parser does not support)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu0"),
             helper.make_node("Unique", ["r"], ["y"], name="uniq0", sorted=1)]
    g = helper.make_graph(nodes, "unique", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M"])])
    return _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def int64_model(path: Path) -> Path:
    """Gather with INT64 indices, and an INT64 table holding values past the INT32 range."""
    table = numpy_helper.from_array(np.array([1, 2, 3, 2 ** 40] * 32, np.int64), "big_table")
    idx = numpy_helper.from_array(np.array([0, 2], np.int64), "idx")
    nodes = [helper.make_node("Gather", ["big_table", "idx"], ["g"], name="gather0"),
             helper.make_node("Cast", ["g"], ["gf"], name="cast0", to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "gf"], ["y"], name="add0")]
    g = helper.make_graph(nodes, "int64", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [table, idx])
    return _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def qdq_model(path: Path, *, act_type=TensorProto.INT8, act_zp: int = 0, int32_bias: bool = False,
              shape=(1, 3, 8, 8)) -> Path:
    """Q/DQ on the activation and the weights of a Conv, like a QDQ static quantization.

    act_type/act_zp choose the activation quantization (UINT8 with zero point 128 is onnxruntime's asymmetric
    default, which TensorRT rejects); int32_bias adds a quantized INT32 bias with its DequantizeLinear.
    """
    rng = np.random.default_rng(0)
    np_act = {TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8}[act_type]
    w = rng.integers(-127, 128, size=(4, shape[1], 3, 3)).astype(np.int8)
    inits = [
        numpy_helper.from_array(np.array(0.02, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(act_zp, np_act), "x_zp"),
        numpy_helper.from_array(w, "w_q"),
        numpy_helper.from_array(np.full(4, 0.01, np.float32), "w_scale"),
        numpy_helper.from_array(np.zeros(4, np.int8), "w_zp"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["input", "x_scale", "x_zp"], ["xq"], name="q_in"),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xdq"], name="dq_in"),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["w"], name="dq_w", axis=0),
    ]
    conv_inputs = ["xdq", "w"]
    if int32_bias:
        inits += [numpy_helper.from_array(np.arange(4, dtype=np.int32), "b_q"),
                  numpy_helper.from_array(np.full(4, 0.0002, np.float32), "b_scale"),
                  numpy_helper.from_array(np.zeros(4, np.int32), "b_zp")]
        nodes.append(helper.make_node("DequantizeLinear", ["b_q", "b_scale", "b_zp"], ["b"], name="dq_bias", axis=0))
        conv_inputs.append("b")
    nodes += [helper.make_node("Conv", conv_inputs, ["c"], name="conv0", pads=[1, 1, 1, 1]),
              helper.make_node("Relu", ["c"], ["output"], name="relu0")]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [shape[0], 4, shape[2], shape[3]])], inits)
    return _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def codes(report: dict, severity: str | None = None) -> set[str]:
    return {f["code"] for f in report["findings"] if severity is None or f["severity"] == severity}


def check_json(cli, *args):
    r = cli("trt", "check", *map(str, args), "--json")
    return r, json.loads(r.out)


# -- optkit trt check (CPU only) ---------------------------------------------------------------------------


def test_check_clean_model_exits_0(cli, tmp_path):
    r, rep = check_json(cli, conv_model(tmp_path / "m.onnx"))
    assert r.rc == 0, r.err
    assert rep["ok"] and rep["errors"] == 0 and rep["findings"] == []
    assert rep["ops"] == {"Conv": 1, "Relu": 1} and rep["opset"] == 17


def test_check_table_output(cli, tmp_path):
    r = cli("trt", "check", unsupported_op_model(tmp_path / "u.onnx"))
    assert r.rc == 3
    assert "unsupported-op" in r.out and "uniq0" in r.out and "Unique" in r.out
    assert "onnx-tensorrt" in r.out  # says which support table it used
    line = one_error_line(r)
    assert "block a TensorRT build" in line and "Unique" in line


def test_check_unsupported_op_names_node_and_op(cli, tmp_path):
    r, rep = check_json(cli, unsupported_op_model(tmp_path / "u.onnx"))
    assert r.rc == 3
    bad = [f for f in rep["findings"] if f["code"] == "unsupported-op"]
    assert bad == [{"severity": "error", "code": "unsupported-op", "node": "uniq0", "op": "Unique",
                    "message": "op Unique is not supported by TensorRT's ONNX parser"}]
    assert not rep["ok"]


def test_check_custom_domain_op_is_an_error(tmp_path):
    from optkit.passes.tensorrt.check import check_model

    node = helper.make_node("FusedGemm", ["x", "x"], ["y"], name="fg", domain="com.microsoft")
    g = helper.make_graph([node], "ms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    onnx.save(m, tmp_path / "ms.onnx")
    rep = check_model(str(tmp_path / "ms.onnx"))
    assert [(f.code, f.op) for f in rep.errors] == [("custom-op", "FusedGemm")]


def test_check_qoperator_ops_point_to_qdq(tmp_path):
    from optkit.passes.tensorrt.check import check_model

    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"], name="mmi")
    g = helper.make_graph([node], "mmi", [helper.make_tensor_value_info("a", TensorProto.INT8, [2, 2]),
                                          helper.make_tensor_value_info("b", TensorProto.INT8, [2, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [2, 2])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "q.onnx")
    rep = check_model(str(tmp_path / "q.onnx"))
    assert any(f.code == "unsupported-op" and "Q/DQ format" in f.message for f in rep.errors)


def test_check_dynamic_dims_need_a_profile(cli, tmp_path):
    model = conv_model(tmp_path / "dyn.onnx", shape=("N", 3, "H", "W"))
    r, rep = check_json(cli, model)
    assert r.rc == 3
    dyn = [f for f in rep["findings"] if f["code"] == "dynamic-dim"]
    assert len(dyn) == 1 and "--shape input=" in dyn[0]["message"] and "1, 2, 3" not in dyn[0]["message"]
    # a profile for the input clears it; a fixed shape does too
    r, rep = check_json(cli, model, "--shape", "input=1x3x8x8:4x3x16x16:8x3x32x32")
    assert r.rc == 0 and "dynamic-dim" not in codes(rep)
    r, rep = check_json(cli, model, "--shape", "1x3x16x16")
    assert r.rc == 0 and "dynamic-dim" not in codes(rep)


def test_check_dynamic_batch_only_is_a_warning(cli, tmp_path):
    r, rep = check_json(cli, conv_model(tmp_path / "b.onnx", shape=("batch", 3, 8, 8)))
    assert r.rc == 0
    assert codes(rep, "warning") == {"dynamic-batch"}
    r = cli("trt", "check", tmp_path / "b.onnx", "--strict", "--json")
    assert r.rc == 3 and json.loads(r.out)["ok"] is False
    assert one_error_line(r).startswith("error: 1 problem would block")


def test_check_int64_initializers(cli, tmp_path):
    r, rep = check_json(cli, int64_model(tmp_path / "i64.onnx"))
    assert r.rc == 0  # TensorRT 10 has an INT64 type: noted, neither warned about nor blocking
    found = [f for f in rep["findings"] if f["code"] == "int64-weights"]
    assert len(found) == 1 and found[0]["severity"] == "info"
    assert "big_table" in found[0]["message"] and "natively" in found[0]["message"]
    assert rep["warnings"] == 0


def test_check_slice_int64_max_bounds_are_fine(tmp_path):
    from optkit.passes.tensorrt.check import check_model

    inits = [numpy_helper.from_array(np.array([1], np.int64), "starts"),
             numpy_helper.from_array(np.array([2 ** 63 - 1], np.int64), "ends")]
    node = helper.make_node("Slice", ["x", "starts", "ends"], ["y"], name="s")
    g = helper.make_graph([node], "s", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "s.onnx")
    rep = check_model(str(tmp_path / "s.onnx"))
    assert [f.severity for f in rep.findings] == ["info"]  # INT64 noted, not flagged as out of range


def test_check_symmetric_int8_qdq_is_clean(cli, tmp_path):
    model = qdq_model(tmp_path / "qdq.onnx")
    import onnxruntime as ort  # the model is real: onnxruntime runs it

    ort.InferenceSession(str(model)).run(None, {"input": np.ones((1, 3, 8, 8), np.float32)})
    r, rep = check_json(cli, model, "--precision", "int8")
    assert r.rc == 0, rep["findings"]
    assert rep["quantized"] is True
    assert codes(rep) == {"qdq"}


def test_check_rejects_asymmetric_uint8_qdq(cli, tmp_path):
    model = qdq_model(tmp_path / "asym.onnx", act_type=TensorProto.UINT8, act_zp=128)
    r, rep = check_json(cli, model)
    assert r.rc == 3
    errs = [(f["code"], f["node"]) for f in rep["findings"] if f["severity"] == "error"]
    assert ("qdq-zero-point", "q_in") in errs and ("qdq-zero-point", "dq_in") in errs
    assert ("qdq-uint8", "q_in") in errs


def test_check_rejects_int32_bias_dequantize(cli, tmp_path):
    r, rep = check_json(cli, qdq_model(tmp_path / "bias.onnx", int32_bias=True))
    assert r.rc == 3
    bias = [f for f in rep["findings"] if f["code"] == "qdq-int32-bias"]
    assert len(bias) == 1 and bias[0]["node"] == "dq_bias" and "QuantizeBias=False" in bias[0]["message"]


def test_check_rejects_dangling_quantize_and_int8_without_qdq(cli, tmp_path):
    from optkit.passes.tensorrt.check import check_model

    inits = [numpy_helper.from_array(np.array(0.1, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q0"),
             helper.make_node("Cast", ["q"], ["y"], name="cast0", to=TensorProto.FLOAT)]
    g = helper.make_graph(nodes, "dq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "d.onnx")
    assert "qdq-dangling-q" in {f.code for f in check_model(str(tmp_path / "d.onnx")).errors}
    r, rep = check_json(cli, conv_model(tmp_path / "f.onnx"), "--precision", "int8")
    assert r.rc == 3 and "int8-needs-qdq" in codes(rep, "error")


def qat_model(path: Path, shape=(1, 3, 8, 8), act_axis: int | None = None) -> Path:
    """The layout QAT and ModelOpt torch exports produce: float weights -> QuantizeLinear (per channel, axis 0) ->
    DequantizeLinear -> Conv, and per-tensor Q/DQ on the activation (per channel on axis act_axis when given)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, shape[1], 3, 3)).astype(np.float32)
    w_scale = (np.abs(w).reshape(4, -1).max(1) / 127).astype(np.float32)
    x_scale = np.full(shape[1], 0.02, np.float32) if act_axis is not None else np.array(0.02, np.float32)
    x_zp = np.zeros(shape[1], np.int8) if act_axis is not None else np.array(0, np.int8)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w_scale, "w_scale"),
             numpy_helper.from_array(np.zeros(4, np.int8), "w_zp"), numpy_helper.from_array(x_scale, "x_scale"),
             numpy_helper.from_array(x_zp, "x_zp")]
    act = {"axis": act_axis} if act_axis is not None else {}
    nodes = [
        helper.make_node("QuantizeLinear", ["input", "x_scale", "x_zp"], ["xq"], name="q_in", **act),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xdq"], name="dq_in", **act),
        helper.make_node("QuantizeLinear", ["w", "w_scale", "w_zp"], ["wq"], name="q_w", axis=0),
        helper.make_node("DequantizeLinear", ["wq", "w_scale", "w_zp"], ["wdq"], name="dq_w", axis=0),
        helper.make_node("Conv", ["xdq", "wdq"], ["c"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["output"], name="relu0"),
    ]
    g = helper.make_graph(nodes, "qat", [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT,
                                                         [shape[0], 4, shape[2], shape[3]])], inits)
    return _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_check_accepts_qat_style_weight_qdq(cli, tmp_path):
    """float weight -> Q (per channel) -> DQ is a weight, not a per-channel activation: TensorRT builds it."""
    import onnxruntime as ort

    model = qat_model(tmp_path / "qat.onnx")
    out = ort.InferenceSession(str(model)).run(None, {"input": np.ones((1, 3, 8, 8), np.float32)})[0]
    assert out.shape == (1, 4, 8, 8)
    r, rep = check_json(cli, model, "--precision", "int8")
    assert r.rc == 0, rep["findings"]
    assert codes(rep) == {"qdq"} and "2 QuantizeLinear, 2 DequantizeLinear" in rep["findings"][0]["message"]
    from optkit.passes.tensorrt import make_plan

    assert make_plan(str(model), _cfg(precision="int8"))["quantized"] is True


def test_check_still_rejects_per_channel_activations(tmp_path):
    from optkit.passes.tensorrt.check import check_model

    rep = check_model(str(qat_model(tmp_path / "act.onnx", act_axis=1)))
    bad = {(f.code, f.node) for f in rep.errors}
    assert bad == {("qdq-per-channel-activation", "q_in"), ("qdq-per-channel-activation", "dq_in")}


def _resize_model(path: Path, mode: str, scales) -> Path:
    inits = [numpy_helper.from_array(np.array(scales, np.float32), "scales")]
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="rs", mode=mode)
    out = [int(d * s) for d, s in zip((1, 2, 4, 4), scales)]
    g = helper.make_graph([node], "rs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits)
    return _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_check_cubic_resize_follows_the_parser(tmp_path):
    """TensorRT 10's parser imports cubic Resize (InterpolationMode::kCUBIC) on up to 2 scaled dims."""
    from optkit.passes.tensorrt.check import check_model

    assert check_model(str(_resize_model(tmp_path / "c.onnx", "cubic", [1, 1, 2, 2]))).findings == []
    rep = check_model(str(_resize_model(tmp_path / "c3.onnx", "cubic", [1, 2, 2, 2])))
    assert [(f.code, f.node) for f in rep.errors] == [("op-restriction", "rs")] and "at most 2" in rep.errors[0].message


def _one_op_model(path: Path, op: str, domain: str) -> Path:
    node = helper.make_node(op, ["x"], ["y"], name="n0", domain=domain)
    g = helper.make_graph([node], "p", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    m = helper.make_model(g, opset_imports=opsets)
    onnx.save(m, path)
    return path


@pytest.mark.parametrize("op,domain,want", [
    ("MyPlugin", "trt.plugins", ("warning", "plugin-op")),
    ("CustomOp", "trt", ("warning", "plugin-op")),
    ("EfficientNMS_TRT", "", ("warning", "plugin-op")),
    ("GroupNormalizationPlugin", "", ("warning", "plugin-op")),
    ("TRT_INT4DequantizeLinear", "trt", ("info", "trt-op")),
    ("FusedGemm", "com.microsoft", ("error", "custom-op")),
    ("NoSuchOp", "", ("error", "unsupported-op")),
])
def test_check_plugin_ops_are_warnings(tmp_path, op, domain, want):
    from optkit.passes.tensorrt.check import check_model

    rep = check_model(str(_one_op_model(tmp_path / "p.onnx", op, domain)))
    assert [(f.severity, f.code) for f in rep.findings] == [want]


def test_check_per_channel_qdq_needs_opset_13(tmp_path):
    from optkit.passes.tensorrt.check import check_model

    model = qdq_model(tmp_path / "q.onnx")
    m = onnx.load(model)
    m.opset_import[0].version = 11  # the mnist.onnx trap: per-channel QDQ on an old opset
    onnx.save(m, tmp_path / "old.onnx")
    rep = check_model(str(tmp_path / "old.onnx"))
    assert ("qdq-opset", "dq_w") in {(f.code, f.node) for f in rep.errors}


def test_check_real_mnist(cli, realcases):
    r, rep = check_json(cli, realcases / "mnist.onnx")
    assert r.rc == 0, r.err
    assert rep["opset"] == 7 and rep["errors"] == 0
    assert "opset-old" in codes(rep, "warning")  # opset 7 is below TensorRT 10's documented range
    assert rep["inputs"] == [{"name": "Input3", "shape": [1, 1, 28, 28], "dtype": "float32"}]
    assert cli("trt", "check", realcases / "mnist.onnx", "--strict").rc == 3


def test_check_bad_input(cli, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model at all")
    r = cli("trt", "check", bad)
    assert r.rc == 2 and "cannot read" in one_error_line(r)
    r = cli("trt", "check", tmp_path / "missing.onnx")
    assert r.rc == 2
    r = cli("trt", "check", conv_model(tmp_path / "m.onnx"), "--shape", "input=8x3x8x8:1x3x8x8:4x3x8x8")
    assert r.rc == 2 and "MIN <= OPT <= MAX" in one_error_line(r)


def test_check_reports_whether_onnxruntime_can_use_tensorrt(cli, tmp_path):
    import onnxruntime as ort

    r, rep = check_json(cli, conv_model(tmp_path / "m.onnx"))
    assert r.rc == 0
    status = rep["onnxruntime"]
    assert status["version"] == ort.__version__ and status["providers"] == ort.get_available_providers()
    if "TensorrtExecutionProvider" not in ort.get_available_providers():
        assert status["tensorrt"] is False and "optkit[trt-ort]" in status["why"]
        assert "optkit[trt-ort]" in cli("trt", "check", tmp_path / "m.onnx").out.replace("\n", "")


def test_check_table_covers_the_onnx_ops_it_claims():
    from optkit.passes.tensorrt.check import TRT_SUPPORTED_OPS, TRT_UNSUPPORTED_OPS

    assert not TRT_SUPPORTED_OPS & TRT_UNSUPPORTED_OPS
    known = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == ""}
    # every op in the table is a real ONNX op (catches typos), bar the parser's legacy extras
    assert (TRT_SUPPORTED_OPS | TRT_UNSUPPORTED_OPS) - known <= {"ImageScaler", "ParametricSoftplus", "ScaledTanh",
                                                                 "Scatter", "Upsample"}


# -- profiles and planning (CPU only) ----------------------------------------------------------------------


def test_parse_profiles():
    from optkit.core.errors import UsageError
    from optkit.passes.tensorrt.check import opt_shapes, parse_profiles

    p = parse_profiles(["x=1x3x8x8:4x3x8x8:8x3x8x8", "y=2x5", "1x2"])
    assert p["x"] == [[1, 3, 8, 8], [4, 3, 8, 8], [8, 3, 8, 8]]
    assert p["y"] == [[2, 5]] * 3 and p[""] == [[1, 2]] * 3
    assert opt_shapes(p)["x"] == [4, 3, 8, 8]
    for bad in ("x=1x3:2x3", "x=4x3:2x3:8x3", "x=1x3:1x3x1:1x3", "x=0x3"):
        with pytest.raises(UsageError):
            parse_profiles([bad])


def _cfg(**kw):
    from optkit.passes.tensorrt import TensorRTBuildConfig

    return TensorRTBuildConfig(**kw)


def test_plan_dynamic_batch_spans_the_accuracy_batches(tmp_path):
    from optkit.passes.tensorrt import EVAL_BATCH, make_plan

    model = str(conv_model(tmp_path / "b.onnx", shape=("batch", 3, 8, 8)))
    plan = make_plan(model, _cfg())
    assert plan["profiles"] == {"input": [[1, 3, 8, 8], [1, 3, 8, 8], [EVAL_BATCH, 3, 8, 8]]}
    assert plan["shapes"] == {"input": [1, 3, 8, 8]} and "batch 1 to 64" in plan["notes"][0]
    # the measurement's shape (a recipe's measure.shapes) sets OPT; the batch still spans 1..max(OPT, 64)
    plan = make_plan(model, _cfg(), {"input": [8, 3, 8, 8]})
    assert plan["profiles"]["input"] == [[1, 3, 8, 8], [8, 3, 8, 8], [64, 3, 8, 8]]
    plan = make_plan(model, _cfg(), {"input": [128, 3, 8, 8]})
    assert plan["profiles"]["input"] == [[1, 3, 8, 8], [128, 3, 8, 8], [128, 3, 8, 8]]
    # --shape / profile: taken as given
    plan = make_plan(model, _cfg(profile={"input": [[1, 3, 8, 8], [4, 3, 8, 8], [16, 3, 8, 8]]}), {"input": [4, 3, 8, 8]})
    assert plan["profiles"]["input"][2] == [16, 3, 8, 8] and plan["shapes"]["input"] == [4, 3, 8, 8]
    plan = make_plan(str(conv_model(tmp_path / "s.onnx")), _cfg())
    assert plan["profiles"] == {} and plan["shapes"] == {"input": [1, 3, 8, 8]}


def shape_input_model(path: Path) -> Path:
    """x reshaped by an int64 input `shape` (a shape tensor for TensorRT)."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape0")]
    g = helper.make_graph(nodes, "shape", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
                                           helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["A", "B"])])
    return _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_plan_shape_tensor_values(tmp_path):
    """Numbers given for a 1-D integer input, as many as it has elements, are its values (set_shape_input)."""
    from optkit.passes.tensorrt import make_plan
    from optkit.passes.tensorrt.check import parse_profiles

    model = str(shape_input_model(tmp_path / "s.onnx"))
    plan = make_plan(model, _cfg(profile=parse_profiles(["shape=1x6:2x12:4x24"])))
    assert plan["values"] == {"shape": [[1, 6], [2, 12], [4, 24]]} and plan["shapes"]["shape"] == [2]
    assert "shape" not in plan["profiles"]
    plan = make_plan(model, _cfg(profile=parse_profiles(["shape=2"])))  # its shape, not values
    assert plan["values"] == {} and plan["shapes"]["shape"] == [2]


def test_plan_rejects_bad_profiles_and_configs(tmp_path):
    from optkit.core.errors import UsageError
    from optkit.passes.tensorrt import make_plan

    dyn = str(conv_model(tmp_path / "d.onnx", shape=("N", 3, "H", "W")))
    with pytest.raises(UsageError, match="no optimization profile"):
        make_plan(dyn, _cfg())
    with pytest.raises(UsageError, match="fixes it at 3"):
        make_plan(dyn, _cfg(profile={"input": [[1, 4, 8, 8]] * 3}))
    with pytest.raises(UsageError, match="model's inputs are input"):
        make_plan(dyn, _cfg(profile={"image": [[1, 3, 8, 8]] * 3}))
    static = str(conv_model(tmp_path / "s.onnx"))
    with pytest.raises(UsageError, match="explicitly quantized"):
        make_plan(static, _cfg(precision="int8"))
    assert make_plan(static, _cfg(precision="fp16", strongly_typed=True))["quantized"] is False  # cast, then built
    plan = make_plan(str(qdq_model(tmp_path / "q.onnx")), _cfg(precision="int8", strongly_typed=True))
    assert plan["quantized"] is True
    # onnxruntime's default static QDQ (asymmetric activations, INT32 bias) can never build: exit 2, before the GPU
    asym = str(qdq_model(tmp_path / "asym.onnx", act_type=TensorProto.INT8, act_zp=-128, int32_bias=True))
    with pytest.raises(UsageError, match="quantized in a way TensorRT rejects"):
        make_plan(asym, _cfg(precision="int8"))


def test_config_rejects_unknown_keys_and_ranges():
    from pydantic import ValidationError as PydanticError

    for bad in ({"precision": "int4"}, {"optimization_level": 6}, {"workspace": 5}, {"workspace_mb": 0}):
        with pytest.raises(PydanticError):
            _cfg(**bad)


# -- precision on TensorRT 10 and 11 (a stub of the two attribute sets; only for the selection logic) ------------

# BuilderFlag members of the real bindings (NVIDIA/TensorRT python/src/infer/pyCore.cpp at v10.16 and v11.1)
TRT10_FLAGS = ("FP16 BF16 INT8 DEBUG GPU_FALLBACK REFIT DISABLE_TIMING_CACHE EDITABLE_TIMING_CACHE TF32 SPARSE_WEIGHTS "
               "SAFETY_SCOPE OBEY_PRECISION_CONSTRAINTS PREFER_PRECISION_CONSTRAINTS DIRECT_IO REJECT_EMPTY_ALGORITHMS "
               "VERSION_COMPATIBLE EXCLUDE_LEAN_RUNTIME FP8 ERROR_ON_TIMING_CACHE_MISS DISABLE_COMPILATION_CACHE "
               "WEIGHTLESS STRIP_PLAN REFIT_IDENTICAL WEIGHT_STREAMING INT4 REFIT_INDIVIDUAL STRICT_NANS MONITOR_MEMORY "
               "FP4 DISTRIBUTIVE_INDEPENDENCE").split()
TRT11_FLAGS = ("DEBUG GPU_FALLBACK REFIT DISABLE_TIMING_CACHE EDITABLE_TIMING_CACHE TF32 SPARSE_WEIGHTS SAFETY_SCOPE "
               "DIRECT_IO VERSION_COMPATIBLE EXCLUDE_LEAN_RUNTIME ERROR_ON_TIMING_CACHE_MISS DISABLE_COMPILATION_CACHE "
               "STRIP_PLAN REFIT_IDENTICAL WEIGHT_STREAMING REFIT_INDIVIDUAL STRICT_NANS MONITOR_MEMORY "
               "DISTRIBUTIVE_INDEPENDENCE").split()


def stub_trt(major: int):
    import enum
    import types

    flags = TRT10_FLAGS if major == 10 else TRT11_FLAGS
    return types.SimpleNamespace(__version__=f"{major}.1.0", BuilderFlag=enum.IntEnum("BuilderFlag", flags),
                                 NetworkDefinitionCreationFlag=enum.IntEnum("NetworkDefinitionCreationFlag",
                                                                            ["STRONGLY_TYPED"]))


@pytest.mark.parametrize("major,precision,strongly_typed,quantized,want", [
    # TensorRT 10: the builder flags where asked; int8 (Q/DQ) strongly typed by default
    (10, "fp32", None, False, {"strongly_typed": False, "flags": [], "cast": None}),
    (10, "fp16", None, False, {"strongly_typed": False, "flags": ["FP16"], "cast": None}),
    (10, "bf16", None, False, {"strongly_typed": False, "flags": ["BF16"], "cast": None}),
    (10, "int8", None, True, {"strongly_typed": True, "flags": [], "cast": None}),
    (10, "int8", False, True, {"strongly_typed": False, "flags": ["FP16", "INT8"], "cast": None}),
    (10, "fp16", False, True, {"strongly_typed": False, "flags": ["FP16", "INT8"], "cast": None}),
    (10, "fp16", True, False, {"strongly_typed": True, "flags": [], "cast": "fp16"}),
    # TensorRT 11: no precision flags; fp16/bf16 are cast, everything is strongly typed
    (11, "fp32", None, False, {"strongly_typed": True, "flags": [], "cast": None}),
    (11, "fp32", False, False, {"strongly_typed": True, "flags": [], "cast": None}),
    (11, "fp16", None, False, {"strongly_typed": True, "flags": [], "cast": "fp16"}),
    (11, "bf16", None, False, {"strongly_typed": True, "flags": [], "cast": "bf16"}),
    (11, "int8", None, True, {"strongly_typed": True, "flags": [], "cast": None}),
    (11, "fp16", None, True, {"strongly_typed": True, "flags": [], "cast": None}),  # Q/DQ: the model's own types
])
def test_select_precision_on_tensorrt_10_and_11(major, precision, strongly_typed, quantized, want):
    from optkit.passes.tensorrt import select_precision

    trt = stub_trt(major)
    got = select_precision(trt, precision, strongly_typed, quantized)
    assert got == want
    for name in got["flags"]:  # every flag it sets exists on that TensorRT
        assert hasattr(trt.BuilderFlag, name)


def test_select_precision_weak_typing_refused_on_tensorrt_11():
    from optkit.core.errors import UsageError
    from optkit.passes.tensorrt import select_precision

    for precision in ("fp16", "bf16", "int8"):
        with pytest.raises(UsageError, match="removed in TensorRT 11"):
            select_precision(stub_trt(11), precision, False, precision == "int8")


def test_cast_model_fp16_keeps_io_types(tmp_path):
    """The strongly typed fp16 path casts the model (onnxconverter-common where ModelOpt is absent); inputs and
    outputs stay float32 and the cast model still computes the same thing."""
    import onnxruntime as ort

    from optkit.passes.tensorrt import cast_model

    src = conv_model(tmp_path / "m.onnx")
    tool = cast_model(str(src), "fp16", str(tmp_path / "m16.onnx"))
    assert tool in ("ModelOpt AutoCast", "onnxconverter-common float16")
    m16 = onnx.load(tmp_path / "m16.onnx")
    assert m16.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert any(i.data_type == TensorProto.FLOAT16 for i in m16.graph.initializer)
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    a = ort.InferenceSession(str(src)).run(None, {"input": x})[0]
    b = ort.InferenceSession(str(tmp_path / "m16.onnx")).run(None, {"input": x})[0]
    assert np.abs(a - b).max() <= 3e-2 * np.abs(a).max()


def test_cast_model_bf16_without_modelopt_exits_4(tmp_path):
    from optkit.core.errors import DependencyError
    from optkit.passes.tensorrt import cast_model

    if importlib.util.find_spec("modelopt") is not None:
        pytest.skip("ModelOpt is installed")
    with pytest.raises(DependencyError, match="nvidia-modelopt"):
        cast_model(str(conv_model(tmp_path / "m.onnx")), "bf16", str(tmp_path / "b.onnx"))


# -- accuracy in batches the engine's profile allows (CPU: a session that keeps an engine's profile) ----------


class ProfileBoundSession:
    """Runs the ONNX model on onnxruntime but takes only the batches a TensorRT engine with `profile` on its batch
    dim would take, and shows its inputs the way TensorRTSession does (runtimes.tensorrt.profile_shape)."""

    runtime, provider, threads = "tensorrt", "tensorrt", None

    def __init__(self, path, profile):
        from optkit.core.artifact import Artifact
        from optkit.core.shapes import TensorSpec
        from optkit.runtimes.onnx import OnnxSession
        from optkit.runtimes.tensorrt import profile_shape

        self.ref = OnnxSession(Artifact.load(path), provider="cpu")
        spec = self.ref.inputs[0]
        dims = [-1 if not isinstance(d, int) else d for d in spec.shape]
        self.inputs = [TensorSpec(spec.name, profile_shape(dims, profile), spec.dtype)]
        self.outputs = self.ref.outputs
        self.lo, self.hi = profile[0][0], profile[2][0]
        self.batches: list[int] = []

    def check_feeds(self, feeds):
        pass

    def run(self, feeds):
        from optkit.core.errors import UsageError

        batch = len(next(iter(feeds.values())))
        if not self.lo <= batch <= self.hi:
            raise UsageError(f"batch {batch} is outside the engine's optimization profile")
        self.batches.append(batch)
        return self.ref.run(feeds)

    def close(self):
        pass

    def describe(self):
        return {"name": self.runtime, "version": None, "settings": {"profile": [self.lo, self.hi]}}


def measure_accuracy_on_profile(monkeypatch, model: Path, profile) -> tuple[dict, list[int]]:
    import optkit.measure.model as mm
    from optkit.core.artifact import Artifact

    session = ProfileBoundSession(model, profile)
    monkeypatch.setattr(mm, "open_session", lambda *a, **k: session)
    data = mm.DataSpec(path=str(Path("sample_models/digits_eval_nchw.npz").resolve()))
    result = mm._measure(Artifact.load(model), mm.MeasureSettings(), False, data, "top1", None)
    return result["accuracy"], session.batches


def test_accuracy_runs_in_batches_the_planned_profile_allows(monkeypatch):
    """The default plan's profile covers the batches accuracy runs in (497 digits: 64 at a time, then 49)."""
    from optkit.passes.tensorrt import make_plan

    model = Path("sample_models/torch_cnn.onnx").resolve()
    plan = make_plan(str(model), _cfg())
    acc, batches = measure_accuracy_on_profile(monkeypatch, model, plan["profiles"]["input"])
    assert acc["samples"] == 497 and acc["top1"] > 0.9
    assert max(batches) == 64 and sum(batches) == 497


def test_accuracy_on_a_batch_one_engine_runs_one_sample_per_call(monkeypatch):
    """An engine whose profile fixes the batch (built with --shape input=1x1x8x8, or elsewhere) reads as batch 1,
    so accuracy feeds it one sample per call instead of failing on 64."""
    model = Path("sample_models/torch_cnn.onnx").resolve()
    acc, batches = measure_accuracy_on_profile(monkeypatch, model, [[1, 1, 8, 8]] * 3)
    assert acc["samples"] == 497 and set(batches) == {1}


@pytest.mark.parametrize("recipe", ["tensorrt.yaml", "onnx-tensorrt.yaml"])
def test_ready_tensorrt_recipes_fit_their_accuracy_batches(cli, monkeypatch, recipe):
    """Each tensorrt.build stage of the ready recipes plans a profile its accuracy measurement fits, and the recipe
    validates (--dry-run); without TensorRT, running it stops at the first TensorRT stage with exit 4."""
    import yaml

    from optkit.passes.tensorrt import TensorRTBuildConfig, make_plan

    path = Path("recipes") / recipe
    doc = yaml.safe_load(path.read_text())
    model = (path.parent / doc["model"]["path"]).resolve()
    stages = [st for st in doc["stages"] if st["pass"] == "tensorrt.build"]
    assert len(stages) == 2
    for st in stages:
        config = TensorRTBuildConfig(**{**st.get("config", {}), "precision": "fp16"})  # int8 is planned on the QDQ
        plan = make_plan(str(model), config, doc["measure"].get("shapes"))
        acc, batches = measure_accuracy_on_profile(monkeypatch, model, plan["profiles"]["input"])
        assert acc["samples"] == 497 and max(batches) == 64
    r = cli("run", path, "--dry-run")
    assert r.rc == 0, r.err


def test_timing_cache_path(monkeypatch, tmp_path):
    from optkit.passes.tensorrt import timing_cache_path

    monkeypatch.setenv("OPTKIT_CACHE_DIR", str(tmp_path))
    auto = timing_cache_path("auto")
    assert auto.parent == tmp_path and auto.name.startswith("tensorrt-") and auto.suffix == ".cache"
    assert timing_cache_path(None) is None and timing_cache_path("") is None
    assert timing_cache_path(str(tmp_path / "t.cache")) == tmp_path / "t.cache"


def test_parser_error_names_node_and_op():
    from optkit.passes.tensorrt import parser_error

    class Err:
        def __init__(self, name, op, desc):
            self._n, self._o, self._d = name, op, desc

        def node_name(self):
            return self._n

        def node_operator(self):
            return self._o

        def node(self):
            return 7

        def code(self):
            return "ErrorCode.UNSUPPORTED_NODE"

        def desc(self):
            return self._d

    class Parser:
        errors = [Err("uniq0", "Unique", "No importer registered for op: Unique\nmore text"), Err("", "Foo", "x")]
        num_errors = 2

        def get_error(self, i):
            return self.errors[i]

    err = parser_error(Parser(), "m.onnx", [])
    assert err.exit_code == 3
    assert str(err) == ("TensorRT's ONNX parser failed at node 'uniq0' (op Unique) in m.onnx: No importer registered "
                        "for op: Unique (+1 more); `optkit trt check m.onnx` lists what TensorRT does not support")
    assert err.details["parser_errors"][1]["node"] == ""


def test_gpu_problem_honours_cuda_visible_devices(monkeypatch):
    from optkit.runtimes.tensorrt import gpu_problem

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert "no NVIDIA GPU" in gpu_problem()


# -- without TensorRT or a GPU (as on CPU-only CI) ---------------------------------------------------------

needs_no_trt = pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed")


def _gpu_here() -> bool:
    from optkit.runtimes.tensorrt import gpu_problem

    return gpu_problem() is None


@needs_no_trt
def test_build_without_tensorrt_exits_4_writes_nothing(cli, tmp_path):
    model = conv_model(tmp_path / "m.onnx")
    out = tmp_path / "out"
    out.mkdir()
    r = cli("trt", "build", model, "-o", out / "m.engine", "--report", out / "r.json")
    assert r.rc == 4
    line = one_error_line(r)
    assert "pip install" in line and "NVIDIA GPU" in line and "tensorrt.build" in line
    assert no_result_files(out) == []


@needs_no_trt
def test_passes_lists_tensorrt_build_unavailable(cli):
    r = cli("passes", "--json")
    assert r.rc == 0
    row = next(p for p in json.loads(r.out) if p["name"] == "tensorrt.build")
    assert row["available"] is False and "optkit[trt]" in row["install"] and "NVIDIA GPU" in row["install"]
    assert row["accepts"] == ["onnx"] and row["produces"] == "trt-engine" and row["extra"] == "trt"


@pytest.mark.skipif(_gpu_here(), reason="an NVIDIA GPU is visible here")
def test_build_with_tensorrt_but_no_gpu_exits_4(cli, tmp_path, monkeypatch):
    """A tensorrt package that imports but no GPU: still exit 4, saying an NVIDIA GPU is needed."""
    fake = tmp_path / "site"
    (fake / "tensorrt").mkdir(parents=True)
    (fake / "tensorrt" / "__init__.py").write_text("__version__ = '10.0.0'\n")
    monkeypatch.setenv("PYTHONPATH", str(fake))
    model = conv_model(tmp_path / "m.onnx")
    r = cli("trt", "build", model, "-o", tmp_path / "m.engine")
    assert r.rc == 4
    assert "NVIDIA GPU" in one_error_line(r)
    assert not (tmp_path / "m.engine").exists()
    row = next(p for p in json.loads(cli("passes", "--json").out) if p["name"] == "tensorrt.build")
    assert row["available"] is False and "no NVIDIA GPU" in row["install"]


@needs_no_trt
def test_engine_measurement_without_tensorrt_exits_4(cli, tmp_path):
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"\x00" * 64)
    r = cli("bench", engine)
    assert r.rc == 4 and "TensorRT is not installed" in one_error_line(r)


def test_onnx_gpu_providers_absent_exit_4(cli, tmp_path):
    import onnxruntime as ort

    model = conv_model(tmp_path / "m.onnx")
    for provider, ep in (("cuda", "CUDAExecutionProvider"), ("tensorrt", "TensorrtExecutionProvider")):
        if ep in ort.get_available_providers():
            continue
        r = cli("bench", model, "--provider", provider, "--runs", "2")
        assert r.rc == 4, r.err
        assert "onnxruntime-gpu" in one_error_line(r)


def test_trt_help_imports_no_framework():
    import subprocess
    import sys

    code = ("import sys; from optkit.cli.main import app; import optkit.cli.trt, optkit.passes.tensorrt, "
            "optkit.runtimes.tensorrt, optkit.passes.tensorrt.check; "
            "print([m for m in ('tensorrt', 'torch', 'tensorflow', 'cuda') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- on an NVIDIA GPU with TensorRT (skipped elsewhere) ----------------------------------------------------


def _trt_and_gpu() -> bool:
    return importlib.util.find_spec("tensorrt") is not None and _gpu_here()


gpu = pytest.mark.skipif(not _trt_and_gpu(), reason="needs TensorRT and an NVIDIA GPU")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gpu_build_and_measure(cli, tmp_path, precision, monkeypatch):
    monkeypatch.setenv("OPTKIT_CACHE_DIR", str(tmp_path / "cache"))
    model = conv_model(tmp_path / "m.onnx")
    engine = tmp_path / f"m.{precision}.engine"
    r = cli("trt", "build", model, "-o", engine, "--precision", precision, "--runs", "20", "--json")
    assert r.rc == 0, r.err
    rep = json.loads(r.out)
    stage = rep["stages"][-1]
    assert stage["output"]["format"] == "trt-engine" and engine.exists()
    m = stage["measurements"]
    assert m["latency"]["p50_ms"] > 0 and m["latency"]["provider"].startswith("tensorrt")
    assert m["fidelity"]["cosine"] > 0.999
    assert m["tensorrt"]["validation"]["precision"] == precision
    # the timing cache is saved, then reused by the next build
    r2 = cli("trt", "build", model, "-o", tmp_path / "again.engine", "--precision", precision, "--runs", "5",
             "--json")
    assert r2.rc == 0, r2.err
    assert json.loads(r2.out)["stages"][-1]["measurements"]["tensorrt"]["timing_cache"]["reused"] is True


@pytest.mark.gpu
@gpu
def test_gpu_int8_from_qdq_and_dynamic_profile(cli, tmp_path):
    qdq = qdq_model(tmp_path / "q.onnx", shape=("N", 3, 8, 8))
    r = cli("trt", "build", qdq, "-o", tmp_path / "q.engine", "--precision", "int8", "--shape",
            "input=1x3x8x8:4x3x8x8:8x3x8x8", "--no-timing-cache", "--runs", "10", "--json")
    assert r.rc == 0, r.err
    t = json.loads(r.out)["stages"][-1]["measurements"]["tensorrt"]
    assert t["profiles"]["input"] == [[1, 3, 8, 8], [4, 3, 8, 8], [8, 3, 8, 8]]
    r = cli("bench", tmp_path / "q.engine", "--shape", "input=8x3x8x8", "--runs", "10", "--json")
    assert r.rc == 0, r.err
    r = cli("bench", tmp_path / "q.engine", "--shape", "input=9x3x8x8", "--runs", "2")
    assert r.rc == 2 and "optimization profile" in one_error_line(r)


@pytest.mark.gpu
@gpu
def test_gpu_cuda_graphs_and_parser_error(cli, tmp_path):
    model = conv_model(tmp_path / "m.onnx")
    r = cli("trt", "build", model, "-o", tmp_path / "g.engine", "--cuda-graphs", "--runs", "20", "--json")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["stages"][-1]["measurements"]["latency"]["provider"] == "tensorrt+cuda-graph"
    r = cli("trt", "build", unsupported_op_model(tmp_path / "u.onnx"), "-o", tmp_path / "u.engine")
    assert r.rc == 3 and "uniq0" in one_error_line(r) and "Unique" in one_error_line(r)
    assert not (tmp_path / "u.engine").exists()


def _digits() -> Path:
    return Path("sample_models/digits_eval_nchw.npz").resolve()


@pytest.mark.gpu
@gpu
def test_gpu_dynamic_batch_engine_measures_accuracy(cli, tmp_path):
    """No --shape: the engine takes batch 1..64, so accuracy over 497 digits (64 per call) runs."""
    r = cli("trt", "build", "sample_models/torch_cnn.onnx", "-o", tmp_path / "d.engine", "--data", _digits(),
            "--metric", "top1", "--runs", "10", "--json")
    assert r.rc == 0, r.err
    m = json.loads(r.out)["stages"][-1]["measurements"]
    assert m["accuracy"]["samples"] == 497 and m["accuracy"]["top1"] > 0.9
    assert m["tensorrt"]["profiles"]["input"][2] == [64, 1, 8, 8]


@pytest.mark.gpu
@gpu
def test_gpu_bf16(cli, tmp_path):
    import tensorrt as trt

    if not hasattr(trt.BuilderFlag, "BF16") and importlib.util.find_spec("modelopt") is None:
        pytest.skip("TensorRT 11 builds bf16 from a cast model: needs nvidia-modelopt[onnx]")
    r = cli("trt", "build", conv_model(tmp_path / "m.onnx"), "-o", tmp_path / "b.engine", "--precision", "bf16",
            "--runs", "10", "--json")
    if r.rc == 3 and "bf16" in r.err.lower() and "support" in r.err.lower():
        pytest.skip("this GPU has no bf16 kernels")
    assert r.rc == 0, r.err
    t = json.loads(r.out)["stages"][-1]["measurements"]["tensorrt"]
    assert t["validation"]["precision"] == "bf16"
    assert t["builder_flags"] == ["BF16"] or t["cast"] == "bf16"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("make", ["qdq", "qat"])
def test_gpu_strongly_typed_int8(cli, tmp_path, make):
    """int8 from a Q/DQ model builds strongly typed by default, from onnxruntime-style and QAT-style Q/DQ alike."""
    model = (qdq_model if make == "qdq" else qat_model)(tmp_path / f"{make}.onnx")
    r = cli("trt", "build", model, "-o", tmp_path / "q.engine", "--precision", "int8", "--runs", "10", "--json")
    assert r.rc == 0, r.err
    t = json.loads(r.out)["stages"][-1]["measurements"]["tensorrt"]
    assert t["strongly_typed"] is True and t["builder_flags"] == [] and t["validation"]["precision"] == "int8"


@pytest.mark.gpu
@gpu
def test_gpu_strongly_typed_fp16_casts_the_model(cli, tmp_path):
    r = cli("trt", "build", conv_model(tmp_path / "m.onnx"), "-o", tmp_path / "h.engine", "--precision", "fp16",
            "--strongly-typed", "--runs", "10", "--json")
    assert r.rc == 0, r.err
    t = json.loads(r.out)["stages"][-1]["measurements"]["tensorrt"]
    assert t["strongly_typed"] is True and t["cast"] == "fp16" and t["validation"]["precision"] == "fp16"


def _build_elsewhere(onnx_path: Path, engine_path: Path, profile) -> None:
    """An engine built with TensorRT's Python API alone, as a user or trtexec would."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse_from_file(str(onnx_path))
    config = builder.create_builder_config()
    prof = builder.create_optimization_profile()
    prof.set_shape(network.get_input(0).name, *profile)
    config.add_optimization_profile(prof)
    engine_path.write_bytes(bytes(builder.build_serialized_network(network, config)))


@pytest.mark.gpu
@gpu
def test_gpu_engine_built_elsewhere(cli, tmp_path):
    """An engine optkit did not build, with a batch-1 profile: bench runs it, eval feeds it one digit per call."""
    engine = tmp_path / "elsewhere.engine"
    _build_elsewhere(Path("sample_models/torch_cnn.onnx"), engine, [[1, 1, 8, 8]] * 3)
    r = cli("bench", engine, "--runs", "20", "--json")
    assert r.rc == 0, r.err
    r = cli("eval", engine, "--data", _digits(), "--metric", "top1", "--json")
    assert r.rc == 0, r.err
    assert "497" in r.out
    r = cli("bench", engine, "--batch", "8", "--runs", "2")
    assert r.rc == 2


@pytest.mark.gpu
@gpu
def test_gpu_onnx_on_onnxruntime_tensorrt_provider(cli, tmp_path, monkeypatch):
    from optkit.runtimes.tensorrt import ort_tensorrt_status

    status = ort_tensorrt_status()
    if not status["tensorrt"]:
        pytest.skip(f"onnxruntime cannot use TensorRT here: {status['why']}")
    monkeypatch.setenv("OPTKIT_CACHE_DIR", str(tmp_path / "cache"))
    r = cli("bench", conv_model(tmp_path / "m.onnx"), "--provider", "tensorrt", "--runs", "20", "--json")
    assert r.rc == 0, r.err
    assert "tensorrt" in r.out


def test_onnx_provider_fallback_is_an_error(tmp_path, monkeypatch):
    """onnxruntime quietly falls back to the CPU when the CUDA libraries fail to load: say so (exit 4)."""
    import onnxruntime as ort

    from optkit.core.artifact import Artifact
    from optkit.core.errors import DependencyError
    from optkit.runtimes.onnx import OnnxSession

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("the CUDA provider is really present")
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(DependencyError, match="could not start CUDAExecutionProvider"):
        OnnxSession(Artifact.load(conv_model(tmp_path / "m.onnx")), provider="cuda")
