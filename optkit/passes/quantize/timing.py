"""Timing the survivors: the candidates that meet every budget, each against the FP32 parent, with
measure.paired's one way of timing a result against its parent (call by call, interleaved, in one child
process, fresh sessions each trial, the ratio with its 95% interval); the search has no timing loop of its
own."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from optkit.core.artifact import Artifact
from optkit.core.batching import first_call
from optkit.core.text import first_line
from optkit.measure.model import MeasureSettings
from optkit.measure.paired import as_change, head_to_head, paired_latencies
from optkit.passes.quantize.candidates import Candidate

TIMING_LIMIT_S = 14.0     # the timing of all candidates against the parent, session opening included (the
                          # phase, with its child process and loading, stays within 15 s)
TIMING_TRIALS = 8         # fresh sessions each; the race drops clearly slower candidates after trials 3 and 5
TIMING_RUNS = 100         # calls of each model a trial at most (the time limit usually stops it first)
RUNOFF_LIMIT_S = 5.0      # a head-to-head of the candidate to keep against the fastest one
RUNOFF_TRIALS = 5


def time_candidates(parent: Artifact, pool: list[Candidate], specs: list, check_feeds: dict,
                    note: Callable[[str], None], stage: tuple[MeasureSettings, Any] | None = None,
                    runtime: str | None = None) -> dict[str, Any]:
    """Each candidate against the parent, all in one run; one clearly slower than the best stops being timed after
    trial 3 or 5 (its figures are those of the trials it was in). `stage`: how the run times the stage against
    its parent (PassContext.timing: its settings and data), and then, on the same runtime, the race is timed so
    and the chosen file's figure is the stage's (race_result); else at batch 1 on one thread, on the first call of
    the check data. `runtime`: the one the parent and the candidates run on (default onnxruntime).
    Sets each candidate's p50_ms, latency_ratio, latency_ratio_ci95, latency_trials and paired; returns the
    settings to report (parent_p50_ms, latency_settings, latency_is_the_stages), or {} when the timing failed
    (said with `note`: latency informs the choice, and its failure must not hide the result)."""
    if stage is not None and stage[0].runtime == runtime:
        settings, data = stage
    else:
        stage = None
        settings = MeasureSettings(runtime=runtime, provider="cpu", threads=1, batch=1, warmup=10, runs=TIMING_RUNS)
        data = first_call(specs, check_feeds, 1)
    try:
        results = paired_latencies(parent, [Artifact.load(str(c.path)) for c in pool], settings,
                                   trials=TIMING_TRIALS, data=data, limit_s=TIMING_LIMIT_S)
    except Exception as e:  # noqa: BLE001 - latency informs the choice; a failure must not hide the result
        note(f"candidate latency not measured: {first_line(e)}")
        return {}
    for c, r in zip(pool, results):
        c.p50_ms, c.latency_ratio, c.latency_ratio_ci95 = r["after"]["p50_ms"], r["ratio"], r["ratio_ci95"]
        c.latency_trials, c.paired = r["trials"], r
    longest = max(results, key=lambda r: r["trials"])
    threads = settings.threads or "the runtime's default"
    return {"parent_p50_ms": longest["before"]["p50_ms"], "latency_is_the_stages": stage is not None,
            "latency_settings": f"{settings.runtime or 'onnxruntime'}, batch {settings.batch}, threads {threads}, "
                                f"paired with the parent call by call, up to {TIMING_TRIALS} trials (clearly slower "
                                f"candidates dropped early)"}


def race_result(parent: Artifact, chosen: Candidate) -> dict[str, Any] | None:
    """The chosen file's race figure as the stage's paired measurement against the parent (the shape
    measure.paired.change_against gives, with the parent's sha256), or None when it was not timed."""
    r = chosen.paired
    if r is None or r["trials"] < 2:
        return None
    return {"parent": parent.sha256, **as_change(r)}


def runoff(fastest: Candidate, chosen: Candidate, specs: list, check_feeds: dict,
           note: Callable[[str], None], runtime: str | None = None) -> tuple[float, float, float] | None:
    """`chosen`'s latency over `fastest`'s, timed head to head (call by call, interleaved, one child process):
    (ratio, low, high) of its 95% interval. Each was timed against the parent in the race, where two candidates
    a few % apart often share an interval; timed against each other the difference shows. None when the timing
    failed (said with `note`)."""
    try:
        return head_to_head(Artifact.load(str(fastest.path)), Artifact.load(str(chosen.path)),
                            first_call(specs, check_feeds, 1), limit_s=RUNOFF_LIMIT_S, trials=RUNOFF_TRIALS,
                            runtime=runtime)
    except Exception as e:  # noqa: BLE001 - latency informs the choice; a failure must not hide the result
        note(f"run-off not timed: {first_line(e)}")
        return None
