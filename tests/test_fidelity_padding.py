"""Padding in fidelity checks: only outputs with a sequence axis are masked, NaN anywhere still fails, and a
mask that hides every position is an error, never a perfect score."""
from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from conftest import no_result_files, one_error_line


def _pooling_encoder(path):
    """Token states [batch, seq, 8] and a masked mean [batch, 8]: 8 is also the sequence length of the data."""
    rng = np.random.default_rng(1)
    inits = [nh.from_array(rng.standard_normal((50, 8)).astype(np.float32), "emb"),
             nh.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W"),
             nh.from_array(np.array([2], np.int64), "ax"), nh.from_array(np.array([1], np.int64), "ax1")]
    nodes = [h.make_node("Gather", ["emb", "input_ids"], ["e"]), h.make_node("MatMul", ["e", "W"], ["hidden"]),
             h.make_node("Cast", ["attention_mask"], ["mf"], to=T.FLOAT),
             h.make_node("Unsqueeze", ["mf", "ax"], ["mf3"]), h.make_node("Mul", ["hidden", "mf3"], ["em"]),
             h.make_node("ReduceSum", ["em", "ax1"], ["s"], keepdims=0),
             h.make_node("ReduceSum", ["mf", "ax1"], ["cnt"], keepdims=1), h.make_node("Div", ["s", "cnt"], ["pooled"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("input_ids", T.INT64, ["batch", "seq"]),
                                      h.make_tensor_value_info("attention_mask", T.INT64, ["batch", "seq"])],
                         [h.make_tensor_value_info("hidden", T.FLOAT, ["batch", "seq", 8]),
                          h.make_tensor_value_info("pooled", T.FLOAT, ["batch", 8])], inits)
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_only_sequence_outputs_are_masked_and_nan_is_counted(cli, tmp_path):
    model = _pooling_encoder(tmp_path / "enc.onnx")
    rng = np.random.default_rng(0)
    mask = np.ones((12, 8), np.int64)
    mask[:6, 5:] = 0
    mask[6] = 0  # one sample all padding: its pooled row is 0/0 = NaN
    data = tmp_path / "d.npz"
    np.savez(data, input_ids=rng.integers(0, 50, (12, 8)), attention_mask=mask)
    r = cli("eval", model, "--data", data, "--reference", model, "--no-metric", "--json")
    assert r.rc == 0, r.err
    outputs = json.loads(r.out)["stages"][0]["measurements"]["fidelity"]["outputs"]
    assert outputs["hidden"]["masked_positions"] == 6 * 3 + 8
    assert "masked_positions" not in outputs["pooled"]  # [batch, 8] has no sequence axis
    assert outputs["pooled"]["nonfinite"] == 8 and outputs["pooled"]["cosine"] == -1.0


def test_a_mask_that_hides_everything_is_an_error(cli, tmp_path):
    model = _pooling_encoder(tmp_path / "enc.onnx")
    data = tmp_path / "d.npz"
    np.savez(data, input_ids=np.ones((12, 8), np.int64), attention_mask=np.zeros((12, 8), np.int64))
    out = tmp_path / "out"
    out.mkdir()
    r = cli("quantize", model, "-o", out / "q.onnx", "--mode", "dynamic", "--eval-data", data,
            "--check-output", "hidden", "--no-latency-search")
    assert r.rc == 2, r.err
    assert "masks every position of output 'hidden'" in one_error_line(r)
    assert no_result_files(out) == []


def test_simplify_refuses_a_model_whose_own_outputs_are_nan(cli, tmp_path):
    """Nothing can be checked against NaN: exit 3 when no input explains it (a mask that hides everything is
    exit 2, test_hostile_round3), nothing written (it used to pass 'equal within 0')."""
    w = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    graph = h.make_graph([h.make_node("MatMul", ["x", "W"], ["y"]), h.make_node("Log", ["y"], ["z"])], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, ["batch", 4])],
                         [h.make_tensor_value_info("z", T.FLOAT, ["batch", 4])], [nh.from_array(w, "W")])
    model = tmp_path / "log.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), model)
    out = tmp_path / "out"
    out.mkdir()
    r = cli("simplify", model, "-o", out / "s.onnx")
    assert r.rc == 3, r.err
    assert "itself gives" in one_error_line(r) and "NaN/Inf values" in one_error_line(r)
    assert no_result_files(out) == []
    data = tmp_path / "c.npz"
    np.savez(data, x=np.ones((3, 4), np.complex64))
    r = cli("bench", model, "--data", data, "--runs", "2")
    assert r.rc == 2 and "complex" in one_error_line(r)
