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
from optkit.measure.latency import LIMIT_S, summarize
from optkit.measure.model import MeasureSettings, latency_feeds, synthesized
from optkit.measure.trials import low, ratio_ci95

MIN_CHANGE = 0.03
LIMIT_PAIR_S = 30.0  # the timing of a stage against its parent, all trials: seconds on a large model, not minutes
RACE_AT = (3, 5, 8)  # after these trials, a child clearly slower than the best one stops being timed


def paired_latency(before: Artifact, after: Artifact, settings: MeasureSettings, *, trials: int = 5,
                   data=None, limit_s: float | None = None, runtimes: tuple | None = None) -> dict[str, Any]:
    """{"before": figures, "after": figures, "ratio": after/before, "ratio_ci95": [lo, hi], "significant"}:
    paired_latencies with one child."""
    return paired_latencies(before, [after], settings, trials=trials, data=data, limit_s=limit_s, race=False,
                            runtimes=runtimes)[0]


def paired_latencies(parent: Artifact, children: list[Artifact], settings: MeasureSettings, *, trials: int = 5,
                     data=None, limit_s: float | None = None, race: bool = True,
                     runtimes: tuple | None = None) -> list[dict[str, Any]]:
    """The parent and every child timed call by call, interleaved, in one isolated process; per child (in order)
    the dict paired_latency gives, its "trials" the number it was timed in.

    `data`: a DataSpec (its first call is timed), one call's feeds as a dict of arrays, or None (synthesized).
    All trials together take about `limit_s` (default latency.LIMIT_S), session opening included, at least 5
    calls of each model a trial. With `race`, after trials 3, 5 and 8 (RACE_AT) a child whose ratio interval
    lies wholly above the best child's (both at 95%/3, Bonferroni over the three looks) stops being timed, and
    its time goes to the others; its figures are those of the trials it was in ("dropped_after").
    `runtimes` (one per model, the parent first; None: settings.runtime for all) times each model on its own
    runtime, the same loop whatever they are, so a ratio across runtimes is as honest as one within one."""
    children = list(children)
    if not children:
        return []
    names = ", ".join(str(c.path) for c in children[:3]) + (f" (+{len(children) - 3})" if len(children) > 3 else "")
    each = [settings if runtimes is None else settings.model_copy(update={"runtime": r}) for r in
            (runtimes or [None] * (len(children) + 1))]
    if len(each) != len(children) + 1:
        raise ValueError("runtimes: one per model, the parent first")
    return run_isolated(_paired, parent, children, each, trials, data, limit_s, race,
                        what=f"timing {names} against {parent.path}")


def head_to_head(first: Artifact, second: Artifact, feeds: dict, *, limit_s: float = 5.0,
                 trials: int = 5, runtime: str | None = None) -> tuple[float, float, float]:
    """`second`'s latency over `first`'s on one call's `feeds`, timed call by call, interleaved, in one child
    process (batch 1, one thread, no race): (ratio, low, high) of its 95% interval. Where two results timed each
    against a parent share an interval, timed against each other the difference shows."""
    settings = MeasureSettings(runtime=runtime, provider="cpu", threads=1, batch=1, warmup=10, runs=100)
    r = paired_latency(first, second, settings, trials=trials, data=feeds, limit_s=limit_s)
    return r["ratio"], r["ratio_ci95"][0], r["ratio_ci95"][1]


def _feeds_for(session, settings: MeasureSettings, data, model: str | None = None) -> dict:
    if isinstance(data, dict):  # each model gets the inputs it takes (an export without token_type_ids, say)
        names = {s.name for s in session.inputs}
        feeds = {k: v for k, v in data.items() if k in names}
    elif data is not None:
        ds = data.load(model)
        feeds = latency_feeds(session.inputs, ds.bind(session.inputs, stream=True), settings.batch, ds.source)
    else:
        feeds = synthesized(session, settings)[0]
    session.check_feeds(feeds)
    return feeds


