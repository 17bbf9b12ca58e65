"""The study in its storage: its identity (`identity`: the model, space, objective, SLOs, machine kind and inputs
a study is for, and its name), creating or resuming it (`load_or_create`), the trials of workers that are gone
(`fail_stale`), what counts toward `trials` (`counted`, `running`, `finished`), what a failed run leaves
(`after_failure`), and reading a study's results without measuring (`read_study`)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from optkit.core import interrupts, strictjson
from optkit.core.artifact import Artifact
from optkit.core.errors import OptkitError, UsageError
from optkit.core.text import first_line
from optkit.measure.serving import Setting
from optkit.passes.tune import workers
from optkit.passes.tune.config import OBJECTIVES, TuneConfig
from optkit.passes.tune.storage import database_error, db_message, open_storage, redact, storage_file

log = logging.getLogger(__name__)

POLL_S = 0.5  # how often a worker looks again at another worker's running trial it waits for
STALE_REASON = "its worker's heartbeat stopped (failed by the heartbeat, not counted)"


def identity(artifact: Artifact, cfg: TuneConfig, space: dict, feeds: dict) -> tuple[str, dict[str, Any]]:
    """The study's name and what it is for: another model, space, objective, SLO, memory limit, kind of machine or
    inputs is another search (another study)."""
    asked = {"model_sha256": artifact.sha256, "space": space, "objective": cfg.objective,
             "slo": cfg.slo, "max_memory_mb": cfg.max_memory_mb,
             # figures measured on another CPU are another search's: one study per kind of machine
             "machine": workers.machine_kind(),
             "inputs": {k: list(np.shape(v)) for k, v in feeds.items()},
             # the values too: another --value, other data or seed is another search
             "inputs_sha256": hashlib.sha256(b"".join(np.ascontiguousarray(feeds[k]).tobytes()
                                                      for k in sorted(feeds))).hexdigest()}
    digest = hashlib.sha256(strictjson.dumps(asked, sort_keys=True).encode()).hexdigest()[:10]
    return cfg.study or f"optkit-tune-{Path(artifact.path).stem}-{digest}", asked


def load_or_create(storage, url: str, name: str, asked: dict[str, Any], cfg: TuneConfig, directions: list[str]):
    """The Optuna study `name` in `storage`: created, or resumed when it was made for the same search (`asked`);
    TPE (multivariate, grouped) with the config's seed, each worker of a shared study its own."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.DEBUG if log.isEnabledFor(logging.DEBUG) else optuna.logging.ERROR)
    # several workers of one study: each its own seed, so their first random settings differ
    seed = cfg.seed if cfg.storage is None else cfg.seed + os.getpid()
    with warnings.catch_warnings():  # multivariate and group are "experimental" (stable since Optuna 2.x)
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # multivariate + group: the dimensions that exist only together (inter-op threads in parallel mode,
        # sessions with several requests in flight) are modelled jointly
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, max(3, cfg.trials // 4)),
                                             multivariate=True, group=True)
    try:
        with interrupts.deferred():  # never half a study (an interrupt is raised once it is whole)
            study = optuna.create_study(storage=storage, study_name=name, sampler=sampler,
                                        load_if_exists=True, directions=directions)
    except json.JSONDecodeError:
        raise UsageError(f"{redact(url)} is not an Optuna journal file") from None
    except ValueError as e:  # the stored study has other directions
        raise UsageError(f"study {name!r} in {redact(url)} was made for a different search "
                         f"({first_line(e)}); name a new one with study (--study)") from None
    except Exception as e:  # noqa: BLE001 - the storage cannot be written or read
        raise UsageError(f"cannot use tune storage {redact(url)}: {db_message(e)}") from None
    asked = json.loads(strictjson.dumps(asked))  # as storage gives it back (lists, string keys)
    stored = study.user_attrs.get("optkit")
    if stored is None:
        with interrupts.deferred():
            study.set_user_attr("optkit", asked)
    elif stored != asked:
        differs = [k for k in asked if strictjson.dumps(stored.get(k), sort_keys=True) !=
                   strictjson.dumps(asked[k], sort_keys=True)]
        if "machine" in differs:
            others = [k for k in differs if k != "machine"]
            raise UsageError(f"study {name!r} in {redact(url)} holds figures measured on another "
                             f"kind of machine ({workers.kind_label(stored.get('machine'))}; this one: "
                             f"{workers.kind_label(asked['machine'])})"
                             + (f", and its {', '.join(others)} differ too" if others else "")
                             + "; optkit does not mix figures from different machines: give each kind of machine "
                             "its own study (--study NAME-KIND)")
        raise UsageError(f"study {name!r} in {redact(url)} was made for a different search "
                         f"(its {', '.join(differs)} differ from this one's); name a new one with study (--study), or "
                         "ask for the same search")
    return study


