"""`Tuner`: one tune from start to end. It prepares the model's inputs and the space, opens the study (storage,
study), runs trials until the study has enough, the time budget's search share is spent or trials keep failing
(trial.TrialRunner), then confirms the best (result.Confirmation) and returns the result (result.summarize).
A failed or interrupted tune removes the study file it created when nothing was measured in it."""
from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

from optkit.core import interrupts
from optkit.core.artifact import Artifact
from optkit.core.errors import EXIT_PASS, OptkitError, UsageError, ValidationError
from optkit.core.formats import Format
from optkit.measure.model import MeasureSettings
from optkit.measure.serving import PROBE_S
from optkit.passes.tune import study as studies
from optkit.passes.tune import workers
from optkit.passes.tune.config import Goal, TuneConfig
from optkit.passes.tune.result import ROUNDS, Confirmation, summarize
from optkit.passes.tune.space import (
    POOL_PER_CORE,
    check_pool,
    default_space,
    pool_cap,
    providers_here,
    runtimes_here,
    starting_points,
)
from optkit.passes.tune.storage import (
    check_storage_file,
    database_error,
    db_message,
    open_storage,
    redact,
    side_files,
    sqlite_url,
    storage_file,
)
from optkit.passes.tune.trial import Measurer, TrialRunner, model_inputs


def check_onnx(artifact: Artifact) -> None:
    if artifact.format != Format.ONNX:
        how = ("tune the ONNX model it was converted from (nothing converts IR back)"
               if artifact.format == Format.OPENVINO_IR else "convert it to ONNX first (optkit convert)")
        raise UsageError(f"optkit tune searches the serving settings of ONNX models (on onnxruntime and OpenVINO): "
                         f"{artifact.path} is {artifact.format.value}; {how}")


