"""optkit simplify: equal outputs, never more nodes than onnxslim alone, bounded growth."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_quantize import build_loop, build_lstm

from conftest import no_result_files, one_error_line


def _check(cli, model, tmp_path):
    import onnxslim

    out = tmp_path / "s.onnx"
    r = cli("simplify", model, "-o", out, "--json")
    assert r.rc == 0, r.err
    rep = json.loads(r.out)
    s = rep["stages"][1]["measurements"]["simplify"]
    assert s["max_scaled_error"] <= 1e-5
    slim_only = onnxslim.slim(onnx.load(str(model)))
    from optkit.onnx.graph import op_counts

    assert s["nodes_after"] <= sum(op_counts(slim_only).values())
    assert s["ops_before"] and s["ops_after"]
    return rep, out


def test_sample_cnn(cli, samples, tmp_path):
    _check(cli, samples / "torch_cnn.onnx", tmp_path)


def test_mnist(cli, realcases, tmp_path):
    rep, out = _check(cli, realcases / "mnist.onnx", tmp_path)
    s = rep["stages"][1]["measurements"]["simplify"]
    assert s["nodes_after"] < s["nodes_before"]
    assert not any(n.domain for n in onnx.load(out).graph.node)  # portable: standard ops only


def test_lstm_and_loop(cli, tmp_path):
    pytest.importorskip("torch")
    _check(cli, build_lstm(tmp_path / "lstm.onnx"), tmp_path)
    _check(cli, build_loop(tmp_path / "loop.onnx"), tmp_path)


def _growing_model(path):
    """y = x + Expand(c, [512, 512]): folding the Expand writes a 1 MB constant into a tiny file."""
    c = numpy_helper.from_array(np.array([1.5], dtype=np.float32), "c")
    shape = numpy_helper.from_array(np.array([512, 512], dtype=np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Expand", ["c", "shape"], ["big"], name="expand"),
         helper.make_node("Add", ["x", "big"], ["y"], name="add")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [512, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [512, 512])], [c, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_growth_is_refused_or_avoided(cli, tmp_path):
    model = _growing_model(tmp_path / "grow.onnx")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    r = cli("simplify", model, "-o", out_dir / "s.onnx", "--json")
    if r.rc == 0:  # a variant without constant folding fit: the file did not grow
        assert (out_dir / "s.onnx").stat().st_size <= 1.5 * model.stat().st_size
        tried = json.loads(r.out)["stages"][1]["measurements"]["simplify"]["tried"]
        assert any("grew" in t.get("rejected", "") for t in tried)
    else:
        assert r.rc == 3 and "--max-growth" in one_error_line(r)
        assert no_result_files(out_dir) == []


def test_growth_refused_with_onnxsim(cli, tmp_path):
    pytest.importorskip("onnxsim")
    model = _growing_model(tmp_path / "grow.onnx")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    r = cli("simplify", model, "-o", out_dir / "s.onnx", "--engine", "onnxsim")
    assert r.rc == 3, r.err
    assert "grow" in one_error_line(r) and "--max-growth" in one_error_line(r)
    assert no_result_files(out_dir) == []


def test_not_onnx(cli, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    r = cli("simplify", bad, "-o", tmp_path / "s.onnx")
    assert r.rc == 2
    one_error_line(r)


def test_a_model_without_inputs_is_simplified_and_checked(cli, tmp_path):
    """It runs once (its outputs are constants); it used to stop with "no sample to run"."""
    import onnx
    from onnx import TensorProto, helper

    c = helper.make_tensor("c", TensorProto.FLOAT, [2, 3], [-1, 2, -3, 4, -5, 6])
    graph = helper.make_graph([helper.make_node("Constant", [], ["k"], value=c), helper.make_node("Relu", ["k"], ["y"])],
                              "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = tmp_path / "noinputs.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), model)
    r = cli("simplify", model, "-o", tmp_path / "s.onnx")
    assert r.rc == 0, r.err
    assert "on 1 inputs" in r.out.replace("\n", " ") or "on 1 input" in r.out.replace("\n", " ")
    onnx.checker.check_model(str(tmp_path / "s.onnx"))