def fail_stale(study, stale: list[int]) -> None:
    """Trials left RUNNING by a worker that is gone are marked failed (their numbers added to `stale`): on this
    machine when its process is gone, elsewhere when its heartbeat is older than GRACE_S (Optuna's, on a
    database)."""
    import optuna

    RUNNING, FAIL = optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.FAIL
    optuna.storages.fail_stale_trials(study)  # a database's heartbeat; calls back into the storage's callback
    now = time.time()
    for t in study.get_trials(deepcopy=False, states=(RUNNING,)):
        worker = t.user_attrs.get("worker")
        alive = workers.worker_alive(worker)
        # a journal has no heartbeat of Optuna's; on a database, a trial whose worker stopped between asking
        # for it and naming itself has no heartbeat either (Optuna would never fail it, and every later worker
        # would wait for it as "still choosing its setting")
        if alive is None and (not isinstance(worker, dict)
                              or not getattr(study._storage, "get_heartbeat_interval", lambda: None)()):
            beat = t.user_attrs.get("heartbeat")  # a journal: the trial's own heartbeat attribute
            if not isinstance(beat, (int, float)) and t.datetime_start is not None:
                beat = t.datetime_start.timestamp()
            alive = not isinstance(beat, (int, float)) or now - beat <= workers.GRACE_S
        if alive is not False:
            continue
        try:
            pid = worker.get("pid") if isinstance(worker, dict) else None
            study._storage.set_trial_user_attr(t._trial_id, "failed", "left running by a worker that stopped"
                                               + (f" (pid {pid})" if pid else ""))
            if study._storage.set_trial_state_values(t._trial_id, state=FAIL):
                stale.append(t.number)
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError):
            pass  # another worker finished or failed it meanwhile


def counted(study, before: int | None = None) -> int:
    """Trials toward `trials`: finished ones and those live workers are running (numbers below `before`)."""
    import optuna

    S = optuna.trial.TrialState
    return sum(1 for t in study.get_trials(deepcopy=False, states=(S.COMPLETE, S.PRUNED, S.RUNNING))
               if (before is None or t.number < before) and not t.user_attrs.get("skipped"))


def running(study) -> int:
    """Trials other workers are running now (counted toward `trials` until they finish or fail)."""
    import optuna

    return sum(1 for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
               if not t.user_attrs.get("skipped"))


def finished(study) -> list:
    """The measured trials (complete or pruned, with figures), bookkeeping trials left out."""
    import optuna

    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return [t for t in study.get_trials(deepcopy=False, states=states)
            if not t.user_attrs.get("skipped") and "figures" in t.user_attrs]


def failed_rows(study) -> list[dict]:
    """The failed trials as the result lists them (a shared confirmation's bookkeeping trial is no trial)."""
    import optuna

    return [{"number": t.number, "label": Setting(**t.user_attrs["setting"]).label()
             if "setting" in t.user_attrs else "", "reason": t.user_attrs.get("failed", STALE_REASON),
             "worker": workers.worker_label(t.user_attrs.get("worker"))}
            for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
            if not t.user_attrs.get("confirm")]


def after_failure(storage, path: Path | None, created: list[Path]) -> str | None:
    """After an error or an interrupt: drop the study file (and its -journal, -wal, -shm) this run `created`
    when no trial finished in it and no other worker uses it (nothing to resume from). Returns what it keeps to
    resume from (None: nothing)."""
    import optuna

    if path is None or not os.path.lexists(path):
        return None
    done, measured, others = 0, 0, False
    with interrupts.deferred():
        try:
            if storage is not None:
                S = optuna.trial.TrialState
                studies = storage.get_all_studies()
                for s in studies:
                    for t in storage.get_all_trials(s._study_id, deepcopy=False):
                        worker = t.user_attrs.get("worker")
                        if isinstance(worker, dict) and not workers.is_this_process(worker):
                            others = True  # another worker's trial (an enqueued one has no worker)
                        if t.state in (S.COMPLETE, S.PRUNED, S.RUNNING) and not t.user_attrs.get("skipped"):
                            done += 1
                            # counted as the result counts them: settings with figures, repeats left out
                            measured += "figures" in t.user_attrs and "duplicate_of" not in t.user_attrs
                others = others or len(studies) > 1
        except Exception as e:  # noqa: BLE001 - cannot read it: leave it
            log.debug("tune study after a failure: %s", first_line(e))
            return None
        if done:
            return (f"the study is kept in {path} ({measured} measured trial{'s' if measured != 1 else ''}; "
                    "run the same command to resume)")
        if not created or others:
            return None
        if storage is not None and hasattr(storage, "engine"):
            storage.engine.dispose()
        for p in created:
            try:
                p.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                log.debug("cannot remove %s: %s", p, e)
    return None


