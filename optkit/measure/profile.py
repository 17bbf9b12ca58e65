"""Where the time goes: onnxruntime's profiler over repeated runs, as per-node and per-op-type tables; and
TensorFlow's profiler (a TensorBoard profile log) for Keras and SavedModel sources.

onnxruntime's profile is a Chrome trace (it opens in Perfetto or chrome://tracing). Each "Node" event whose
name ends in `_kernel_time` is one kernel run and each "model_run" event one call. The warm-up calls are
dropped; of the profiled calls, the middle half by kernel time (the calls between its 25th and 75th
percentile) is averaged, so a node's time is what it takes in a typical call and the rows add up to one
typical call's kernel time: p50 latency less what the session spends between kernels. The p50 of a plain
(unprofiled) session with the same threads and feeds is measured beside it, so the two can be compared.

The profiler's own cost: it adds a fixed 1-4 us to every kernel's recorded duration (more with an intra-op
thread pool), which on a model of microsecond kernels is most of the figure. It is measured on the machine at
hand, in the same process with the same session options (calibrate_overhead: a chain of cheap Relus timed
plain and profiled), and taken off each kernel event (floored at 0); the raw figures are kept beside the
corrected ones (`raw_ms`, `total_raw_ms`, `profiler_overhead_us_per_kernel`). Inside an If, Loop or Scan node
the profiler also spends a few us between the subgraph's kernels (writing each event), which would count as
the node's own time: that is taken off it too, per kernel run and per subgraph run inside (each run of an If's
branch, a Loop's or a Scan's body records an executor event; self_times; `profiler_gap_us_per_kernel` is the
calibrated figure, used for a node that holds a single kernel run).

Bounds: onnxruntime keeps every event in memory until the profile ends and writes about 600 bytes of JSON per
kernel run, so a profiled session records at most EVENT_BUDGET kernel runs (the graph's nodes x its calls,
warm-up included): a large graph gets fewer calls (plan_calls; the result's `notes` say so), and one too large
for even two calls is refused. The profile file is read one event at a time (iter_events) and summarized call
by call, never loaded whole; the Chrome trace (`--trace`) holds whole profiled calls, as many as fit in
TRACE_CAP_BYTES.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from optkit.core import strictjson
from optkit.core.artifact import Artifact
from optkit.core.atomic import atomic_path
from optkit.core.batching import first_call
from optkit.core.errors import UsageError
from optkit.measure.inputs import probe, synthesize
from optkit.measure.latency import measure_latency
from optkit.onnx.graph import all_nodes
from optkit.onnx.io import load
from optkit.onnx.session import ort_session
from optkit.runtimes.base import open_session
from optkit.runtimes.tf import import_tf

KERNEL = "_kernel_time"
MAX_RUNS = 100_000
CLOSE = 0.10   # the per-op total should be within this share of the p50
CAL_NODES = 64      # the calibration chain: this many Relus on a [1, 16] tensor
CAL_REPEATS = 5     # calibrations, of which the median is taken
CAL_CALLS = 200     # timed plain calls per calibration (and profiled calls: half of it)
_OVERHEAD: dict[Any, dict[str, float]] = {}   # per process: calibrate_overhead's figures by session options
EVENT_BUDGET = 200_000     # kernel runs (nodes x calls, warm-up included) one profiled session may record
ORT_EVENT_LIMIT = 1_000_000  # onnxruntime's profiler drops every event past this many
TRACE_CAP_BYTES = 100 * 2**20  # the Chrome trace holds whole profiled calls up to this size
CHUNK = 1 << 20            # bytes read at a time from a profile file

# op types whose presence in a quantized model means part of it still runs in float
FLOAT_COMPUTE = ("Conv", "MatMul", "Gemm", "ConvTranspose", "FusedConv", "FusedMatMul", "FusedGemm", "Attention",
                 "MultiHeadAttention", "LSTM", "GRU", "RNN", "Einsum")
QUANTIZED = ("QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul", "QGemm",
             "MatMulIntegerToFloat", "MatMulNBits", "QAttention", "QuantizeLinear", "DequantizeLinear",
             "DynamicQuantizeLinear")


def feeds_for(session, shapes: dict | None, values: dict | None, data=None, seed: int = 0) -> dict:
    """One call's feeds: the first sample of `data` (a Dataset), else synthesized with probed dims."""
    if data is not None:
        return first_call(session.inputs, data.bind(session.inputs), 1)
    shapes, _ = probe(session.inputs, session.run, shapes, values, seed)
    return synthesize(session.inputs, shapes, 1, seed, values)


