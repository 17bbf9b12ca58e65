"""One trial: the model's inputs, prepared once in a child (`model_inputs`); one setting measured under load in
a child process, stopped at its limit or the time budget (`Measurer`); and one trial of the study asked for,
measured (or its figures reused from the trial that measured the same setting) and told (`TrialRunner`)."""
from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np

from optkit.core import interrupts
from optkit.core.artifact import Artifact
from optkit.core.batching import first_call
from optkit.core.isolate import TimedOut, run_isolated
from optkit.core.text import first_line
from optkit.measure.model import MeasureSettings, synthesized
from optkit.measure.serving import PROBE_S, Setting, batch_feeds, measure_setting
from optkit.passes.tune import study as studies
from optkit.passes.tune import workers
from optkit.passes.tune.config import Goal, TuneConfig, short
from optkit.passes.tune.space import cores, pool_cap, pool_threads, suggest

log = logging.getLogger(__name__)

SETUP_S = 1.0  # a trial's child start, sessions and warm-up, before any trial has shown what it takes here
# a trial's child is stopped after its probe, its timed seconds and max(TRIAL_MARGIN_S, 10 x the timed seconds)
# for its start, sessions and warm-up (and at the time budget, when that comes first)
TRIAL_MARGIN_S = 30.0


def trial_limit(trial_seconds: float) -> float:
    """Seconds a trial's child may take: the probe, the timed seconds, and a margin for set-up."""
    return PROBE_S + trial_seconds + max(TRIAL_MARGIN_S, 10 * trial_seconds)


def model_inputs(artifact: Artifact, settings: MeasureSettings, data,
                 timeout: float | None = None) -> tuple[dict, str | None]:
    """One call's feeds at batch 1, and why the model cannot batch (None when it can), found in a child."""
    return run_isolated(_inputs, artifact, settings, data, timeout=timeout,
                        what=f"preparing inputs for {artifact.path}")


def _inputs(artifact: Artifact, settings: MeasureSettings, data) -> tuple[dict, str | None]:
    session = settings.open(artifact)
    if data is not None:  # a measure.datasets.Dataset
        feeds = first_call(session.inputs, data.bind(session.inputs), 1)
    else:
        feeds = synthesized(session, settings)[0]
    session.check_feeds(feeds)
    if not session.inputs:
        return feeds, "it has no inputs"
    fixed = [s.name for s in session.inputs if not s.shape or isinstance(s.shape[0], int)]
    if fixed:
        return feeds, f"input {fixed[0]!r} has no dynamic first (batch) dimension"
    if any(np.ndim(v) == 0 or np.shape(v)[0] != 1 for v in feeds.values()):
        return feeds, "its inputs are not batched on their first axis"
    try:
        outputs = session.run(batch_feeds(feeds, 2))
    except Exception as e:  # noqa: BLE001 - the model does not run at batch 2: it cannot batch
        return feeds, f"it does not run at batch 2 ({first_line(e)[:100]})"
    if any(np.ndim(o) == 0 or np.shape(o)[0] != 2 for o in outputs):
        return feeds, "its outputs at batch 2 do not have 2 rows"
    session.close()
    return feeds, None


