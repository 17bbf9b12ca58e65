"""Red team on `optkit profile` with control flow (issue 29 item 17, continued): an If, Loop or Scan node's own time
is its span less its subgraphs' kernels and less what the profiler records inside it. Each run of a subgraph (an
If's branch, a Loop's or Scan's iteration) records an executor event ("SequentialExecutor::Execute") besides its
kernels' events; that write was left in the node: an If holding one cheap Add inside a Loop of 100 iterations
read 0.16-0.22 ms in a call whose p50 was 0.25 ms (a plain run spends ~0.06 ms on those 100 Ifs and their
branches). Nested nodes (a Loop in an If, an If in a Loop), a Scan, Loops of 0 and 1 iteration, a Loop of heavy
MatMuls and two Loops side by side: exit 0, no negative or NaN figure, nothing counted twice."""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

F = T.FLOAT


def _vi(name, dtype, shape):
    return h.make_tensor_value_info(name, dtype, shape)


def _save(graph, path: Path) -> Path:
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def _cheap_body(prefix: str, shape=(1, 16)):
    return h.make_graph(
        [h.make_node("Identity", ["cond_in"], ["cond_out"], name=f"{prefix}_id"),
         h.make_node("Add", ["x_in", f"{prefix}_one"], [f"{prefix}_y"], name=f"{prefix}_add"),
         h.make_node("Relu", [f"{prefix}_y"], ["x_out"], name=f"{prefix}_relu")], f"{prefix}_body",
        [_vi("i", T.INT64, []), _vi("cond_in", T.BOOL, []), _vi("x_in", F, list(shape))],
        [_vi("cond_out", T.BOOL, []), _vi("x_out", F, list(shape))], [h.make_tensor(f"{prefix}_one", F, [1], [1.0])])


def _true():
    return h.make_node("Constant", [], ["c"], value=h.make_tensor("cv", T.BOOL, [], [True]), name="const_true")


def if_in_loop(path: Path) -> Path:
    """A Loop of M iterations whose body holds an If: then one Add, else a Sub and a Relu (by i's parity)."""
    then_b = h.make_graph([h.make_node("Add", ["x_in", "one"], ["t_out"], name="t_add")], "tb", [],
                          [_vi("t_out", F, [1, 16])])
    else_b = h.make_graph([h.make_node("Sub", ["x_in", "one"], ["e_y"], name="e_sub"),
                           h.make_node("Relu", ["e_y"], ["e_out"], name="e_relu")], "eb", [],
                          [_vi("e_out", F, [1, 16])])
    body = h.make_graph(
        [h.make_node("Identity", ["cond_in"], ["cond_out"], name="b_id"),
         h.make_node("Mod", ["i", "two"], ["r"], name="b_mod"),
         h.make_node("Equal", ["r", "zero"], ["even"], name="b_eq"),
         h.make_node("If", ["even"], ["x_out"], then_branch=then_b, else_branch=else_b, name="body_if")], "body",
        [_vi("i", T.INT64, []), _vi("cond_in", T.BOOL, []), _vi("x_in", F, [1, 16])],
        [_vi("cond_out", T.BOOL, []), _vi("x_out", F, [1, 16])],
        [h.make_tensor("one", F, [1], [1.0]), h.make_tensor("two", T.INT64, [], [2]),
         h.make_tensor("zero", T.INT64, [], [0])])
    return _save(h.make_graph([_true(), h.make_node("Loop", ["M", "c", "x"], ["out"], body=body, name="outer_loop")],
                              "if_in_loop", [_vi("M", T.INT64, []), _vi("x", F, [1, 16])], [_vi("out", F, [1, 16])]),
                 path)


def loop_in_if(path: Path) -> Path:
    """An If (M > 0) whose then branch is a Loop of M iterations; its else branch a Neg."""
    then_g = h.make_graph([h.make_node("Loop", ["M", "c", "x"], ["then_out"], body=_cheap_body("inner"),
                                       name="inner_loop")], "then", [], [_vi("then_out", F, [1, 16])])
    else_g = h.make_graph([h.make_node("Neg", ["x"], ["else_out"], name="else_neg")], "else", [],
                          [_vi("else_out", F, [1, 16])])
    return _save(h.make_graph(
        [_true(), h.make_node("Greater", ["M", "zero"], ["p"], name="gt"),
         h.make_node("If", ["p"], ["out"], then_branch=then_g, else_branch=else_g, name="outer_if")],
        "loop_in_if", [_vi("M", T.INT64, []), _vi("x", F, [1, 16])], [_vi("out", F, [1, 16])],
        [h.make_tensor("zero", T.INT64, [], [0])]), path)


