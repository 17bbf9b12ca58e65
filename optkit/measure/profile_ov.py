"""Where an ONNX model's (or an OpenVINO IR's) time goes on OpenVINO: the CPU plugin's per-layer counters
(compiled with PERF_COUNT, read from the infer request's profiling_info after each call), in the same figures as
onnxruntime's profile (measure.profile): per node and per op type, ms per call and share, against a plain session's
p50. Each layer also names the kernel OpenVINO ran (`kernel`: exec_type, e.g. brgconv_avx512_I8 for an int8
convolution), which is how a quantized model is seen to run int8."""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from optkit.core.artifact import Artifact
from optkit.core.errors import UsageError
from optkit.core.formats import Format
from optkit.measure.latency import measure_latency
from optkit.measure.profile import MAX_RUNS, close_to_p50, feeds_for, profile_onnx
from optkit.runtimes.openvino import OpenVINOSession

INT8_KERNEL = ("I8", "U8", "i8", "u8")


def profile_model(artifact: Artifact, runtime: str | None = None, **kwargs) -> dict[str, Any]:
    """The profile of an ONNX model on `runtime` (onnxruntime unless openvino), or of an OpenVINO IR."""
    if runtime == "openvino" or artifact.format == Format.OPENVINO_IR:
        if kwargs.pop("trace", None) is not None:
            raise UsageError("a Chrome trace (--trace) is onnxruntime's profiler's; OpenVINO's per-layer counters "
                             "have no timeline: drop --trace or profile on onnxruntime")
        return profile_openvino(artifact, **kwargs)
    if runtime not in (None, "onnxruntime"):
        raise UsageError(f"--runtime {runtime}: optkit profile runs onnxruntime or openvino")
    return profile_onnx(artifact, **kwargs)


def profile_openvino(artifact: Artifact, *, runs: int = 50, warmup: int = 10, threads: int | None = None,
                     shapes: dict | None = None, values: dict | None = None, data=None, seed: int = 0
                     ) -> dict[str, Any]:
    if not 1 <= runs <= MAX_RUNS:
        raise UsageError(f"--runs {runs} is out of range: give 1 to {MAX_RUNS:,}")
    plain = OpenVINOSession(artifact, threads=threads)
    feeds = feeds_for(plain, shapes, values, data, seed)
    plain.check_feeds(feeds)
    latency = measure_latency(plain, feeds, warmup=warmup, runs=max(runs, 20))
    plain.close()
    sess = OpenVINOSession(artifact, threads=threads, profile=True)
    for _ in range(warmup):
        sess.run(feeds)
    rows: dict[str, dict] = {}
    per_call: list[dict[str, float]] = []
    for _ in range(runs):
        sess.run(feeds)
        call: dict[str, float] = defaultdict(float)
        for p in sess.profiling_info(feeds):
            if str(p.status).endswith("NOT_RUN") or p.node_type in ("Parameter", "Result"):
                continue
            rows.setdefault(p.node_name, {"node": p.node_name, "op": p.node_type, "provider": "openvino",
                                          "kernel": p.exec_type})
            call[p.node_name] += p.real_time.total_seconds() * 1e3
        per_call.append(call)
    sess.close()
    result = summarize_calls(rows, per_call)
    result.update(close_to_p50(result["total_ms"], latency["p50_ms"]), threads=threads, trace=None,
                  raw_vs_p50=result["total_raw_ms"] / latency["p50_ms"] if latency["p50_ms"] > 0 else float("nan"),
                  call_overhead_us=0.0, runs_asked=runs, warmup=warmup, notes=[], runtime=sess.describe())
    return result


def summarize_calls(rows: dict[str, dict], per_call: list[dict[str, float]]) -> dict[str, Any]:
    """measure.profile.summarize_stream's figures from per-layer times per call (the middle half of the calls by
    their total, as there)."""
    names = list(rows)
    table = np.array([[call.get(n, 0.0) for n in names] for call in per_call]) if per_call and names else \
        np.zeros((0, 0))
    empty = {"runs": len(per_call), "total_ms": 0.0, "total_raw_ms": 0.0, "profiler_overhead_us_per_kernel": 0.0,
             "profiler_gap_us_per_kernel": 0.0, "run_ms": 0.0, "node_count": 0, "nodes": [], "ops": [],
             "int8_layers": 0}
    if not table.size:
        return empty
    totals = table.sum(axis=1)
    lo, hi = np.percentile(totals, [25, 75])
    typical = (totals >= lo) & (totals <= hi)
    means = table[typical].mean(axis=0)
    total = float(means.sum())
    nodes = [{**rows[n], "ms": float(m), "raw_ms": float(m), "share": float(m) / total if total else 0.0}
             for n, m in zip(names, means)]
    nodes.sort(key=lambda n: -n["ms"])
    per_op: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for n in nodes:
        per_op[n["op"]][0] += n["ms"]
        per_op[n["op"]][1] += 1
    ops = [{"op": op, "ms": ms, "share": ms / total if total else 0.0, "nodes": count, "raw_ms": ms}
           for op, (ms, count) in sorted(per_op.items(), key=lambda x: -x[1][0])]
    return {**empty, "total_ms": total, "total_raw_ms": total, "run_ms": float(np.median(totals)),
            "node_count": len(nodes), "nodes": nodes, "ops": ops,
            "int8_layers": sum(1 for n in nodes if is_int8(n["kernel"]))}


def kernel_counts(artifact: Artifact, feeds: dict) -> dict[str, int]:
    """One call of `artifact` on OpenVINO with its per-layer counters: {"layers", "int8"}: the layers that ran and
    those that ran an int8 kernel (what a quantized file is checked for)."""
    sess = OpenVINOSession(artifact, threads=1, profile=True)
    try:
        sess.run(feeds)
        ran = [p.exec_type for p in sess.profiling_info(feeds)
               if not str(p.status).endswith("NOT_RUN") and p.node_type not in ("Parameter", "Result")]
    finally:
        sess.close()
    return {"layers": len(ran), "int8": sum(1 for k in ran if is_int8(k))}


def is_int8(kernel: str) -> bool:
    """Whether OpenVINO's exec_type names an int8 kernel (jit_avx512_I8, brgconv_avx512_U8, ...)."""
    return any(kernel.endswith("_" + t) or f"_{t}_" in kernel for t in INT8_KERNEL)