def _paired(parent: Artifact, children: list[Artifact], each: list[MeasureSettings], trials: int, data,
            limit_s: float | None, race: bool) -> list[dict[str, Any]]:
    import gc

    settings = each[0]
    clock = time.perf_counter
    deadline = clock() + (LIMIT_S if limit_s is None else limit_s)
    arts = [parent, *children]
    sessions = [s.open(a) for s, a in zip(each, arts)]
    feeds = [_feeds_for(s, settings, data, arts[0].path) for s in sessions]
    fresh = all(s.provider == "cpu" and s.runtime in ("onnxruntime", "tflite", "openvino") for s in sessions)
    live = list(range(len(arts)))                       # 0 (the parent) is always timed
    times: list[list[list[float]]] = [[] for _ in arts]         # the timed calls, per model, per trial
    parent_times: list[list[list[float]]] = [[] for _ in arts]  # the parent's calls in the trials each child was in
    ratios: list[list[float]] = [[] for _ in arts]
    dropped: dict[int, int] = {}
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for trial in range(trials):
            start = clock()
            if fresh and trial:
                for i in live:
                    sessions[i].close()
                    sessions[i] = each[i].open(arts[i])
            # this trial's share of what is left; half of it at most for the warm-up
            half = max(0.0, deadline - start) / (trials - trial) / 2
            for _ in range(settings.warmup):
                for i in live:
                    sessions[i].run(feeds[i])
                if clock() - start >= half:
                    break
            trial_times: dict[int, list[float]] = {i: [] for i in live}
            start = clock()
            for k in range(settings.runs):
                if k >= 5 and clock() - start >= half:
                    break
                j = k % len(live)
                order = live[j:] + live[:j]              # each model goes first as often as the others
                if (k // len(live)) % 2:
                    order.reverse()
                for i in order:
                    t0 = clock()
                    sessions[i].run(feeds[i])
                    trial_times[i].append(clock() - t0)
            base = low(trial_times[0])
            for i in live:
                times[i].append(trial_times[i])
                if i:
                    ratios[i].append(low(trial_times[i]) / base)
                    parent_times[i].append(trial_times[0])
            racing = live[1:]
            if race and trial + 1 in RACE_AT and trial + 1 < trials and len(racing) > 1:
                ci = {i: ratio_ci95(ratios[i], by3=True) for i in racing}
                best = min(racing, key=lambda i: ci[i][2])
                for i in racing:
                    if ci[i][1] > ci[best][2]:
                        dropped[i] = trial + 1
                        live.remove(i)
                        sessions[i].close()
    finally:
        if gc_was:
            gc.enable()
    for i in live:
        sessions[i].close()
    out = []
    for i in range(1, len(arts)):
        centre, lo, hi = ratio_ci95(ratios[i])
        before, after = (summarize(t, batch=settings.batch, warmup=settings.warmup, threads=sessions[k].threads,
                                   provider=sessions[k].provider) for t, k in ((parent_times[i], 0), (times[i], i)))
        before["runtime"], after["runtime"] = sessions[0].runtime, sessions[i].runtime
        res = {"before": before, "after": after, "ratio": centre, "ratio_ci95": [lo, hi], "trial_ratios": ratios[i],
               "trials": len(ratios[i]), "significant": hi < 1 - MIN_CHANGE or lo > 1 + MIN_CHANGE}
        if i in dropped:
            res["dropped_after"] = dropped[i]
        out.append(res)
    return out


def change_against(parent: Artifact, child: Artifact, settings: MeasureSettings, data=None) -> dict[str, Any] | None:
    """The one way optkit times a result against its parent, for commands and recipes alike: paired, bounded
    (at least 5 pairs a trial), as {"before", "after": latency figures, "latency_change": ratio, interval,
    significance, "note": one line}; None when the two cannot run in one process (they are then timed apart)."""
    try:
        paired = paired_latency(parent, child, settings, data=data, limit_s=LIMIT_PAIR_S)
    except OptkitError:
        return None
    return as_change(paired)


def as_change(paired: dict[str, Any]) -> dict[str, Any]:
    """A paired timing (paired_latencies' per-child dict) as a stage's figure against its parent: change_against's
    shape, whichever timing made it (a pass's race made as the run times the stage, too)."""
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
