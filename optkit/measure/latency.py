"""Latency: warm-up, then timed runs (a count or a duration), reported as percentiles."""
from __future__ import annotations

import time

import numpy as np

LIMIT_S = 3600.0   # no latency loop runs longer than this, whatever counts it is given


def measure_latency(session, feeds: dict[str, np.ndarray], *, warmup: int = 10, runs: int | None = 100,
                    duration: float | None = None, batch: int = 1, progress=None,
                    limit_s: float = LIMIT_S) -> dict:
    """Time session.run(feeds). With `duration`, run until that many seconds have passed (at least 5 runs).

    Warm-up and timed runs each stop after `limit_s` seconds whatever the counts ask (`runs` in the result is
    the number timed, and `time_limited` says the limit cut it short)."""
    run = session.run
    device_timer = session.timer()
    clock = time.perf_counter
    start = clock()
    for _ in range(warmup):
        run(feeds)
        if clock() - start >= limit_s:
            break
    times: list[float] = []
    start = clock()
    limited = False
    while True:
        if device_timer is not None:
            times.append(device_timer(lambda: run(feeds)))
        else:
            t0 = clock()
            run(feeds)
            times.append(clock() - t0)
        if progress:
            progress(len(times))
        elapsed = clock() - start
        if duration is None:
            if len(times) >= runs:
                break
        elif elapsed >= duration and len(times) >= 5:
            break
        if elapsed >= limit_s:
            limited = True
            break
    extra = {"time_limited": True} if limited else {}
    return summarize(times, batch=batch, warmup=warmup, threads=session.threads, provider=session.provider,
                     **extra)


def summarize(times_s: list[float], *, batch: int = 1, **extra) -> dict:
    ms = np.asarray(times_s) * 1e3
    mean = float(ms.mean())
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": mean,
        "std_ms": float(ms.std()),
        "min_ms": float(ms.min()),
        "max_ms": float(ms.max()),
        "runs": len(ms),
        "batch": batch,
        "throughput_per_s": batch * 1e3 / mean if mean > 0 else None,
        **extra,
    }
