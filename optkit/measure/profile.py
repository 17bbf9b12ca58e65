"""Where the time goes: onnxruntime's profiler over repeated runs, as per-node and per-op-type tables.

The profiler's JSON is a Chrome trace (it opens in Perfetto or chrome://tracing). Each "Node" event with a
`_kernel_time` name is one kernel run; a node's time is its total over the profiled runs divided by the number
of runs, so the per-op totals add up to one call's kernel time (what p50 latency measures, less the
framework overhead between kernels).
"""
from __future__ import annotations

import json
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from optkit.core.atomic import atomic_path
from optkit.core.errors import UsageError
from optkit.measure.inputs import probe, synthesize
from optkit.onnx.session import input_specs, session_options

KERNEL = "_kernel_time"


def profile_onnx(path: str | Path, *, runs: int = 50, warmup: int = 10, threads: int | None = 1,
                 shapes: dict | None = None, values: dict | None = None, feeds: dict | None = None,
                 trace: str | Path | None = None, seed: int = 0) -> dict[str, Any]:
    """Profile `runs` calls of the model at `path`; returns nodes, op types and the total per call (ms).
    With `trace`, the Chrome trace is written there."""
    import onnxruntime as ort

    if runs < 1:
        raise UsageError(f"--runs {runs} is out of range: give 1 or more")
    work = Path(tempfile.mkdtemp(prefix="optkit-profile-"))
    try:
        plain = ort.InferenceSession(str(path), sess_options=session_options(threads),
                                     providers=["CPUExecutionProvider"])
        specs = input_specs(plain, path)
        if feeds is None:
            names = [o.name for o in plain.get_outputs()]
            shapes, _ = probe(specs, lambda f: plain.run(names, f), shapes, values, seed)
            feeds = synthesize(specs, shapes, 1, seed, values)
        for _ in range(warmup):
            plain.run(None, feeds)
        so = session_options(threads)
        so.enable_profiling = True
        so.profile_file_prefix = str(work / "profile")
        sess = ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
        for _ in range(warmup):
            sess.run(None, feeds)
        sess.end_profiling()  # drops the warm-up events: a new file starts with the next run
        sess = ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
        if trace is not None:
            with atomic_path(trace) as tmp:
                tmp.write_text(json.dumps(events))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return summarize(events, runs)


def summarize(events: list[dict], runs: int) -> dict[str, Any]:
    nodes: dict[str, dict] = {}
    per_op: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith(KERNEL):
            continue
        name = e["name"][: -len(KERNEL)]
        args = e.get("args", {})
        op = args.get("op_name", "?")
        entry = nodes.setdefault(name, {"node": name, "op": op, "provider": args.get("provider", ""), "us": 0.0})
        entry["us"] += float(e.get("dur", 0))
        per_op[op] += float(e.get("dur", 0))
    total = sum(n["us"] for n in nodes.values())
    rows = sorted(nodes.values(), key=lambda n: -n["us"])
    for n in rows:
        n["ms"] = n.pop("us") / runs / 1e3
        n["share"] = n["ms"] * runs * 1e3 / total if total else 0.0
    ops = [{"op": op, "ms": us / runs / 1e3, "share": us / total if total else 0.0,
            "nodes": sum(1 for n in rows if n["op"] == op)} for op, us in sorted(per_op.items(), key=lambda x: -x[1])]
    return {"runs": runs, "total_ms": total / runs / 1e3, "nodes": rows, "ops": ops}


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two profiles side by side: per op type, and per node present in both (matched by name)."""
    ops_a = {o["op"]: o["ms"] for o in a["ops"]}
    ops_b = {o["op"]: o["ms"] for o in b["ops"]}
    ops = [{"op": op, "a_ms": ops_a.get(op, 0.0), "b_ms": ops_b.get(op, 0.0),
            "delta_ms": ops_b.get(op, 0.0) - ops_a.get(op, 0.0)} for op in sorted(set(ops_a) | set(ops_b))]
    ops.sort(key=lambda o: -abs(o["delta_ms"]))
    nodes_b = {n["node"]: n for n in b["nodes"]}
    matched = [{"node": n["node"], "a_op": n["op"], "b_op": nodes_b[n["node"]]["op"], "a_ms": n["ms"],
                "b_ms": nodes_b[n["node"]]["ms"], "delta_ms": nodes_b[n["node"]]["ms"] - n["ms"]}
               for n in a["nodes"] if n["node"] in nodes_b]
    matched.sort(key=lambda n: -abs(n["delta_ms"]))
    return {"a_total_ms": a["total_ms"], "b_total_ms": b["total_ms"], "ops": ops, "nodes": matched,
            "float_in_b": [o for o in ops if o["b_ms"] > 0 and o["op"] in FLOAT_COMPUTE and
                           any(q["b_ms"] > 0 for q in ops if q["op"] in QUANTIZED_COMPUTE)]}


# op types whose presence beside quantized kernels means part of a quantized model still runs in float
FLOAT_COMPUTE = ("Conv", "MatMul", "Gemm", "ConvTranspose", "FusedConv", "FusedMatMul", "FusedGemm")
QUANTIZED_COMPUTE = ("QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul",
                     "QGemm", "MatMulIntegerToFloat")


