"""An int8 QDQ graph retyped as uint8 (optkit.passes.convert.retype): the same values on the graph's own
arithmetic, or no retyped file at all."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optkit.onnx.session import ort_session
from optkit.passes.convert.retype import to_uint8


def qdq_conv(int8_input: bool = False) -> onnx.ModelProto:
    """x -> Q(int8) -> DQ -> Conv(DQ(int8 per-channel weights), DQ(int32 bias)) -> Q -> DQ -> y; zero points
    shared between nodes, as tf2onnx writes them."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    inits = [numpy_helper.from_array(np.float32(0.02), "s_x"), numpy_helper.from_array(np.int8(-5), "z_x"),
             numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.full(4, 0.01, np.float32), "s_w"),
             numpy_helper.from_array(np.zeros(4, np.int8), "z_w"),
             numpy_helper.from_array(rng.integers(-500, 500, 4).astype(np.int32), "b"),
             numpy_helper.from_array(np.full(4, 0.0002, np.float32), "s_b"),
             numpy_helper.from_array(np.zeros(4, np.int32), "z_b"),
             numpy_helper.from_array(np.float32(0.05), "s_y")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_x", "z_x"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s_x", "z_x"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "s_w", "z_w"], ["wf"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "s_b", "z_b"], ["bf"], axis=0),
             helper.make_node("Conv", ["xf", "wf", "bf"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "s_y", "z_x"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "s_y", "z_x"], ["y"])]
    if int8_input:
        nodes = nodes[1:]
        x = helper.make_tensor_value_info("xq", TensorProto.INT8, [1, 3, 8, 8])
    else:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    g = helper.make_graph(nodes, "qdq", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_retyped_graph_computes_the_same_values():
    model = qdq_conv()
    u8 = to_uint8(model)
    assert u8 is not None
    onnx.checker.check_model(u8)
    types = {i.name: i.data_type for i in u8.graph.initializer}
    assert types["z_x"] == types["w"] == types["z_w"] == TensorProto.UINT8 and types["b"] == TensorProto.INT32
    assert numpy_helper.to_array(next(i for i in u8.graph.initializer if i.name == "z_x")) == 123
    assert next(i for i in model.graph.initializer if i.name == "z_x").data_type == TensorProto.INT8  # a copy
    x = np.random.default_rng(1).normal(0, 1, (1, 3, 8, 8)).astype(np.float32)
    ref = ort_session(model.SerializeToString(), optimization="basic").run(None, {"x": x})[0]
    assert np.array_equal(ort_session(u8.SerializeToString(), optimization="basic").run(None, {"x": x})[0], ref)
    # onnxruntime's fused u8 x u8 kernels do not saturate on any x86 CPU: within a step of the graph's arithmetic
    # (the int8 file's fused u8 x s8 kernels were 53 steps off it on an AVX2 EPYC)
    fused = ort_session(u8.SerializeToString()).run(None, {"x": x})[0]
    assert np.abs(fused - ref).max() <= 0.05 + 1e-6


@pytest.mark.parametrize("edit", ["int8-input", "nothing-int8", "subgraph"])
def test_nothing_is_retyped_where_it_cannot_be(edit):
    if edit == "int8-input":
        model = qdq_conv(int8_input=True)
    elif edit == "nothing-int8":
        model = qdq_conv()
        for i in model.graph.initializer:
            if i.name in ("z_x", "z_w", "w"):
                a = numpy_helper.to_array(i)
                i.CopyFrom(numpy_helper.from_array((a.astype(np.int16) + 128).astype(np.uint8), i.name))
    else:
        model = qdq_conv()
        branch = helper.make_graph([helper.make_node("Identity", ["y"], ["z"])], "b", [],
                                   [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
        model.graph.node.append(helper.make_node("If", ["cond"], ["out"], then_branch=branch, else_branch=branch))
    assert to_uint8(model) is None
