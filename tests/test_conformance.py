"""ONNX backend node tests through `optkit simplify` and `optkit quantize --mode dynamic`, and inputs optkit
cannot feed (#11).

Each run must end ok or refused with one `error:` line: no traceback, no "internal error", no hang, no
temporary file left, and no exit-0 result whose outputs differ from the reference where onnxruntime matches
it (see benchmarks/conformance.py for the classes). CI runs the first 12 node tests (the operators dynamic
INT8 quantizes, then one per operator in name order) and their `+weights` variants; OPTKIT_CONFORMANCE=220
runs the acceptance sweep (every operator once and every case with a weight).
"""
from __future__ import annotations

import concurrent.futures
import os
import sys
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optkit.core.errors import UsageError

from conftest import ROOT, one_error_line, run_cli

sys.path.insert(0, str(ROOT / "benchmarks"))
import conformance  # noqa: E402

LIMIT = int(os.environ.get("OPTKIT_CONFORMANCE", "12"))
JOBS = max(1, min(4, os.cpu_count() or 1))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    cases = conformance.node_cases(tmp_path_factory.mktemp("nodes"), LIMIT)
    assert len([c for c in cases if "+" not in c.name]) == LIMIT
    return conformance.sweep(cases, jobs=JOBS, timeout=60)


@pytest.mark.parametrize("command", sorted(conformance.COMMANDS))
def test_no_node_test_ends_badly(results, command):
    bad = {name: outcome for (name, cmd), outcome in results.items() if cmd == command and outcome[0] in conformance.BAD}
    assert bad == {}, conformance.summary(results)


def test_the_sweep_does_real_work(results):
    """Not everything refused: most node tests simplify and match the reference, and the weight variants
    quantize and stay close to it."""
    checked = {cmd: [name for (name, c), (cls, detail) in results.items()
                     if c == cmd and cls == "ok" and detail.startswith("matches")] for cmd in conformance.COMMANDS}
    assert len(checked["simplify"]) >= LIMIT // 2, conformance.summary(results)
    assert any(name.endswith("+weights") for name in checked["quantize"]), conformance.summary(results)


def test_choice_is_deterministic_and_diverse(tmp_path):
    a = [c.name for c in conformance.node_cases(tmp_path / "a", 12, weights=False)]
    b = [c.name for c in conformance.node_cases(tmp_path / "b", 12, weights=False)]
    assert a == b
    ops = {conformance._op(onnx.load(tmp_path / "a" / name / "model.onnx")) for name in a}
    assert len(ops) == 12 and {"Conv", "Gather", "MatMul"} <= ops


def test_weight_variant_bakes_the_weight_and_keeps_the_reference(tmp_path):
    cases = {c.name: c for c in conformance.node_cases(tmp_path, 4)}
    case = cases["test_gather_0+weights"]
    model = onnx.load(case.folder / "model.onnx")
    assert [i.name for i in model.graph.input] == ["indices"]
    assert [i.name for i in model.graph.initializer] == ["data"]
    got = conformance._ort_outputs(case.folder / "model.onnx", conformance._arrays(case.folder, "input"))
    assert conformance._matches(got, conformance._arrays(case.folder, "output"), case.rtol, case.atol)


# ------------------------------------------------------------------ inputs optkit cannot feed