class Measurer:
    """Measures settings of one model, each in a child process stopped at its limit or at a deadline (TimedOut),
    and learns what a measurement takes here beyond its timed part (the set-up)."""

    def __init__(self, artifact: Artifact, feeds: dict, trial_seconds: float, deadline: float):
        self.artifact, self.feeds, self.trial_seconds, self.deadline = artifact, feeds, trial_seconds, deadline
        self.overheads: list[float] = []  # seconds a measurement took beyond its timed part

    def left(self, deadline: float | None = None) -> float:
        return (self.deadline if deadline is None else deadline) - time.monotonic()

    def seconds_needed(self) -> float:
        """What a trial takes: its probe and timed run, and the set-up trials here have shown (the slowest of
        the last few; SETUP_S before any)."""
        setup = max(self.overheads[-5:]) if self.overheads else SETUP_S
        return PROBE_S + self.trial_seconds + setup

    def limit(self, deadline: float) -> float:
        """Seconds a measurement may take: the trial limit (trial_limit), or what is left of the budget when
        that is less."""
        return min(self.left(deadline), trial_limit(self.trial_seconds))

    def measure(self, setting: Setting, deadline: float, hopeless=None) -> dict:
        """A setting's figures, its child stopped at `deadline` (TimedOut); the overhead is remembered."""
        t0 = time.monotonic()
        figures = measure_setting(self.artifact, setting, self.feeds, seconds=self.trial_seconds,
                                  hopeless=hopeless, timeout=self.limit(deadline))
        timed = PROBE_S + (0.0 if figures.get("pruned") else self.trial_seconds)
        self.overheads.append(max(0.0, time.monotonic() - t0 - timed))
        return figures