def profile_onnx(artifact: Artifact, *, runs: int = 50, warmup: int = 10, threads: int | None = None,
                 shapes: dict | None = None, values: dict | None = None, data=None,
                 trace: str | Path | None = None, seed: int = 0) -> dict[str, Any]:
    """Profile `runs` calls of an ONNX model on onnxruntime's CPU provider (fewer on a large graph: plan_calls);
    returns the per-node and per-op figures (summarize) with the p50 of a plain session. With `trace`, the
    Chrome trace is written there (at most TRACE_CAP_BYTES: whole calls, the first that fit)."""

    if not 1 <= runs <= MAX_RUNS:
        raise UsageError(f"--runs {runs} is out of range: give 1 to {MAX_RUNS:,}")
    warm, calls, notes = plan_calls(node_count(artifact.path), warmup, runs, artifact.path)  # before any session
    plain = open_session(artifact, provider="cpu", threads=threads)
    feeds = feeds_for(plain, shapes, values, data, seed)
    plain.check_feeds(feeds)
    latency = measure_latency(plain, feeds, warmup=warmup, runs=max(calls, 20))
    plain.close()
    calibration = calibrate_overhead(threads)
    work = Path(tempfile.mkdtemp(prefix="optkit-profile-"))
    try:
        sess = ort_session(artifact.path, threads=threads, profile_prefix=work / "profile")
        for _ in range(warm + calls):
            sess.run(None, feeds)
        path = Path(sess.end_profiling())
        del sess
        if trace is None:
            result = summarize_stream(((e, None) for e, _ in iter_events(path)), skip=warm,
                                      overhead_us=calibration["overhead_us"], gap_us=calibration["gap_us"])
        else:
            with atomic_path(trace) as tmp, open(tmp, "w", encoding="utf-8") as out:
                writer = TraceWriter(out, skip=warm)
                result = summarize_stream(iter_events(path), skip=warm, overhead_us=calibration["overhead_us"],
                                          gap_us=calibration["gap_us"], on_call=writer.add)
                writer.close()
            notes += writer.notes(result["runs"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.update(close_to_p50(result["total_ms"], latency["p50_ms"]), threads=threads, trace=None,
                  raw_vs_p50=result["total_raw_ms"] / latency["p50_ms"] if latency["p50_ms"] > 0 else float("nan"),
                  call_overhead_us=calibration["call_us"], runs_asked=runs, warmup=warm, notes=notes)
    if trace is not None:
        result["trace"] = str(trace)
        result["trace_calls"] = writer.calls
    return result


def node_count(path: str | Path) -> int:
    """The nodes of an ONNX model, those of its subgraphs (If, Loop, Scan bodies) counted once; 0 for a file
    that does not load (the session that follows says what is wrong with it)."""
    try:
        model = load(path, external_data=False)
    except UsageError:
        return 0
    return sum(1 for _ in all_nodes(model.graph))


def plan_calls(nodes: int, warmup: int, runs: int, name: str | Path = "the model") -> tuple[int, int, list[str]]:
    """(warm-up calls, profiled calls, notes): `warmup` and `runs` when nodes x calls fits EVENT_BUDGET, else
    as many calls as fit (at least one warm-up and one profiled call, a fifth of them warm-up); a graph too large
    for two calls within onnxruntime's own event limit is a UsageError."""
    nodes = max(nodes, 1)
    if nodes * (warmup + runs) <= EVENT_BUDGET:
        return warmup, runs, []
    if nodes * 2 > ORT_EVENT_LIMIT:
        raise UsageError(f"{name} has {nodes:,} nodes: onnxruntime's profiler records at most "
                         f"{ORT_EVENT_LIMIT:,} events, too few for a warm-up and a profiled call; profile a part "
                         "of it (onnx.utils.extract_model) or time it whole with optkit bench")
    total = max(EVENT_BUDGET // nodes, 2)
    warm = max(1, min(warmup, total // 5))
    calls = max(1, min(runs, total - warm))
    return warm, calls, [f"{nodes:,} nodes: {calls} calls profiled (of --runs {runs}) after {warm} warm-up, so the "
                         f"profile stays under {EVENT_BUDGET:,} kernel runs (nodes x calls)"]


def iter_events(path: str | Path) -> Iterator[tuple[dict, str]]:
    """The events of a profile file (a JSON array, as onnxruntime writes it) one at a time, each with its JSON
    text; the file is read CHUNK bytes at a time, never whole."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf, pos, eof = "", 0, False
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,[":
                pos += 1
            if pos >= len(buf):
                if eof:
                    return
                buf, pos = f.read(CHUNK), 0
                eof = not buf
                continue
            if buf[pos] == "]":
                return
            try:
                event, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    raise
                more = f.read(CHUNK)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            if isinstance(event, dict):
                yield event, buf[pos:end]
            pos = end


def _is_kernel(e: dict) -> bool:
    return e.get("cat") == "Node" and str(e.get("name", "")).endswith(KERNEL)


def _is_call(e: dict) -> bool:
    return e.get("cat") == "Session" and e.get("name") == "model_run"


def _is_executor(e: dict) -> bool:
    """A graph's run by an executor ("SequentialExecutor::Execute"): one per call, and one per run of a subgraph
    (an If's branch, a Loop's or Scan's iteration)."""
    return e.get("cat") == "Session" and "Executor" in str(e.get("name", ""))


def _slim(e: dict) -> dict:
    """A kernel (or executor) event with only what summarize uses (onnxruntime's args hold a dozen memory
    figures); an executor event is marked `executor`."""
    args = e.get("args") or {}
    slim = {"name": e.get("name", ""), "ts": e["ts"], "dur": e.get("dur", 0), "pid": e.get("pid"),
              "tid": e.get("tid"), "args": {k: args[k] for k in ("op_name", "provider", "node_index") if k in args}}
    if _is_executor(e):
        slim["executor"] = True
    return slim


def iter_calls(events: Iterable[tuple[dict, str | None]]) -> Iterator[tuple[dict | None, list[dict], list]]:
    """(the call's model_run event, its kernel events and executor events (marked `executor`: self_times counts
    them), (setup, text) of every event since the previous call), call by call in the order onnxruntime wrote
    them: a call's kernels come before its model_run event, which carries its start and duration; `setup` is
    true for a session-level event outside any call (loading, initialization). A kernel outside every call
    (before its start, or after its end) is dropped; events after the last call come last with no call."""
    pending: list[dict] = []
    texts: list[tuple[bool, str]] = []
    for e, text in events:
        if text is not None:
            name = str(e.get("name", ""))
            texts.append((e.get("cat") == "Session" and name != "model_run" and "Executor" not in name, text))
        if _is_kernel(e) or (_is_executor(e) and "ts" in e):
            pending.append(_slim(e))
        elif _is_call(e):
            start, end = e["ts"], e["ts"] + e.get("dur", 0)
            mine = [k for k in pending if start <= k["ts"] <= end + 1]  # 1 us: rounding
            pending = [k for k in pending if k["ts"] > end + 1]
            yield e, mine, texts
            texts = []
    if texts:
        yield None, [], texts


class TraceWriter:
    """Writes a Chrome trace ({"traceEvents": [...]}) call by call: the events outside calls, and the calls
    after the first `skip` (the warm-up) as long as the file stays within `cap` bytes."""

    def __init__(self, out, skip: int = 0, cap: int = TRACE_CAP_BYTES):
        self.out, self.skip, self.cap = out, skip, cap
        self.seen = self.calls = 0
        self.full = False
        self.first = True
        self.size = self._write('{"traceEvents": [\n')
        self.tail = len('\n], "displayTimeUnit": "ms"}\n') + 200  # the closing text, with room for otherData

    def _write(self, text: str) -> int:
        self.out.write(text)
        return len(text.encode("utf-8"))

    def _events(self, texts: list[tuple[bool, str]]) -> None:
        for _, text in texts:
            self.size += self._write(("" if self.first else ",\n") + text)
            self.first = False

    def add(self, call: dict | None, kernels: list[dict], texts: list[tuple[bool, str]]) -> None:
        if call is None:  # events after the last call (none, as onnxruntime writes them): kept if they fit
            self._events([t for t in texts if t[0] and self.size + len(t[1]) + 2 + self.tail <= self.cap])
            return
        index, self.seen = self.seen, self.seen + 1
        if index < self.skip:  # a warm-up call: only the session-level events (loading, initialization)
            self._events([t for t in texts if t[0]])
            return
        need = sum(len(t.encode("utf-8")) + 2 for _, t in texts)
        if self.full or self.size + need + self.tail > self.cap:
            self.full = True
            return
        self._events(texts)
        self.calls += 1

    def close(self) -> None:
        other = strictjson.dumps({"optkit": f"{self.calls} profiled calls of {self.seen - self.skip}"})
        self._write(f'\n], "displayTimeUnit": "ms", "otherData": {other}}}\n')

    def notes(self, profiled: int) -> list[str]:
        if self.calls >= profiled:
            return []
        return [f"the Chrome trace holds the first {self.calls} of the {profiled} profiled calls: it is capped at "
                f"{self.cap / 2**20:.0f} MB"]


def close_to_p50(total_ms: float, p50_ms: float) -> dict[str, Any]:
    ratio = total_ms / p50_ms if p50_ms > 0 else float("nan")
    return {"p50_ms": p50_ms, "total_vs_p50": ratio, "within_10pct": bool(abs(ratio - 1) <= CLOSE)}


def _relu_chain(nodes: int) -> bytes:
    """A model of `nodes` Relus in a chain on a [1, 16] float tensor (opset 13), serialized."""
    from onnx import TensorProto, helper

    chain = [helper.make_node("Relu", ["x" if i == 0 else f"h{i}"], [f"h{i + 1}"], name=f"relu{i}")
             for i in range(nodes)]
    graph = helper.make_graph(chain, "profiler_calibration", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info(f"h{nodes}", TensorProto.FLOAT, [1, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def _plain_p50_us(sess, feeds: dict, calls: int) -> float:
    run = sess.run
    for _ in range(calls // 10):
        run(None, feeds)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        run(None, feeds)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def calibrate_overhead(threads: int | None = None) -> dict[str, float]:
    """What onnxruntime's profiler adds to each kernel's recorded duration here, in us, with the session
    options a profile of `threads` uses: a chain of CAL_NODES Relus is timed plain (the p50 per call, less that
    of a one-Relu chain, per node: the cost of a node in an unprofiled run, its share of the executor's work
    between kernels included) and profiled (the mean recorded kernel duration, over the middle half of the
    calls); the overhead is the difference, floored at 0, the median of CAL_REPEATS tries. `gap_us` is what a
    profiled call spends per kernel outside the kernels' recorded durations (the profiler recording each event,
    the executor between kernels): inside a control-flow node it is part of that node's span (self_times).
    `call_us` is what a plain call of a one-node model costs (session.run from Python, the feeds bound, the
    output allocated), which no kernel event holds. Cached per process."""

    key = threads or 0
    if key in _OVERHEAD:
        return _OVERHEAD[key]
    feeds = {"x": np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16)}
    long_chain, one = _relu_chain(CAL_NODES), _relu_chain(1)
    overheads, profiled, plain, calls, gaps = [], [], [], [], []
    work = Path(tempfile.mkdtemp(prefix="optkit-profile-cal-"))
    try:
        for i in range(CAL_REPEATS):
            sessions = [ort_session(m, threads=threads) for m in (long_chain, one)]
            p_long, p_one = (_plain_p50_us(s, feeds, CAL_CALLS) for s in sessions)
            sess = ort_session(long_chain, threads=threads, profile_prefix=work / f"cal{i}")
            warm = 5
            for _ in range(warm + CAL_CALLS // 2):
                sess.run(None, feeds)
            path = Path(sess.end_profiling())
            del sess
            # each call's span and its kernels' durations
            recorded = [(float(call.get("dur", 0)),
                         [float(k.get("dur", 0)) for k in kernels if not k.get("executor")])
                        for call, kernels, _ in iter_calls((e, None) for e, _ in iter_events(path)) if call][warm:]
            durs = [d for _, d in recorded if d]
            nodes = float(np.median([len(d) for d in durs])) if durs else 0  # CAL_NODES unless a pass fused some
            if nodes < 2:
                continue
            # a call's mean kernel duration; of the calls, the middle half (a loaded machine preempts some)
            means = np.array([np.mean(d) for d in durs])
            lo, hi = np.percentile(means, [25, 75])
            middle = (means >= lo) & (means <= hi)
            per_node = max(p_long - p_one, 0.0) / (nodes - 1)
            profiled.append(float(means[middle].mean()))
            plain.append(per_node)
            overheads.append(max(profiled[-1] - per_node, 0.0))
            calls.append(max(p_one - per_node, 0.0))
            # the call's time outside its kernels' recorded durations, per kernel: mostly the profiler writing
            # each event (in the top graph no node holds it; in a subgraph it lands in the If/Loop/Scan node)
            gaps.append(max(float(np.median([(span - sum(d)) / len(d) for span, d in recorded if d])), 0.0))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not overheads:  # nothing to measure with: no correction
        return {"overhead_us": 0.0, "gap_us": 0.0, "profiled_us": 0.0, "plain_us": 0.0, "call_us": 0.0}
    _OVERHEAD[key] = {"overhead_us": float(np.median(overheads)), "gap_us": float(np.median(gaps)) if gaps else 0.0,
                      "profiled_us": float(np.median(profiled)), "plain_us": float(np.median(plain)),
                      "call_us": float(np.median(calls))}
    return _OVERHEAD[key]


def summarize(events: list[dict], skip: int = 0, overhead_us: float = 0.0, gap_us: float = 0.0) -> dict[str, Any]:
    """summarize_stream of events in memory (in the order onnxruntime writes them)."""
    return summarize_stream(((e, None) for e in events), skip=skip, overhead_us=overhead_us, gap_us=gap_us)


def summarize_stream(events: Iterable[tuple[dict, str | None]], skip: int = 0, overhead_us: float = 0.0,
                     on_call=None, gap_us: float = 0.0) -> dict[str, Any]:
    """Per-node and per-op-type times (ms per call, share of the total) from onnxruntime's profile events
    ((event, text) pairs, iter_events), the first `skip` calls left out (unless there are no more), `overhead_us`
    (the profiler's own cost per kernel, calibrate_overhead) taken off each kernel event and `gap_us` (its cost
    between kernels) off a control-flow node once per kernel run inside it, floored at 0; `raw_ms` and
    `total_raw_ms` are the figures as recorded. Read call by call: what is held is one call's events and a
    figure per node and call. `on_call(call, kernels, texts)` sees every call (iter_calls)."""
    starts: list[float] = []
    durs: list[float] = []
    rows: dict[str, int] = {}
    info: list[dict] = []
    cols: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # per call: node rows, corrected, raw (us)
    for call, kernels, texts in iter_calls(events):
        if on_call is not None:
            on_call(call, kernels, texts)
        if call is None:
            continue
        corrected: dict[int, float] = defaultdict(float)
        raw: dict[int, float] = defaultdict(float)
        for e, own, gaps in self_times(kernels, gap_us):
            args = e.get("args") or {}
            op = args.get("op_name", "?")
            name = e["name"][: -len(KERNEL)] or f"{op}#{args.get('node_index', '?')}"
            row = rows.get(name)
            if row is None:
                row = rows[name] = len(info)
                info.append({"node": name, "op": op,
                             "provider": args.get("provider", "").replace("ExecutionProvider", "")})
            corrected[row] += max(own - gaps - overhead_us, 0.0)
            raw[row] += own
        starts.append(call["ts"])
        durs.append(float(call.get("dur", 0)))
        keys = np.fromiter(raw.keys(), dtype=np.int64, count=len(raw))
        cols.append((keys, np.fromiter((corrected[k] for k in raw), dtype=np.float64, count=len(raw)),
                     np.fromiter(raw.values(), dtype=np.float64, count=len(raw))))
    order = np.argsort(starts, kind="stable")  # by start, as onnxruntime ran them
    keep = order[skip:] if len(order) > skip else order
    if not info or not len(keep):
        return {"runs": len(keep), "total_ms": 0.0, "total_raw_ms": 0.0, "profiler_overhead_us_per_kernel":
                overhead_us, "profiler_gap_us_per_kernel": gap_us, "run_ms": 0.0, "node_count": 0, "nodes": [],
                "ops": []}
    per_call = np.zeros((len(info), len(keep)))
    raw_call = np.zeros((len(info), len(keep)))
    seen = np.zeros(len(info), dtype=bool)  # a node that ran only in the warm-up is left out
    for j, c in enumerate(keep):
        keys, corrected_us, raw_us = cols[c]
        per_call[keys, j] = corrected_us
        raw_call[keys, j] = raw_us
        seen[keys] = True
    totals = raw_call.sum(axis=0)
    lo, hi = np.percentile(totals, [25, 75])
    typical = (totals >= lo) & (totals <= hi)
    nodes = [{**info[r], "ms": float(per_call[r, typical].mean()) / 1e3, "raw_ms": float(raw_call[r, typical].mean()) / 1e3}
             for r in range(len(info)) if seen[r]]
    total = sum(n["ms"] for n in nodes)
    for n in nodes:
        n["share"] = n["ms"] / total if total else 0.0
    nodes.sort(key=lambda n: -n["ms"])
    per_op: dict[str, list] = defaultdict(lambda: [0.0, 0, 0.0])
    for n in nodes:
        per_op[n["op"]][0] += n["ms"]
        per_op[n["op"]][1] += 1
        per_op[n["op"]][2] += n["raw_ms"]
    ops = [{"op": op, "ms": ms, "share": ms / total if total else 0.0, "nodes": count, "raw_ms": raw}
           for op, (ms, count, raw) in sorted(per_op.items(), key=lambda x: (-x[1][0], -x[1][2]))]
    run_ms = float(np.median([durs[c] for c in keep])) / 1e3
    return {"runs": len(keep), "total_ms": total, "total_raw_ms": sum(n["raw_ms"] for n in nodes),
            "profiler_overhead_us_per_kernel": overhead_us, "profiler_gap_us_per_kernel": gap_us, "run_ms": run_ms,
            "node_count": len(nodes),
            "nodes": nodes, "ops": ops}


def self_times(kernels: list[dict], gap_us: float = 0.0):
    """(event, its own time in us, the profiler's gaps in it in us) for each kernel event of `kernels` (executor
    events, marked `executor`, are counted, not returned): a control-flow node (If, Loop, Scan) is timed around
    the kernels of its subgraphs, which have events of their own; their time is taken off it so nothing counts
    twice. What the profiler spends recording events inside it (a few us each that no plain run spends) also lies
    in the node's span: one gap per kernel run inside and one per run of a subgraph (each records an executor
    event too), a gap being the median between those kernels in this very call, or `gap_us` (calibrate_overhead)
    where it holds a single kernel run or none. Left in, a Loop of 100 iterations of 3 cheap kernels read 0.6 ms
    in a call whose p50 is 0.08 ms, and an If holding one cheap kernel read 1.7 us where a plain run spends 0.6."""
    own = {id(e): float(e.get("dur", 0)) for e in kernels if not e.get("executor")}
    children: dict[int, list[dict]] = defaultdict(list)
    runs: dict[int, int] = defaultdict(int)  # subgraph runs (executor events) inside a kernel
    stacks: dict = defaultdict(list)  # per thread, the kernels that hold the event at hand
    # by start, the longer first; at a tie an executor event first (a graph's run holds its nodes)
    for e in sorted(kernels, key=lambda e: (e["ts"], -e.get("dur", 0), not e.get("executor"))):
        stack = stacks[(e.get("pid"), e.get("tid"))]
        end = e["ts"] + e.get("dur", 0)
        while stack and stack[-1]["ts"] + stack[-1].get("dur", 0) + 1 < end:  # 1 us: rounding
            stack.pop()
        if e.get("executor"):
            if stack:
                runs[id(stack[-1])] += 1
            continue
        if stack:
            own[id(stack[-1])] -= float(e.get("dur", 0))
            children[id(stack[-1])].append(e)
        stack.append(e)
    gaps = dict.fromkeys(own, 0.0)
    for parent in set(children) | set(runs):
        inner = children[parent]
        between = [b["ts"] - a["ts"] - a.get("dur", 0) for a, b in zip(inner, inner[1:])]
        gap = max(float(np.median(between)), 0.0) if between else gap_us
        gaps[parent] = (len(inner) + runs[parent]) * gap
    return [(e, max(own[id(e)], 0.0), gaps[id(e)]) for e in kernels if not e.get("executor")]


def _stem(name: str) -> str:
    """A node's name without what onnxruntime's fusions and the quantizer add to it, to match two models."""
    name = name.removeprefix("fused ")
    changed = True
    while changed:
        changed = False
        for suffix in ("_nchwc", "_quant", "_MatMul", "_QuantizeLinear"):
            if name.endswith(suffix) and len(name) > len(suffix):
                name, changed = name[: -len(suffix)], True
    return name


def float_nodes(profile: dict[str, Any]) -> list[dict]:
    """The float compute nodes of a model that also runs quantized kernels (empty for a float model)."""
    if not any(n["op"] in QUANTIZED for n in profile["nodes"]):
        return []
    return [{"node": n["node"], "op": n["op"], "ms": n["ms"]} for n in profile["nodes"] if n["op"] in FLOAT_COMPUTE]


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two profiles side by side: per op type, per node matched by name (less the suffixes fusions and the
    quantizer add), and the float compute nodes that still run in whichever model is quantized."""
    ops_a = {o["op"]: o["ms"] for o in a["ops"]}
    ops_b = {o["op"]: o["ms"] for o in b["ops"]}
    ops = [{"op": op, "a_ms": ops_a.get(op, 0.0), "b_ms": ops_b.get(op, 0.0),
            "delta_ms": ops_b.get(op, 0.0) - ops_a.get(op, 0.0)} for op in set(ops_a) | set(ops_b)]
    ops.sort(key=lambda o: (-abs(o["delta_ms"]), o["op"]))
    by_stem: dict[str, dict] = {}
    for n in b["nodes"]:
        by_stem.setdefault(_stem(n["node"]), n)
    matched = []
    for n in a["nodes"]:
        m = by_stem.pop(_stem(n["node"]), None)
        if m is not None:
            matched.append({"a_node": n["node"], "b_node": m["node"], "a_op": n["op"], "b_op": m["op"],
                            "a_ms": n["ms"], "b_ms": m["ms"], "delta_ms": m["ms"] - n["ms"]})
    matched.sort(key=lambda n: -abs(n["delta_ms"]))
    return {"a_total_ms": a["total_ms"], "b_total_ms": b["total_ms"], "ops": ops, "nodes": matched,
            "float_in_a": float_nodes(a), "float_in_b": float_nodes(b)}


def profile_tf(artifact: Artifact, logdir: str | Path, *, runs: int = 20, warmup: int = 5,
               threads: int | None = None, shapes: dict | None = None, values: dict | None = None, data=None,
               seed: int = 0) -> dict[str, Any]:
    """A TensorBoard profile log (tf.profiler) of `runs` calls of a Keras or SavedModel model, in `logdir`
    (created when missing; optkit only adds its run folder). Returns the log folder and the p50 latency."""
    if not 1 <= runs <= MAX_RUNS:
        raise UsageError(f"--runs {runs} is out of range: give 1 to {MAX_RUNS:,}")
    logdir = Path(logdir)
    if logdir.exists() and not logdir.is_dir():
        raise UsageError(f"--logdir {logdir} is a file; give a folder (TensorBoard reads its plugins/profile/)")
    session = open_session(artifact, provider="cpu", threads=threads)
    feeds = feeds_for(session, shapes, values, data, seed)
    session.check_feeds(feeds)
    latency = measure_latency(session, feeds, warmup=warmup, runs=max(runs, 20))
    tf = import_tf()
    logdir.mkdir(parents=True, exist_ok=True)
    before = set(logdir.rglob("*.xplane.pb"))
    tf.profiler.experimental.start(str(logdir))
    try:
        for _ in range(runs):
            session.run(feeds)
    finally:
        tf.profiler.experimental.stop()
    written = sorted(set(logdir.rglob("*.xplane.pb")) - before)
    return {"logdir": str(logdir), "runs": runs, "p50_ms": latency["p50_ms"], "threads": threads,
            "files": [str(p) for p in written]}
