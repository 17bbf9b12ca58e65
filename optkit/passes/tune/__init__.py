"""`optkit tune`: the serving settings of an ONNX model found by Bayesian search (Optuna's TPE).

The space: intra- and inter-op threads, execution mode, graph optimisation level, batch size (when the model
batches), requests in flight and sessions, memory arena and pattern, and the execution provider where more than
one is present. Each trial measures one setting under load in a child process (measure.serving); a short probe
first stops a setting that clearly misses the service-level objective (a pruned trial). Settings that miss an
SLO or the memory limit are infeasible: TPE learns from them through its constraints.

The study lives in Optuna storage: by default an SQLite file of optkit's own beside the output
(`best.optkit-study.db`; a recipe's tune.onnx stage: in its run folder, stage_study_path), so an interrupted
tune resumes; `--storage URL --study NAME` shares one study between machines (each runs the same command;
together they run `trials` trials, and a setting already measured is not measured again). After the search,
the best few settings are measured again in interleaved rounds: those whose interval overlaps the winner's are
ties.

The search is optkit's own ask-and-tell loop, so an interrupt lands where optkit can handle it: Optuna's and the
storage's calls run with Ctrl-C and SIGTERM deferred (core.interrupts.deferred), and a trial cut short is told
FAIL. A trial whose worker is gone (killed) is found on the next run: on this machine by its process, elsewhere by
its heartbeat, and marked failed. `time_budget` bounds everything after the model is loaded: each trial's child
is stopped when the budget runs out (a failed trial, with the reason), and the confirmation gets what is left.

The package, one file per part: `config` (TuneConfig, Slo, Goal), `space` (the search space), `trial` (one
child-process measurement per trial), `storage` (Optuna storages, schema checks, retries), `workers` (who runs a
trial, heartbeats), `study` (the study: created, resumed, stale trials, read back), `result` (confirmation rounds,
ties, the result dict), `search` (Tuner, the whole tune) and `tune_onnx` (the pass).
"""
from __future__ import annotations

from optkit.core.dburl import DRIVERS, is_sqlite
from optkit.passes.tune.config import DIMENSIONS, OBJECTIVES, Goal, Slo, TuneConfig, num, short
from optkit.passes.tune.result import ROUNDS, Confirmation, summarize
from optkit.passes.tune.search import Tuner
from optkit.passes.tune.space import default_space, grid, starting_points, suggest
from optkit.passes.tune.storage import (
    STUDY_SUFFIX,
    check_server_schema,
    check_storage_file,
    default_study_path,
    open_storage,
    redact,
    sqlite_url,
    stage_study_path,
    storage_file,
)
from optkit.passes.tune.study import fail_stale, read_study
from optkit.passes.tune.trial import Measurer, TrialRunner, model_inputs, trial_limit
from optkit.passes.tune.tune_onnx import TuneOnnx
from optkit.passes.tune.workers import kind_label, machine_kind, worker_label

_redact = redact  # the name tests and older callers use
_kind_label = kind_label

__all__ = ["DIMENSIONS", "DRIVERS", "OBJECTIVES", "ROUNDS", "STUDY_SUFFIX", "Confirmation", "Goal", "Measurer",
           "Slo", "TrialRunner", "TuneConfig", "TuneOnnx", "Tuner", "check_server_schema", "check_storage_file",
           "default_space", "default_study_path", "fail_stale", "grid", "is_sqlite", "kind_label", "machine_kind",
           "model_inputs", "num", "open_storage", "read_study", "redact", "short", "sqlite_url",
           "stage_study_path", "starting_points", "storage_file", "suggest", "summarize", "trial_limit",
           "worker_label"]