class TrialRunner:
    """Runs the study's trials one at a time for this worker: asks for a trial, picks its setting, measures it
    (or reuses the figures of the trial that measured the same setting) and tells the study."""

    def __init__(self, measurer: Measurer, goal: Goal, cfg: TuneConfig, space: dict[str, list[Any]],
                 worker: dict[str, Any], stale: list[int]):
        self.measurer, self.goal, self.cfg, self.space = measurer, goal, cfg, space
        self.worker, self.stale = worker, stale
        self.left_out_last = ""  # the last setting not measured (too many pool threads), and why

    def run(self, study, deadline: float) -> str:
        """Ask for a trial, measure it and tell the study. Optuna's and the storage's calls run with interrupts
        deferred; one that comes while the setting is measured fails the trial (told FAIL), then goes on up.
        Returns "done", "full" (the study has its trials), "left-out" (too many pool threads: not measured),
        "timeout" (the budget ran out inside it) or "failed" (no budget: the setting did not come back in
        time)."""
        import optuna

        S = optuna.trial.TrialState
        trial, told = None, False
        try:
            with interrupts.deferred():
                trial = study.ask()
                trial.set_user_attr("worker", self.worker)
            with workers.Heartbeat(study._storage, trial._trial_id):
                with interrupts.deferred():
                    if studies.counted(study, before=trial.number) >= self.cfg.trials:
                        trial.set_user_attr("skipped", True)  # the study has its trials (other workers ran them)
                        study.tell(trial, state=S.PRUNED, skip_if_finished=True)
                        told = True
                        return "full"
                    setting = suggest(trial, self.space)
                    trial.set_user_attr("setting", setting.model_dump(mode="json"))
                    if pool_threads(setting) > pool_cap():  # not measured, not counted: TPE learns it is bad
                        self.left_out_last = (f"{setting.label()}: its sessions start {pool_threads(setting)} "
                                              f"onnxruntime pool threads, more than {pool_cap()} on {cores()} cores")
                        trial.set_user_attr("skipped", True)
                        trial.set_user_attr("left_out", self.left_out_last)
                        study.tell(trial, state=S.PRUNED, skip_if_finished=True)
                        told = True
                        log.info("trial %d left out: %s", trial.number, self.left_out_last)
                        return "left-out"
                duplicate = self._same_setting(study, trial, deadline)
                if duplicate is not None:
                    figures = duplicate.user_attrs["figures"]
                else:
                    limit = self.measurer.limit(deadline)
                    budget = limit < trial_limit(self.cfg.trial_seconds)
                    try:
                        figures = self.measurer.measure(setting, deadline, hopeless=self.goal.hopeless)
                    except TimedOut:
                        reason = (f"stopped at the time budget: {setting.label()} was still setting up or being "
                                  f"measured when its {limit:.1f} s ran out" if budget else
                                  f"stopped at the trial limit: {setting.label()} was not measured within "
                                  f"{limit:.1f} s (probe, trial_seconds (--trial-seconds) and max(30 s, 10 x "
                                  "trial_seconds) for set-up)")
                        with interrupts.deferred():
                            trial.set_user_attr("failed", reason)
                            study.tell(trial, state=S.FAIL)
                            told = True
                        log.info("trial %d: %s", trial.number, reason)
                        return "timeout" if budget else "failed"
                    log.info("trial %d: %s -> %s", trial.number, setting.label(), short(figures))
                with interrupts.deferred():
                    state, values = self._record(trial, figures,
                                                 duplicate_of=duplicate.number if duplicate is not None else None)
                    # another worker may have popped and finished this trial first (SQLite): its figures stand
                    study.tell(trial, values, state=state, skip_if_finished=True)
                    told = True
            return "done"
        except optuna.exceptions.UpdateFinishedTrialError:
            # another worker took the same trial (SQLite lets two workers pop one waiting trial) and told it
            # first: its figures stand, this worker goes on with the next
            log.info("trial %s was finished by another worker", trial.number if trial is not None else "?")
            return "done"
        except BaseException as e:
            if trial is not None and not told:
                with interrupts.deferred():
                    try:
                        why = ("interrupted (SIGTERM)" if interrupts.received == "SIGTERM" else "interrupted (Ctrl-C)") \
                            if isinstance(e, KeyboardInterrupt) else f"failed: {first_line(e)[:200]}"
                        trial.set_user_attr("failed", why)
                        study.tell(trial, state=S.FAIL)
                    except Exception as cleanup:  # noqa: BLE001 - the storage itself failed: report the first error
                        log.debug("could not mark trial %d failed: %s", trial.number, first_line(cleanup))
            raise

    def _same_setting(self, study, trial, deadline: float):
        """The trial that has measured, or is measuring, this trial's setting: a finished trial with its figures
        (returned), or a running one with a lower id, which this worker waits for (POLL_S) so that two workers
        never measure one setting at once. A lower trial still choosing its setting is waited for too (it may
        choose this one). None: this trial measures it."""
        import optuna

        S = optuna.trial.TrialState
        mine = trial.user_attrs["setting"]
        while True:
            with interrupts.deferred():
                studies.fail_stale(study, self.stale)
                trials = study.get_trials(deepcopy=False, states=(S.COMPLETE, S.PRUNED, S.RUNNING))
            done = next((t for t in trials if t.state != S.RUNNING and t.user_attrs.get("setting") == mine
                         and "figures" in t.user_attrs), None)
            if done is not None:
                return done
            ahead = [t for t in trials if t.state == S.RUNNING and t._trial_id < trial._trial_id
                     and not t.user_attrs.get("skipped") and t.user_attrs.get("setting", mine) == mine]
            if not ahead or self.measurer.left(deadline) <= studies.POLL_S:
                return None
            log.info("trial %d: waiting for trial %d (same setting, another worker)", trial.number, ahead[0].number)
            time.sleep(studies.POLL_S)

    def _record(self, trial, figures: dict, duplicate_of: int | None = None):
        """Keep a trial's figures and constraints; the state and values to tell the study."""
        import optuna

        trial.set_user_attr("figures", figures)
        trial.set_user_attr("constraints", self.goal.violations(figures))
        for i, v in enumerate(trial.user_attrs["constraints"]):  # TPE learns what is infeasible from these
            trial.set_constraint(f"c{i}", v)
        if duplicate_of is not None:
            trial.set_user_attr("duplicate_of", duplicate_of)
        values = self.goal.values(figures)
        if figures.get("pruned") or any(v is None or not math.isfinite(v) for v in values):
            if not figures.get("pruned"):
                trial.set_user_attr("pruned_reason", "no figure")
            return optuna.trial.TrialState.PRUNED, None
        return optuna.trial.TrialState.COMPLETE, values if len(values) > 1 else values[0]