class Tuner:
    """One tune: the search, then the confirmation of the best settings. `run()` returns the result dict
    (what the report keeps under measurements.tune and the best-settings JSON holds); after a failure, `kept`
    says what the study file still holds to resume from."""

    def __init__(self, artifact: Artifact, cfg: TuneConfig, *, settings: MeasureSettings, data,
                 default_storage: Path, notes: list[str]):
        check_onnx(artifact)
        self.artifact, self.cfg, self.settings, self.data, self.notes = artifact, cfg, settings, data, notes
        self.goal = Goal(cfg)
        self.storage_url = cfg.storage or sqlite_url(default_storage)
        check_storage_file(self.storage_url)
        # the study's file (the default one or what --storage names), and the files of it this run creates: a
        # failed or interrupted run with no finished trial removes those again
        self.own_file = Path(default_storage).absolute() if cfg.storage is None else storage_file(cfg.storage)
        self.created = [p for p in side_files(self.own_file) if not os.path.lexists(p)] \
            if self.own_file is not None and not os.path.lexists(self.own_file) else []
        self.deadline = time.monotonic() + cfg.time_budget if cfg.time_budget else math.inf
        self.storage = None
        self.study_name = ""
        self.stale: list[int] = []        # trials of stopped workers this run marked failed
        self.kept: str | None = None      # after a failure: what the study file still holds, to resume from
        self.left_out_count = 0           # settings not measured: too many pool threads

    def _left(self, deadline: float | None = None) -> float:
        return (self.deadline if deadline is None else deadline) - time.monotonic()

    def _prepare(self) -> None:
        """The model's inputs (in a child), the space, and the objects that measure and confirm."""
        left = self._left()
        feeds, no_batch = model_inputs(self.artifact, self.settings, self.data,
                                       timeout=left if math.isfinite(left) else None)
        if no_batch:
            self.notes.append(f"batch size left out of the search: the model cannot batch ({no_batch})")
        runtimes, why = runtimes_here(self.artifact)
        if why and "runtime" not in self.cfg.space:
            self.notes.append(f"openvino left out of the search: {why}")
        self.space = default_space(self.cfg, batchable=no_batch is None, providers=providers_here(),
                                   no_batch=no_batch, runtimes=runtimes)
        self.left_out = {"batch": no_batch} if no_batch else {}
        check_pool(self.space)
        self.feeds = feeds
        self.measurer = Measurer(self.artifact, feeds, self.cfg.trial_seconds, self.deadline)
        self.worker = workers.this_worker()
        self.trials = TrialRunner(self.measurer, self.goal, self.cfg, self.space, self.worker, self.stale)
        self.confirmation = Confirmation(self.measurer, self.goal, self.notes, self.worker, self.stale)

    def _study(self):
        name, asked = studies.identity(self.artifact, self.cfg, self.space, self.feeds)
        self.study_name = name
        self.storage = open_storage(self.storage_url, lambda study, t: self.stale.append(t.number),
                                    wait=self.cfg.storage_wait)
        return studies.load_or_create(self.storage, self.storage_url, name, asked, self.cfg, self.goal.directions)

    def run(self) -> dict[str, Any]:
        """The tune. A failed or interrupted one removes the default study file when this run created it and
        no trial finished in it; else `kept` says what is there to resume from."""
        try:
            return self._run()
        except BaseException as e:
            self.kept = studies.after_failure(self.storage, self.own_file, self.created)
            cause = database_error(e) if self.storage is not None else None
            if cause is not None:
                raise self._lost(cause) from None
            if self.kept and isinstance(e, OptkitError) and e.exit_code == EXIT_PASS:
                e.message = f"{e.message}; {self.kept}"  # exit 3 with trials kept: say where they are
                e.args = (e.message,)
            raise

    def _lost(self, e: BaseException) -> UsageError:
        """The storage failed mid-study (its server stopped, the network went): one line. The study stays in the
        database: this worker's running trial is failed once the server is back (by its process here, by its
        heartbeat elsewhere) and the same command resumes."""
        return UsageError(f"lost the tune storage {redact(self.storage_url)} mid-study ({db_message(e)}); the "
                          f"study {self.study_name!r} keeps its finished trials: run the same command to resume "
                          "once the database is back (a trial this worker left running is failed then, not "
                          "counted)")

    def _run(self) -> dict[str, Any]:
        self._prepare()
        study = self._study()
        with interrupts.deferred():
            studies.fail_stale(study, self.stale)
            done = len(studies.finished(study))
            if done:
                self.notes.append(f"study {self.study_name}: {done} trials already done (resumed)")
            elif not study.trials:
                for params in starting_points(self.space):
                    study.enqueue_trial(params, skip_if_exists=True)
        self._search(study)
        trials = studies.finished(study)
        if self.stale:
            n = len(self.stale)
            self.notes.append(f"{n} stale trial{'s' if n > 1 else ''} left running by a stopped worker marked "
                              "failed (not counted)")
        failed = studies.failed_rows(study)
        if self.left_out_count:
            n = self.left_out_count
            self.notes.append(f"{n} setting{'s' if n > 1 else ''} left out unmeasured: their sessions start more "
                              f"than {pool_cap()} onnxruntime pool threads ({POOL_PER_CORE} per core)")
        if not trials:
            why = f"; the last: trial {failed[-1]['number']} {failed[-1]['reason']}" if failed else \
                f"; every setting tried was left out, the last: {self.trials.left_out_last}" \
                if self.left_out_count else " (time budget too short?)"
            raise ValidationError(f"no tune trial finished{why}; nothing was written")
        return summarize(trials, failed, goal=self.goal, cfg=self.cfg, confirmation=self.confirmation, study=study,
                         space=self.space, left_out=self.left_out, storage=redact(self.storage_url),
                         study_name=self.study_name, stale=len(self.stale))

    def _search(self, study) -> None:
        """Trials until the study has `trials` of them, the budget's search part is spent, or trials keep
        failing. With a budget, a share of it (up to a third) is kept for the confirmation."""
        per = self.measurer.seconds_needed()
        reserve = min(self.cfg.confirm * ROUNDS * per, self.cfg.time_budget / 3) \
            if self.cfg.time_budget and self.cfg.confirm else 0.0
        deadline = self.deadline - reserve
        timeouts = failures = left_out = 0
        waited = 0.0
        while True:
            with interrupts.deferred():
                studies.fail_stale(study, self.stale)
                counted, running = studies.counted(study), studies.running(study)
            if counted >= self.cfg.trials:
                if not running:
                    if waited >= 1:
                        self.notes.append(f"waited {waited:.0f} s for other workers' last trials")
                    return
                # other workers' trials make up the count: wait for them, as one that fails (or whose worker
                # stops: its heartbeat) leaves a trial to run again, so that the study has exactly `trials`
                if self._left(deadline) <= studies.POLL_S:
                    return
                time.sleep(studies.POLL_S)
                waited += studies.POLL_S
                continue
            until = deadline
            if math.isfinite(deadline):
                first = not studies.finished(study)
                left, need = self._left(deadline), self.measurer.seconds_needed()
                if left < need and not (first and self._left() > PROBE_S + self.cfg.trial_seconds):
                    self.notes.append(f"time budget: the search stopped with {max(0.0, left):.1f} s of its "
                                      f"share left (a trial takes about {need:.1f} s here)")
                    return
                if first and left < need:
                    until = self.deadline  # no trial yet: the first may use the whole budget
            outcome = self.trials.run(study, until)
            if outcome == "full":
                continue  # the loop's top waits for the others' running trials or ends
            if outcome == "left-out":
                left_out += 1
                self.left_out_count += 1
                if left_out >= max(20, 2 * self.cfg.trials):
                    self.notes.append(f"the search stopped: {left_out} settings in a row were left out (too many "
                                      "onnxruntime pool threads); narrow space (--space)")
                    return
                continue
            left_out = 0
            if outcome == "failed":
                failures += 1
                if failures >= max(3, self.cfg.trials):
                    self.notes.append(f"the search stopped: {failures} settings did not come back in time")
                    return
            if outcome == "timeout":
                timeouts += 1
                if self._left(until) < PROBE_S + self.cfg.trial_seconds or timeouts >= 3:
                    self.notes.append("time budget: the search stopped (a trial was stopped at the budget, "
                                      "marked failed)")
                    return
