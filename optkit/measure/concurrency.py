"""Throughput under load: N requests in flight from N threads, over one shared session or one session each.

onnxruntime (and TFLite, TensorRT) release the GIL while a model runs, so Python threads keep N calls in
flight. Each thread times its own calls; throughput is the samples all threads finished over the wall time, and the
figures carry their 95% bands: the percentiles' from the calls (measure.latency.bands), the throughput's from
the rates of equal spans of the wall time (throughput_band). The same loop times a served model
(measure.remote over runtimes.kserve: one keep-alive connection per request in flight).
"""
from __future__ import annotations

import math
import threading
import time

import numpy as np

from optkit.core.errors import UsageError
from optkit.measure.latency import LIMIT_S, PERCENTILES, bands


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
    """The 95% band of the throughput under load: the wall time cut in `windows` equal spans (fewer when there
    are under 5 calls a span), the samples finished in each as a rate, and the normal interval of their mean,
    which is the throughput itself. [None, None]: too few calls to tell (under 10)."""
    k = min(windows, len(ends_s) // 5)
    if k < 2 or wall <= 0:
        return [None, None]
    span = np.minimum((np.asarray(ends_s) / wall * k).astype(int).clip(0), k - 1)
    rates = np.bincount(span, minlength=k) * batch / (wall / k)
    mean = len(ends_s) * batch / wall   # the rates' mean, computed as the figure is
    half = 1.96 * float(rates.std(ddof=1)) / math.sqrt(k)
    return [max(mean - half, 0.0), mean + half]
