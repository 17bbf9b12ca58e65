"""Throughput under load: N requests in flight from N threads, over one shared session or one session each.

onnxruntime (and TFLite, TensorRT) release the GIL while a model runs, so Python threads keep N calls in
flight. Each thread times its own calls; throughput is the samples all threads finished over the wall time, and the
figures carry their 95% bands: the percentiles' from the calls (measure.latency.bands), the throughput's from
the inverse of the time per sample of equal groups of calls (throughput_band). The same loop times a served model
(measure.remote over runtimes.kserve: one keep-alive connection per request in flight).
"""
from __future__ import annotations

import math
import threading
import time

import numpy as np

from optkit.core.errors import UsageError
from optkit.measure.latency import LIMIT_S, PERCENTILES, bands, t95


def measure_concurrency(sessions: list, feeds: dict[str, np.ndarray], *, concurrency: int, warmup: int = 10,
                        runs: int = 100, duration: float | None = None, batch: int = 1,
                        limit_s: float = LIMIT_S) -> dict:
    """Time `concurrency` threads each calling a session `runs` times (or for `duration` seconds).

    `sessions` holds one session shared by all threads, or one per thread."""
    if concurrency < 1:
        raise UsageError(f"--concurrency {concurrency} is out of range: give 1 or more")
    if len(sessions) not in (1, concurrency):
        raise UsageError(f"{len(sessions)} sessions for {concurrency} threads: give one, or one per thread")
    for s in sessions:
        for _ in range(warmup):
            s.run(feeds)
    times: list[list[float]] = [[] for _ in range(concurrency)]
    ends: list[list[float]] = [[] for _ in range(concurrency)]
    errors: list[BaseException] = []
    start_gate = threading.Barrier(concurrency + 1)
    clock = time.perf_counter

    def worker(i: int) -> None:
        run = sessions[i % len(sessions)].run
        own, done = times[i], ends[i]
        start_gate.wait()
        began = clock()
        try:
            while True:
                t0 = clock()
                run(feeds)
                now = clock()
                own.append(now - t0)
                done.append(now)
                elapsed = now - began
                if (duration is None and len(own) >= runs) or (duration is not None and elapsed >= duration) \
                        or elapsed >= limit_s:
                    return
        except BaseException as e:  # noqa: BLE001 - reported by the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    start_gate.wait()
    wall0 = clock()
    for t in threads:
        t.join()
    wall = clock() - wall0
    if errors:
        raise errors[0]
    ms = np.concatenate([np.asarray(t) for t in times]) * 1e3
    calls = int(ms.size)
    return {"concurrency": concurrency, "sessions": len(sessions), "calls": calls,
            "throughput_per_s": calls * batch / wall if wall > 0 else None,
            "p50_ms": float(np.percentile(ms, 50)), "p90_ms": float(np.percentile(ms, 90)),
            "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean()), "batch": batch,
            "wall_s": wall,
            # the percentiles' 95% bands, from the calls' order statistics as for latency one call at a time
            "ci95": {**{k: v for k, v in bands(ms, batch).items() if k in PERCENTILES},
                     "throughput_per_s": throughput_band(np.concatenate(ends) - wall0, wall, batch)}}


def throughput_band(ends_s: np.ndarray, wall: float, batch: int, windows: int = 10) -> list[float | None]:
    """The 95% band of the throughput under load: the calls, in the order they finished, cut in `windows` groups
    of equal count (fewer when there are under 5 calls a group); each group's time per sample (from the end of
    the group before), the t interval of their mean, and its inverse as a rate, widened to hold the figure. A
    rate's band taken this way never reaches 0 (a stall makes a group slow, not a rate negative); its upper
    end is None when the time's interval reaches 0 (too noisy to bound). [None, None]: too few calls (under 10)."""
    n = len(ends_s)
    k = min(windows, n // 5)
    if k < 2 or wall <= 0:
        return [None, None]
    groups = np.array_split(np.sort(np.asarray(ends_s, dtype=np.float64)), k)
    starts = [0.0] + [float(g[-1]) for g in groups[:-1]]
    per = np.array([(float(g[-1]) - s0) / (len(g) * batch) for g, s0 in zip(groups, starts)])
    mean, half = float(per.mean()), t95(k - 1) * float(per.std(ddof=1)) / math.sqrt(k)
    figure = n * batch / wall
    lo = 1.0 / (mean + half) if mean + half > 0 else None
    hi = 1.0 / (mean - half) if mean > half else None
    return [None if lo is None else min(lo, figure), None if hi is None else max(hi, figure)]
