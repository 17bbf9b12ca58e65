"""Paired latency: a model and its optimized version timed call by call in one process, so both see the same
machine state, and their ratio given with a 95% confidence interval.

A single-stage command reports the change a pass made. Two separate measurements each carry the machine's
noise, and their ratio shows noise as a result ("speedup 0.72x" for an unchanged graph). Here the two
sessions alternate run by run inside each trial (fresh sessions per trial on CPU, as in measure.trials); a
trial gives one ratio of low percentiles (trials.low), the trials give the interval (a t-interval on the log
ratios). A change is significant only when the whole interval lies more than MIN_CHANGE away from 1.0: two
sessions of one file differ by a percent or two for their whole life (where the weights land in memory),
which no interval over a handful of trials sees; anything else is "no significant change".
"""
from __future__ import annotations

import time
from typing import Any

from optkit.core.artifact import Artifact
from optkit.core.errors import OptkitError
from optkit.core.isolate import run_isolated
from optkit.measure.datasets import load_dataset
from optkit.measure.latency import LIMIT_S, summarize
from optkit.measure.model import MeasureSettings, latency_feeds, synthesized
from optkit.measure.trials import low, ratio_ci95

MIN_CHANGE = 0.03
LIMIT_PAIR_S = 30.0  # the timing of a stage against its parent, all trials: seconds on a large model, not minutes


def paired_latency(before: Artifact, after: Artifact, settings: MeasureSettings, *, trials: int = 5,
                   data=None, limit_s: float | None = None) -> dict[str, Any]:
    """{"before": figures, "after": figures, "ratio": after/before, "ratio_ci95": [lo, hi], "significant"}."""
    return run_isolated(_paired, before, after, settings, trials, data, limit_s,
                        what=f"timing {before.path} against {after.path}")


def _paired(before: Artifact, after: Artifact, settings: MeasureSettings, trials: int, data,
            limit_s: float | None) -> dict[str, Any]:
    import gc

    trial_limit = (LIMIT_S if limit_s is None else limit_s) / (2 * trials)
    arts = (before, after)
    sessions = [settings.open(a) for a in arts]
    feeds = []
    for session in sessions:
        if data is not None:
            ds = load_dataset(data.path, data.preprocess, data.labels)
            feeds.append(latency_feeds(session.inputs, ds.bind(session.inputs), settings.batch, ds.source))
        else:
            feeds.append(synthesized(session, settings)[0])
        session.check_feeds(feeds[-1])
    fresh = all(s.provider == "cpu" and s.runtime in ("onnxruntime", "tflite") for s in sessions)
    clock = time.perf_counter
    times: list[list[float]] = [[], []]
    ratios: list[float] = []
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for trial in range(trials):
            if fresh and trial:
                for i, a in enumerate(arts):
                    sessions[i].close()
                    sessions[i] = settings.open(a)
            start = clock()
            for _ in range(settings.warmup):
                for s, f in zip(sessions, feeds):
                    s.run(f)
                if clock() - start >= trial_limit:
                    break
            trial_times: list[list[float]] = [[], []]
            start = clock()
            for _ in range(settings.runs):
                if len(trial_times[0]) >= 5 and clock() - start >= trial_limit:
                    break
                order = (0, 1) if len(trial_times[0]) % 2 == 0 else (1, 0)  # neither always goes first
                for i in order:
                    t0 = clock()
                    sessions[i].run(feeds[i])
                    trial_times[i].append(clock() - t0)
            ratios.append(low(trial_times[1]) / low(trial_times[0]))
            times[0] += trial_times[0]
            times[1] += trial_times[1]
    finally:
        if gc_was:
            gc.enable()
    for s in sessions:
        s.close()
    centre, lo, hi = ratio_ci95(ratios)
    figures = [summarize(t, batch=settings.batch, warmup=settings.warmup, threads=s.threads, provider=s.provider)
               for t, s in zip(times, sessions)]
    return {"before": figures[0], "after": figures[1], "ratio": centre, "ratio_ci95": [lo, hi],
            "trial_ratios": ratios, "trials": trials,
            "significant": hi < 1 - MIN_CHANGE or lo > 1 + MIN_CHANGE}


def change_against(parent: Artifact, child: Artifact, settings: MeasureSettings, data=None) -> dict[str, Any] | None:
    """The one way optkit times a result against its parent, for commands and recipes alike: paired, bounded
    (at least 5 pairs a trial), as {"before", "after": latency figures, "latency_change": ratio, interval,
    significance, "note": one line}; None when the two cannot run in one process (they are then timed apart)."""
    try:
        paired = paired_latency(parent, child, settings, data=data, limit_s=LIMIT_PAIR_S)
    except OptkitError:
        return None
    return {"before": paired["before"], "after": paired["after"],
            "latency_change": {k: paired[k] for k in ("ratio", "ratio_ci95", "significant", "trials")},
            "note": "latency: " + describe(paired)}


def describe(paired: dict[str, Any]) -> str:
    """One line: "1.92x faster (95% CI 1.85-1.99x)", or "no significant change (0.97-1.04x)"."""
    ratio, (lo, hi) = paired["ratio"], paired["ratio_ci95"]
    if not paired["significant"]:
        return f"no significant change (latency ratio {lo:.2f}-{hi:.2f}x, 95% CI)"
    if ratio < 1:
        return f"{1 / ratio:.2f}x faster (95% CI {1 / hi:.2f}-{1 / lo:.2f}x)"
    return f"{ratio:.2f}x slower (95% CI {lo:.2f}-{hi:.2f}x)"