def read_study(url: str, name: str | None, wait: float = 20.0) -> dict[str, Any]:
    """A study's results as its storage holds them, read from any machine without measuring: its search (the
    model, objective, machine kind), the finished trials with their figures, the best feasible setting by the
    search's figures, the trials per worker and the failed ones. `name` None: the storage's one study."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if storage_file(url) is not None and not os.path.exists(storage_file(url)):
        raise UsageError(f"tune storage {redact(url)}: {storage_file(url)} does not exist")
    storage = open_storage(url, wait=wait, create=False)
    S = optuna.trial.TrialState
    with interrupts.deferred():
        try:
            names = sorted(s.study_name for s in storage.get_all_studies())
            if name is None:
                if len(names) != 1:
                    raise UsageError(f"tune storage {redact(url)} holds {len(names)} studies"
                                     + (f" ({', '.join(names[:10])})" if names else "")
                                     + "; name one with study (--study)")
                name = names[0]
            if name not in names:
                raise UsageError(f"no study {name!r} in tune storage {redact(url)}"
                                 + (f"; it holds {', '.join(names[:10])}" if names else "; it holds none"))
            study = optuna.load_study(study_name=name, storage=storage)
            all_trials = study.get_trials(deepcopy=False)
        except OptkitError:
            raise
        except Exception as e:  # noqa: BLE001 - the database failed under us
            cause = database_error(e)
            if cause is not None:
                raise UsageError(f"cannot read tune storage {redact(url)}: {db_message(cause)}") from None
            raise
    search = study.user_attrs.get("optkit") or {}
    objective = search.get("objective") or ["throughput"]
    figure, direction = OBJECTIVES.get(objective[0], OBJECTIVES["throughput"])
    finished = [t for t in all_trials if t.state in (S.COMPLETE, S.PRUNED) and not t.user_attrs.get("skipped")
                and "figures" in t.user_attrs]
    rows = [{"number": t.number, "state": t.state.name.lower(), "setting": t.user_attrs.get("setting"),
             "label": Setting(**t.user_attrs["setting"]).label() if "setting" in t.user_attrs else "",
             "figures": t.user_attrs["figures"], "worker": workers.worker_label(t.user_attrs.get("worker")),
             "feasible": all(v <= 0 for v in t.user_attrs.get("constraints", [])),
             **({"duplicate_of": t.user_attrs["duplicate_of"]} if "duplicate_of" in t.user_attrs else {})}
            for t in finished]
    ranked = sorted((r for r in rows if r["state"] == "complete" and r["feasible"] and "duplicate_of" not in r
                     and r["figures"].get(figure) is not None),
                    key=lambda r: -r["figures"][figure] if direction == "maximize" else r["figures"][figure])
    # the study's shared confirmation (result.Confirmation.shared), the latest: its winner is the workers' best
    confirmation = next((t for t in reversed(all_trials) if t.state != S.RUNNING and t.user_attrs.get("confirmed")),
                        None)
    if confirmation is not None:
        won = confirmation.user_attrs["confirmed"][0]
        best = {"setting": won["setting"], "label": won["label"], "figures": won["figures"], "trial": won["number"],
                "confirmed": won["confirmed"],
                "confirmed_by": workers.worker_label(confirmation.user_attrs.get("worker"))}
    else:
        best = ({"setting": ranked[0]["setting"], "label": ranked[0]["label"], "figures": ranked[0]["figures"],
                 "trial": ranked[0]["number"], "confirmed": None} if ranked else None)
    failed = [{"number": t.number, "worker": workers.worker_label(t.user_attrs.get("worker")),
               "reason": t.user_attrs.get("failed", STALE_REASON)} for t in all_trials
              if t.state == S.FAIL and not t.user_attrs.get("confirm")]
    return {"storage": redact(url), "study": name, "search": search, "objective": objective,
            "objective_figure": figure, "direction": direction,
            "machine": search.get("machine"),
            "trials": len(rows), "pruned": sum(r["state"] == "pruned" for r in rows),
            "duplicates": sum("duplicate_of" in r for r in rows), "failed": len(failed),
            "running": sum(1 for t in all_trials if t.state == S.RUNNING and not t.user_attrs.get("skipped")),
            "workers": workers.workers_of(finished),
            "best": best,
            "rows": rows, "failed_trials": failed}