def scan_cumsum(path: Path) -> Path:
    """A Scan: the cumulative sum of a [200, 16] input over its 200 rows."""
    body = h.make_graph([h.make_node("Add", ["acc_in", "xs"], ["acc_out"], name="s_add"),
                         h.make_node("Identity", ["acc_out"], ["ys"], name="s_id")], "sbody",
                        [_vi("acc_in", F, [16]), _vi("xs", F, [16])], [_vi("acc_out", F, [16]), _vi("ys", F, [16])])
    return _save(h.make_graph(
        [h.make_node("Scan", ["init", "x"], ["final", "cum"], body=body, num_scan_inputs=1, name="cumsum")],
        "scan", [_vi("x", F, [200, 16])], [_vi("final", F, [16]), _vi("cum", F, [200, 16])],
        [h.make_tensor("init", F, [16], [0.0] * 16)]), path)


def plain_loop(path: Path) -> Path:
    return _save(h.make_graph([_true(), h.make_node("Loop", ["M", "c", "x"], ["out"], body=_cheap_body("b"),
                                                    name="loop")],
                              "loop", [_vi("M", T.INT64, []), _vi("x", F, [1, 16])], [_vi("out", F, [1, 16])]), path)


def heavy_loop(path: Path) -> Path:
    """A Loop whose body is a [64, 512] x [512, 512] MatMul and a Tanh: real work the correction must keep."""
    w = (np.random.RandomState(0).randn(512, 512) / 30).astype(np.float32)
    body = h.make_graph(
        [h.make_node("Identity", ["cond_in"], ["cond_out"], name="h_id"),
         h.make_node("MatMul", ["x_in", "W"], ["y"], name="h_mm"),
         h.make_node("Tanh", ["y"], ["x_out"], name="h_tanh")],
        "hbody", [_vi("i", T.INT64, []), _vi("cond_in", T.BOOL, []), _vi("x_in", F, [64, 512])],
        [_vi("cond_out", T.BOOL, []), _vi("x_out", F, [64, 512])], [numpy_helper.from_array(w, "W")])
    return _save(h.make_graph([_true(), h.make_node("Loop", ["M", "c", "x"], ["out"], body=body, name="heavy_loop")],
                              "heavy", [_vi("M", T.INT64, []), _vi("x", F, [64, 512])], [_vi("out", F, [64, 512])]),
                 path)


def two_loops(path: Path) -> Path:
    return _save(h.make_graph(
        [_true(), h.make_node("Loop", ["M", "c", "x"], ["a"], body=_cheap_body("la"), name="loop_a"),
         h.make_node("Loop", ["M", "c", "x"], ["b"], body=_cheap_body("lb"), name="loop_b"),
         h.make_node("Add", ["a", "b"], ["out"], name="sum")],
        "two_loops", [_vi("M", T.INT64, []), _vi("x", F, [1, 16])], [_vi("out", F, [1, 16])]), path)


