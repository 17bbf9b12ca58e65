"""Latency: warm-up, then timed runs (a count or a duration), reported as percentiles with their 95% bands."""
from __future__ import annotations

import math
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
    return summarize([times], batch=batch, warmup=warmup, threads=session.threads, provider=session.provider,
                     **extra)


PERCENTILES = {"p50_ms": 0.50, "p90_ms": 0.90, "p99_ms": 0.99}
# two-sided 95% Student t quantiles for 1..30 degrees of freedom
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042]


def t95(dof: int) -> float:
    return _T95[dof - 1] if dof <= len(_T95) else 1.96


def binomial_ranks(n: int, q: float) -> tuple[int, int]:
    """The 1-based ranks (l, u) of the distribution-free 95% interval [x_(l), x_(u)] of the q-quantile of n
    independent runs: with B ~ binomial(n, q) the number of runs under the true quantile, l is B's 2.5% quantile
    and u its 97.5% quantile plus one, so P(x_(l) <= quantile) >= 97.5% and P(x_(u) >= quantile) >= 97.5%.
    l == 0 or u == n + 1: too few runs to bound that side (the band has no lower / upper end)."""
    k = np.arange(n + 1)
    logpmf = np.concatenate([[n * math.log1p(-q)], n * math.log1p(-q) + np.cumsum(
        np.log((n - k[:-1]) / (k[:-1] + 1)) + math.log(q / (1 - q)))])
    cdf = np.cumsum(np.exp(logpmf))
    lo = int(np.searchsorted(cdf, 0.025))                 # smallest k with P(B <= k) >= 2.5%
    hi = int(np.searchsorted(cdf, 0.975 - 1e-12))         # smallest k with P(B <= k) >= 97.5%
    return lo, min(hi + 1, n + 1)


def runs_to_bound(q: float, side: str) -> int:
    """The fewest runs whose q-quantile band has an upper (side "upper") or a lower end."""
    p = q if side == "upper" else 1 - q
    return math.floor(math.log(0.025) / math.log(p)) + 1


def bands(ms: np.ndarray, batch: int = 1) -> dict[str, list[float | None]]:
    """The 95% band [low, high] of each percentile (order statistics of the runs: `binomial_ranks`) and of the
    throughput (batch / mean, from the normal interval of the mean run time); None: that end is unbounded."""
    x, n = np.sort(ms), len(ms)
    out: dict[str, list[float | None]] = {}
    for key, q in PERCENTILES.items():
        point = float(np.percentile(x, 100 * q))
        lo, hi = binomial_ranks(n, q)
        out[key] = [min(float(x[lo - 1]), point) if lo >= 1 else None,
                    max(float(x[hi - 1]), point) if hi <= n else None]
    mean = float(x.mean())
    if n >= 2 and mean > 0:
        half = 1.96 * float(x.std(ddof=1)) / math.sqrt(n)
        out["throughput_per_s"] = [batch * 1e3 / (mean + half), batch * 1e3 / (mean - half) if mean > half else None]
    return out


def unstalled_mean(ms: np.ndarray) -> float:
    """The mean call time of the calls the scheduler did not stall: calls past the far-out fence (Q3 + 3 IQR, and
    at least twice the median) are left out. On a busy machine the process is preempted for a time slice or two
    (4-8 ms) now and then; a small model's trial is a millisecond of calls, so one such stall is most of its
    time, whichever stage it hits; the model's own spread lies well inside the fence."""
    q1, median, q3 = np.percentile(ms, [25, 50, 75])
    kept = ms[ms <= max(q3 + 3 * (q3 - q1), 2 * median)]
    return float(kept.mean())


def throughput(trials_ms: list[np.ndarray], batch: int, band: list[float | None] | None) -> tuple:
    """Samples per second one call at a time: batch / the median over trials of each trial's unstalled mean call
    time (`unstalled_mean`), and its 95% band (the runs' `band`, widened to hold the figure)."""
    means = [unstalled_mean(t) for t in trials_ms if len(t)]
    mean = float(np.median(means)) if means else 0.0
    if mean <= 0:
        return None, band
    value = batch * 1e3 / mean
    if band is not None:
        band = [None if band[0] is None else min(band[0], value), None if band[1] is None else max(band[1], value)]
    return value, band


def summarize(trials_s: list[list[float]], *, batch: int = 1, **extra) -> dict:
    """The figures of timed calls, given per trial (one list of seconds each; a single run is one trial):
    percentiles, mean and std over all calls, and the throughput from the calls no stall hit (`throughput`)."""
    trials_ms = [np.asarray(t, dtype=np.float64) * 1e3 for t in trials_s]
    ms = np.concatenate(trials_ms)
    ci95 = bands(ms, batch)
    tput, ci95["throughput_per_s"] = throughput(trials_ms, batch, ci95.get("throughput_per_s"))
    if ci95["throughput_per_s"] is None:
        del ci95["throughput_per_s"]
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
        "std_ms": float(ms.std()),
        "min_ms": float(ms.min()),
        "max_ms": float(ms.max()),
        "runs": len(ms),
        "batch": batch,
        "throughput_per_s": tput,
        "ci95": ci95,
        **extra,
    }