def _identity(path, elem, op="Identity", opset=21, out_elem=None):
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], **({"to": out_elem} if op == "Cast" else {}))],
                              "g", [helper.make_tensor_value_info("x", elem, [1, 4])],
                              [helper.make_tensor_value_info("y", out_elem or elem, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.save(model, path)


def _one_node(path, node, inputs, outputs, opsets, inits=(), **save):
    graph = helper.make_graph([node], "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 8
    onnx.save(model, path, **save)


def _matmul(path, tail=None, **save):
    """y = x @ w (64 x 64), then `tail` (a unary op name) when given."""
    w = numpy_helper.from_array(np.random.default_rng(0).random((64, 64), dtype=np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t" if tail else "y"])]
    if tail == "Sqrt-of-Neg":
        nodes += [helper.make_node("Neg", ["t"], ["u"]), helper.make_node("Sqrt", ["u"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path, **save)


def _hostile_models(folder):
    """{name: (path, {command: (exit code, words the error line holds)})}"""
    f = TensorProto
    out = {}
    both = lambda rc, *words: {"simplify": (rc, words), "quantize": (rc, words)}  # noqa: E731
    _identity(folder / "bf16.onnx", f.BFLOAT16, "Cast", out_elem=f.FLOAT)
    out["bfloat16"] = both(2, "input 'x' has type bfloat16", "float32 or float16 inputs")
    _identity(folder / "f8.onnx", f.FLOAT8E4M3FN, "Cast", out_elem=f.FLOAT)
    out["float8"] = {"simplify": (2, ("input 'x' has type tensor(float8e4m3fn)", "cannot feed"))}
    q = numpy_helper.from_array(np.array(0.5, np.float32), "s")
    _one_node(folder / "int4.onnx", helper.make_node("DequantizeLinear", ["x", "s"], ["y"]),
              [helper.make_tensor_value_info("x", f.INT4, [1, 4])],
              [helper.make_tensor_value_info("y", f.FLOAT, [1, 4])], [("", 21)], [q])
    out["int4"] = {"simplify": (2, ("input 'x' has type tensor(int4)", "cannot feed"))}
    _one_node(folder / "seq.onnx", helper.make_node("SequenceAt", ["x", "i"], ["y"]),
              [helper.make_tensor_sequence_value_info("x", f.FLOAT, None),
               helper.make_tensor_value_info("i", f.INT64, [])],
              [helper.make_tensor_value_info("y", f.FLOAT, None)], [("", 17)])
    out["seq"] = {"simplify": (2, ("input 'x' has type seq(tensor(float))", "cannot feed"))}
    opt = helper.make_value_info("x", helper.make_optional_type_proto(helper.make_tensor_type_proto(f.FLOAT, [2])))
    _one_node(folder / "optional.onnx", helper.make_node("OptionalGetElement", ["x"], ["y"]), [opt],
              [helper.make_tensor_value_info("y", f.FLOAT, [2])], [("", 18)])
    out["optional"] = {"simplify": (2, ("input 'x' has type optional(tensor(float))", "cannot feed"))}
    mp = helper.make_value_info("x", helper.make_map_type_proto(f.INT64, helper.make_tensor_type_proto(f.FLOAT, [])))
    _one_node(folder / "map.onnx", helper.make_node("DictVectorizer", ["x"], ["y"], domain="ai.onnx.ml",
                                                    int64_vocabulary=[1, 2]), [mp],
              [helper.make_tensor_value_info("y", f.FLOAT, [1, 2])], [("", 17), ("ai.onnx.ml", 3)])
    out["map"] = both(2, "input 'x' has type map(int64,tensor(float))", "cannot feed")
    (folder / "ext").mkdir()
    _matmul(folder / "ext" / "ext.onnx", save_as_external_data=True, location="ext.weights", size_threshold=0)
    (folder / "ext" / "ext.weights").unlink()
    out["ext"] = both(2, "external data file", "ext.weights is missing")
    _matmul(folder / "nan.onnx", tail="Sqrt-of-Neg")
    out["nan"] = both(3, "itself gives", "NaN/Inf values", "Give data")
    paths = {"bfloat16": "bf16.onnx", "float8": "f8.onnx", "int4": "int4.onnx", "seq": "seq.onnx",
             "optional": "optional.onnx", "map": "map.onnx", "ext": "ext/ext.onnx", "nan": "nan.onnx"}
    return {name: (folder / paths[name], expect) for name, expect in out.items()}


COMMAND_ARGS = {"simplify": ["simplify"], "quantize": ["quantize", "--mode", "dynamic"]}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """{(model, command): (result, expected exit, words, output folder)}, run concurrently."""
    folder = tmp_path_factory.mktemp("hostile")
    runs = []
    for name, (path, expect) in _hostile_models(folder).items():
        for cmd, (rc, words) in expect.items():
            out = folder / f"out-{name}-{cmd}"
            out.mkdir()
            runs.append(((name, cmd), [*COMMAND_ARGS[cmd][:1], str(path), *COMMAND_ARGS[cmd][1:],
                                       "-o", str(out / "o.onnx")], rc, words, out))
    with concurrent.futures.ThreadPoolExecutor(JOBS) as pool:
        results = pool.map(lambda r: run_cli(*r[1], timeout=120), runs)
        return {key: (res, rc, words, out) for (key, _, rc, words, out), res in zip(runs, results)}


@pytest.mark.parametrize("key", [("bfloat16", "simplify"), ("bfloat16", "quantize"), ("float8", "simplify"),
                                 ("int4", "simplify"), ("seq", "simplify"), ("optional", "simplify"),
                                 ("map", "simplify"), ("map", "quantize"), ("ext", "simplify"),
                                 ("ext", "quantize"), ("nan", "quantize")])
def test_unfeedable_and_broken_models_are_refused_in_one_line(hostile, key):
    result, rc, words, out = hostile[key]
    assert result.rc == rc, (result.rc, result.err)
    line = one_error_line(result)
    assert "internal error" not in line
    for w in words:
        assert w in line, line
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("dtype", ["map(int64,tensor(float))", "seq(tensor(float))", "optional(tensor(float))",
                                   "tensor(int4)", "tensor(uint4)", "tensor(float8e5m2)", "tensor(complex64)",
                                   "sparse_tensor(float)"])
def test_input_dtype_refuses_what_it_cannot_feed(dtype):
    from optkit.measure.inputs import input_dtype

    with pytest.raises(UsageError, match="cannot feed"):
        input_dtype(SimpleNamespace(name="x", dtype=dtype))


def test_onnx_bfloat16_inputs_are_refused_before_running():
    from optkit.core.shapes import TensorSpec
    from optkit.onnx.session import check_feedable

    check_feedable([TensorSpec("x", [1], "float32"), TensorSpec("y", [1], "float16")])
    with pytest.raises(UsageError, match="'y' has type bfloat16"):
        check_feedable([TensorSpec("x", [1], "float32"), TensorSpec("y", [1], "bfloat16")])