def _floats(x, where="$"):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _floats(v, f"{where}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _floats(v, f"{where}[{i}]")
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield where, float(x)


def _sane(p: dict) -> None:
    """No negative or NaN figure anywhere; the rows add up to the total; a corrected row is never over its raw."""
    bad = [(k, v) for k, v in _floats(p) if math.isnan(v) or math.isinf(v) or v < 0]
    assert not bad, bad
    assert sum(n["ms"] for n in p["nodes"]) == pytest.approx(p["total_ms"], rel=1e-9, abs=1e-12)
    assert all(n["ms"] <= n["raw_ms"] + 1e-12 for n in p["nodes"]), p["nodes"]
    assert len({n["node"] for n in p["nodes"]}) == len(p["nodes"])


# ---------------------------------------------------------------- self_times on synthetic events

def _k(name, ts, dur, op="Add"):
    return {"name": f"{name}_kernel_time", "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": {"op_name": op}}


def _x(ts, dur):
    return {"name": "SequentialExecutor::Execute", "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": {},
            "executor": True}


def test_self_times_count_a_subgraph_run_as_one_more_event_written_inside_the_node():
    """An If span of 15 us: its branch's executor event (28-37) holds one Add (28-33): two events recorded inside
    the If (the Add's and the executor's), so two calibrated gaps come off it, not one."""
    from optkit.measure.profile import self_times

    events = [_x(0, 60), _k("body_if", 26, 15, "If"), _x(28, 9), _k("t_add", 28, 5)]
    out = {e["name"]: (own, gaps) for e, own, gaps in self_times(events, gap_us=2.5)}
    assert set(out) == {"body_if_kernel_time", "t_add_kernel_time"}  # executor events are no rows
    assert out["body_if_kernel_time"] == (10.0, 5.0)
    assert out["t_add_kernel_time"] == (5.0, 0.0)
    # an If whose branch runs no kernel at all (its output an outer value): still the executor's event
    (_, own, gaps), = self_times([_k("if", 0, 6, "If"), _x(1, 2)], gap_us=2.5)
    assert (own, gaps) == (6.0, 2.5)
    # without executor events (another onnxruntime): as before, one gap per kernel run inside
    (_, own, gaps), _ = self_times([_k("if", 26, 15, "If"), _k("t_add", 28, 5)], gap_us=2.5)
    assert (own, gaps) == (10.0, 2.5)


def test_self_times_of_nested_control_flow_count_each_event_once():
    """A Loop of 2 iterations (each an executor event holding 2 kernels, 3 us apart) inside an If's branch: the
    Loop takes off its 4 kernels and its 2 executor events; the If only the Loop and its own branch's executor,
    never the Loop's inner events; an executor tied with a kernel at the same start and length is the outer one
    (a graph's run holds its nodes: a one-node graph's call gives no gap to its node)."""
    from optkit.measure.profile import self_times

    events = [_k("if", 0, 60, "If"), _x(2, 55), _k("loop", 3, 50, "Loop"),
              _x(5, 20), _k("a0", 5, 4), _k("b0", 12, 4),
              _x(28, 20), _k("a1", 28, 4), _k("b1", 35, 4)]
    out = {e["name"][: -len("_kernel_time")]: (own, gaps) for e, own, gaps in self_times(events, gap_us=2.0)}
    assert out["loop"] == (50.0 - 16, (4 + 2) * 3.0)   # median gap between its kernels: 3 us
    assert out["if"] == (60.0 - 50, (1 + 1) * 2.0)     # one kernel (the Loop) inside: the calibrated gap
    assert all(out[k] == (4.0, 0.0) for k in ("a0", "b0", "a1", "b1"))
    (_, own, gaps), = self_times([_k("loop", 0, 10, "Loop"), _x(0, 10)], gap_us=2.0)
    assert (own, gaps) == (10.0, 0.0)


def test_iter_calls_carry_executor_events_and_summarize_makes_no_row_of_them():
    from optkit.measure.profile import summarize

    events = []
    for c in range(4):
        t0 = 1000 * c
        events += [{"cat": "Session", "name": "SequentialExecutor::Execute", "ts": t0, "dur": 60, "ph": "X"},
                   {"cat": "Node", "name": "if_kernel_time", "ts": t0 + 26, "dur": 15, "ph": "X",
                    "args": {"op_name": "If", "provider": "CPUExecutionProvider"}},
                   {"cat": "Session", "name": "SequentialExecutor::Execute", "ts": t0 + 28, "dur": 9, "ph": "X"},
                   {"cat": "Node", "name": "add_kernel_time", "ts": t0 + 28, "dur": 5, "ph": "X",
                    "args": {"op_name": "Add", "provider": "CPUExecutionProvider"}},
                   {"cat": "Session", "name": "model_run", "ts": t0, "dur": 61, "ph": "X"}]
    s = summarize(events, skip=1, overhead_us=1.0, gap_us=2.5)
    assert [n["node"] for n in s["nodes"]] == ["if", "add"] and s["node_count"] == 2
    ifn = next(n for n in s["nodes"] if n["node"] == "if")
    assert ifn["raw_ms"] == pytest.approx(10e-3) and ifn["ms"] == pytest.approx((10 - 5 - 1) * 1e-3)


# ---------------------------------------------------------------- real profiles

def _feeds(**kw):
    return {k: (np.array(v, np.int64) if isinstance(v, int) else v) for k, v in kw.items()}


def test_a_real_profile_nests_each_branch_run_inside_its_if():
    """In onnxruntime's own profile of an If in a Loop, every If event holds exactly one branch run (an executor
    event) and 1 or 2 kernels: self_times takes 2 or 3 gaps off it; the Loop one per kernel and iteration."""
    import onnxruntime as ort

    from optkit.measure.profile import iter_calls, iter_events, self_times

    with tempfile.TemporaryDirectory() as tmp:
        model = if_in_loop(Path(tmp) / "m.onnx")
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "p")
        sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
        for _ in range(3):
            sess.run(None, _feeds(M=10, x=np.zeros((1, 16), np.float32)))
        calls = [k for call, k, _ in iter_calls((e, None) for e, _ in iter_events(sess.end_profiling())) if call]
    assert len(calls) == 3
    kernels = calls[-1]
    if not any(k.get("executor") for k in kernels):
        pytest.skip("this onnxruntime records no executor events")
    rows = self_times(kernels, gap_us=1.0)
    assert len(rows) == sum(1 for k in kernels if not k.get("executor"))
    ifs = [(own, gaps) for e, own, gaps in rows if e["args"]["op_name"] == "If"]
    loops = [(own, gaps) for e, own, gaps in rows if e["args"]["op_name"] == "Loop"]
    assert len(ifs) == 10 and len(loops) == 1
    inner = [e for e, _, _ in rows if e["args"]["op_name"] != "Loop"]
    assert loops[0][1] > 0 and len(inner) == 10 * 4 + 15  # Identity, Mod, Equal, If; 5 x Add, 5 x (Sub, Relu)
    # every If: a gap for each of its 1 or 2 kernels and one for its branch run (a median gap or the calibrated 1 us)
    for own, gaps in ifs:
        assert own >= 0 and gaps >= 0
    assert sum(1 for _, gaps in ifs if gaps == 2.0) == 5  # then branch: one Add + one executor event, 1 us each


@pytest.mark.parametrize("build, values, feeds_extra", [
    (loop_in_if, {"M": 100}, {}), (loop_in_if, {"M": 0}, {}), (if_in_loop, {"M": 100}, {}), (scan_cumsum, {}, {}),
    (plain_loop, {"M": 0}, {}), (plain_loop, {"M": 1}, {}), (two_loops, {"M": 50}, {}), (heavy_loop, {"M": 3}, {})],
    ids=["loop-in-if", "loop-in-if-else", "if-in-loop", "scan200", "loop0", "loop1", "two-loops", "heavy-loop"])
def test_profile_of_control_flow_is_sane(tmp_path, build, values, feeds_extra):
    """Structure, no timing verdict: every figure finite and >= 0, rows add up, each node once, the control-flow
    nodes shown with their subgraphs' kernels beside them, not inside."""
    from optkit.core.artifact import Artifact
    from optkit.measure.profile import profile_onnx

    model = build(tmp_path / "m.onnx")
    p = profile_onnx(Artifact.load(model), runs=10, warmup=3, values=values)
    json.dumps(p, allow_nan=False)
    _sane(p)
    names = {n["node"] for n in p["nodes"]}
    if build is loop_in_if and values["M"] == 0:
        assert names == {"gt", "outer_if", "else_neg"}
    elif build is plain_loop and values["M"] == 0:
        assert names == {"loop"}
    elif build is two_loops:
        assert {"loop_a", "loop_b", "la_add", "lb_add", "sum"} <= names
    elif build is heavy_loop:
        # the MatMuls are real work: the correction leaves them, so the rows hold most of a call
        mm = next(n for n in p["nodes"] if n["node"] == "h_mm")
        assert mm["ms"] >= 0.5 * mm["raw_ms"] and p["total_ms"] >= 0.3 * p["p50_ms"], p


def test_an_if_in_a_loop_is_not_shown_at_most_of_the_call(cli, tmp_path):
    """Before: the If (holding one Add or a Sub and a Relu) of a 100-iteration Loop read 0.16-0.22 ms in a call of
    p50 0.25 ms, 0.6-0.9x the whole call (its branches' executor events left in it), so it always read more than the
    Add, Sub and Relu of its branches; now it reads about half of them. Both figures come from the same profiled
    calls, so a busy machine that preempts some (a CI run saw the If at 3.6x a plain call's p50) slows both; the
    verdict is the best of three profiles."""
    model = if_in_loop(tmp_path / "if_in_loop.onnx")
    ratios = []
    for _ in range(3):
        r = cli("profile", model, "--value", "M=100", "--runs", "50", "--json")
        assert r.rc == 0, r.err
        p = json.loads(r.out)
        _sane(p)
        ms = {n["op"]: n["ms"] for n in p["nodes"]}
        ratios.append(ms["If"] / (ms["Add"] + ms["Sub"] + ms["Relu"]))
        if ratios[-1] < 0.8:
            break
    assert min(ratios) < 0.8, ratios
