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
"""
from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import re
import socket
import sqlite3
import threading
import time
import urllib.parse
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from optkit.core import dburl, interrupts
from optkit.core.artifact import Artifact
from optkit.core.batching import first_call
from optkit.core.dburl import DRIVERS, is_sqlite  # noqa: F401 - tune's names
from optkit.core.errors import EXIT_PASS, DependencyError, OptkitError, UsageError, ValidationError
from optkit.core.formats import Format
from optkit.core.isolate import TimedOut, run_isolated
from optkit.core.registry import Pass, PassConfig, PassContext, cli, register
from optkit.core.text import first_line, redact_url
from optkit.measure.model import MeasureSettings, synthesized
from optkit.measure.serving import PROBE_S, Setting, batch_feeds, measure_setting
from optkit.measure.trials import t95
from optkit.onnx.io import copy_model
from optkit.onnx.session import OrtSettings

log = logging.getLogger(__name__)

# objective -> (figure, direction)
OBJECTIVES = {"throughput": ("throughput_per_s", "maximize"), "latency": ("p50_ms", "minimize"),
              "cost": ("cpu_s_per_1k", "minimize")}
SLO_FIGURES = {"p50": "p50_ms", "p90": "p90_ms", "p99": "p99_ms", "throughput": "throughput_per_s"}
DIMENSIONS = ("provider", "threads", "execution_mode", "inter_op_threads", "graph_optimization", "batch",
              "concurrency", "sessions", "cpu_mem_arena", "mem_pattern")
BATCHES = (1, 2, 4, 8, 16, 32, 64)
ROUNDS = 3  # confirmation rounds of the best settings
STUDY_SUFFIX = ".optkit-study.db"  # the default study file beside -o: a name no user file has
HEARTBEAT_S, GRACE_S = 5, 30  # a running trial's heartbeat; a trial silent for longer has lost its worker
POLL_S = 0.5  # how often a worker looks again at another worker's running trial it waits for
SETUP_S = 1.0  # a trial's child start, sessions and warm-up, before any trial has shown what it takes here
# a trial's child is stopped after its probe, its timed seconds and max(TRIAL_MARGIN_S, 10 x the timed seconds)
# for its start, sessions and warm-up (and at the time budget, when that comes first)
TRIAL_MARGIN_S = 30.0
POOL_PER_CORE = 2  # the threads a setting's sessions start may be at most this many per core


def trial_limit(trial_seconds: float) -> float:
    """Seconds a trial's child may take: the probe, the timed seconds, and a margin for set-up."""
    return PROBE_S + trial_seconds + max(TRIAL_MARGIN_S, 10 * trial_seconds)


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def pool_threads(setting: Setting) -> int:
    """The threads a setting's sessions start beside the threads that call them: per session, its intra-op
    threads but one (the caller runs one), and in parallel mode its inter-op threads but one. onnxruntime's
    pool threads spin while they wait, so more of them than the cores starve each other: 256 sessions of two
    threads on 2 cores take tens of seconds just to open."""
    n = setting.concurrency if setting.sessions == "per-thread" else 1
    each = (setting.threads or cores()) - 1
    if setting.session.execution_mode == "parallel":
        each += (setting.session.inter_op_threads or cores()) - 1
    return n * each


def pool_cap() -> int:
    return POOL_PER_CORE * cores()


def _least_pool(space: dict[str, list[Any]], fixed: dict[str, Any] | None = None) -> Setting:
    """The setting of the space (with `fixed` values) that starts the fewest pool threads."""
    fixed = fixed or {}

    def pick(name: str) -> Any:
        if name in fixed:
            return fixed[name]
        choices = space[name]
        if name == "execution_mode":
            return "sequential" if "sequential" in choices else choices[0]
        if name == "sessions":
            return "shared" if "shared" in choices else choices[0]
        if name in ("threads", "inter_op_threads", "concurrency"):
            return min(choices)
        return choices[0]

    return _setting(pick)


def check_pool(space: dict[str, list[Any]]) -> None:
    """Up front: a space whose every setting starts more pool threads than the cap is refused."""
    least = _least_pool(space)
    if pool_threads(least) > pool_cap():
        raise UsageError(f"every setting of this space starts more than {pool_cap()} onnxruntime pool threads on "
                         f"{cores()} cores (the fewest: {least.label()}, {pool_threads(least)} threads), which "
                         "starve each other; give space (--space) threads=1, sessions=shared or fewer in flight")


class Slo:
    """A service-level objective: `p99<=20ms`, `p50 < 5 ms`, `throughput>=200`."""

    _RE = re.compile(r"^\s*(p50|p90|p99|throughput)\s*(<=|<|>=|>)\s*(\d+(?:\.\d*)?(?:e[-+]?\d+)?|\.\d+)\s*"
                     r"(ms|s|us|/s)?\s*$", re.I)

    def __init__(self, text: str):
        m = self._RE.match(text)
        if not m:
            raise UsageError(f"cannot read SLO {text!r}; write it as p50|p90|p99<=MILLISECONDS ms or "
                             "throughput>=SAMPLES/s, e.g. 'p99<=20ms'")
        what, op, value, unit = m[1].lower(), m[2], float(m[3]), (m[4] or "").lower()
        if (what == "throughput") != (unit in ("", "/s")) and unit:
            raise UsageError(f"SLO {text!r}: {what} is in " + ("samples/s" if what == "throughput" else
                                                                "ms, s or us"))
        if what == "throughput" and op in ("<", "<=") or what != "throughput" and op in (">", ">="):
            raise UsageError(f"SLO {text!r} asks for {'less throughput' if what == 'throughput' else 'more latency'}"
                             "; write p99<=X ms or throughput>=Y")
        if not math.isfinite(value) or value <= 0:
            raise UsageError(f"SLO {text!r}: the limit must be a finite positive number")
        self.text, self.figure = text.strip(), SLO_FIGURES[what]
        self.limit = value * {"s": 1e3, "us": 1e-3}.get(unit, 1.0)
        self.upper = what != "throughput"

    def violation(self, figures: dict) -> float:
        """<= 0 when met; else how far off, relative to the limit."""
        v = figures.get(self.figure)
        if v is None or not math.isfinite(v):
            return math.inf
        return (v - self.limit) / self.limit if self.upper else (self.limit - v) / self.limit

    def hopeless(self, probe: dict) -> bool:
        """A short probe is off by more than noise explains: p50 already over twice a latency limit (tail
        percentiles are higher still), or under half the throughput asked for."""
        v = probe.get(self.figure if not self.upper else "p50_ms")
        return v is not None and (v > 2 * self.limit if self.upper else v < self.limit / 2)


class TuneConfig(PassConfig):
    objective: list[Literal["throughput", "latency", "cost"]] = Field(
        default_factory=lambda: ["throughput"], min_length=1,
        description="throughput (samples/s), latency (p50 of one request) or cost (CPU seconds per 1,000 samples); "
                    "repeat or comma-separate for a multi-objective search (default: throughput).",
        json_schema_extra=cli("--objective"))
    slo: list[str] = Field(default_factory=list, description="A service-level objective every chosen setting "
                                                             "meets: 'p99<=20ms', 'throughput>=200' (repeatable).",
                           json_schema_extra=cli("--slo", group="budgets"))
    max_memory_mb: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                        description="Peak memory (RSS) a setting may use, in MiB.",
                                        json_schema_extra=cli("--max-memory", kind="str", group="budgets",
                                                              help="Peak memory a setting may use, e.g. 2GB."))
    trials: int = Field(default=40, ge=1, le=10_000, strict=True, description="Trials in the study.",
                        json_schema_extra=cli("--trials", group="budgets"))
    time_budget: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                      description="Stop searching after this many seconds.",
                                      json_schema_extra=cli("--time-budget", kind="str", group="budgets",
                                                            help="Stop searching after this long, e.g. 10m."))
    # timed, after a short probe
    trial_seconds: float = Field(default=1.0, gt=0, le=600, allow_inf_nan=False,
                                 description="Timed seconds per trial (default 1). A trial's child is stopped after "
                                             "its 0.25 s probe, these seconds and max(30 s, 10x these) for set-up "
                                             "(a failed trial, with the reason).",
                                 json_schema_extra=cli("--trial-seconds", group="measurement"))
    # a dimension's choices (replaces the default)
    space: dict[str, list[Any]] = Field(default_factory=dict,
                                        description="A dimension's choices, replacing the default ones "
                                                    "(default: every dimension searched).",
                                        json_schema_extra=cli("--space", kind="list", help=(
                                            "A dimension's choices, e.g. batch=1,8,32 or threads=1,2 "
                                            "(repeatable; default: every dimension searched).")))
    storage: str | None = Field(default=None, description="Optuna storage shared by workers: sqlite:///f.db, "
                                                          "postgresql://..., mysql://... or journal:FILE (default: "
                                                          "OUT.optkit-study.db beside -o, so a stopped tune "
                                                          "resumes).",
                                json_schema_extra=cli("--storage"))
    study: str | None = Field(default=None, description="Study name (with --storage: the same name on every "
                                                        "worker).", json_schema_extra=cli("--study"))
    storage_wait: float = Field(default=20.0, gt=0, le=3600, allow_inf_nan=False,
                                description="Seconds a database server may take to accept the first connection "
                                            "(refused, timed out, starting up): tried again every 0.5-4 s, each try "
                                            "bounded by 5 s; then exit 2 (default 20).",
                                json_schema_extra=cli("--storage-wait"))
    seed: int = Field(default=0, ge=0, strict=True, description="Sampler seed.", json_schema_extra=cli("--seed"))
    # best settings measured again in ROUNDS interleaved rounds: ties, and the best's interval (1: the best
    # only, for its interval; 0: none)
    confirm: int = Field(default=3, ge=0, le=20, strict=True,
                         description="Best settings measured again in 3 interleaved rounds to tell a win from noise "
                                     "(default 3; 1: the best only, for its 95% interval; 0: none).",
                         json_schema_extra=cli("--confirm", group="measurement"))

    @field_validator("objective")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("an objective is named twice")
        return v

    @field_validator("slo")
    @classmethod
    def _slo(cls, v: list[str]) -> list[str]:
        for text in v:
            try:
                Slo(text)
            except UsageError as e:  # a ValueError keeps the key's path for the recipe's error line
                raise ValueError(e.message) from None
        return v

    @field_validator("space")
    @classmethod
    def _space(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for name, choices in v.items():
            try:
                if name not in DIMENSIONS:
                    import difflib

                    close = difflib.get_close_matches(name, DIMENSIONS, n=1)
                    raise UsageError(f"unknown tune dimension {name!r}; " + (
                        f"did you mean {close[0]!r}?" if close else f"known: {', '.join(DIMENSIONS)}"))
                if not choices:
                    raise UsageError(f"tune dimension {name!r} has no choices")
                for c in choices:
                    _choice(name, c)
            except UsageError as e:
                raise ValueError(e.message) from None
        return v


# ------------------------------------------------------------------------------------------------ the space
def default_space(cfg: TuneConfig, batchable: bool, providers: list[str],
                  no_batch: str | None = None) -> dict[str, list[Any]]:
    cpus = os.cpu_count() or 1
    threads = sorted({2 ** i for i in range(int(math.log2(cpus)) + 1)} | {cpus})
    single = cfg.objective == ["latency"]  # one request at a time: batch and concurrency stay 1
    space: dict[str, list[Any]] = {
        "provider": providers,
        "threads": threads,
        "execution_mode": ["sequential", "parallel"],
        "inter_op_threads": threads,
        "graph_optimization": ["disable", "basic", "extended", "all"],
        "batch": list(BATCHES) if batchable and not single else [1],
        "concurrency": [1] if single else sorted({2 ** i for i in range(int(math.log2(2 * cpus)) + 1)}),
        "sessions": ["shared", "per-thread"],
        "cpu_mem_arena": [True, False],
        "mem_pattern": [True, False],
    }
    for name, choices in cfg.space.items():  # checked by TuneConfig
        values = list(dict.fromkeys(_choice(name, c) for c in choices))
        if name == "batch" and not batchable and values != [1]:
            raise UsageError(f"space (--space) batch cannot be searched: the model cannot batch ({no_batch or 'no batch axis'})")
        space[name] = values
    return space


def _choice(name: str, value: Any) -> Any:
    """A choice from the command line or a recipe, checked against what the dimension takes."""
    ints = ("threads", "inter_op_threads", "batch", "concurrency")
    words = {"provider": ("cpu", "cuda", "tensorrt"), "execution_mode": ("sequential", "parallel"),
             "graph_optimization": ("disable", "basic", "extended", "all"), "sessions": ("shared", "per-thread")}
    text = str(value).strip().lower()
    if name in ints:
        most = {"batch": 65536, "concurrency": 256}.get(name, 256)
        if not text.isdigit() or not 1 <= int(text) <= most:
            raise UsageError(f"tune dimension {name}: {value!r} is not a count from 1 to {most}")
        return int(text)
    if name in words:
        if text not in words[name]:
            raise UsageError(f"tune dimension {name}: {value!r} is not one of {', '.join(words[name])}")
        return text
    if text in ("true", "1", "on", "yes"):
        return True
    if text in ("false", "0", "off", "no"):
        return False
    raise UsageError(f"tune dimension {name}: {value!r} is not true or false")


def starting_points(space: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The first settings a study measures, before the sampler learns: onnxruntime's default (every core on
    one request), every core on the largest batch, and one single-threaded session per core at the largest
    and the smallest batch. Throughput optima on CPUs usually sit near one of them; the search refines."""
    def fit(want: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for name, value in want.items():
            choices = space.get(name, [])
            if len(choices) > 1:
                out[name] = min(choices, key=lambda c: abs(c - value)) if isinstance(value, int) and not \
                    isinstance(value, bool) else (value if value in choices else choices[0])
        return out

    cores, batches = max(space["threads"]), space["batch"]
    points = [{"threads": cores, "batch": min(batches), "concurrency": 1},
              {"threads": cores, "batch": max(batches), "concurrency": 1},
              {"threads": 1, "batch": max(batches), "concurrency": cores, "sessions": "per-thread"},
              {"threads": 1, "batch": min(batches), "concurrency": cores, "sessions": "per-thread"}]
    unique = []
    for p in map(fit, points):
        if p and p not in unique and pool_threads(_least_pool(space, p)) <= pool_cap():
            unique.append(p)
    return unique


def suggest(trial, space: dict[str, list[Any]]) -> Setting:
    """The setting an Optuna trial asks for; inter-op threads only in parallel mode, sessions only with more
    than one request in flight."""
    def pick(name: str) -> Any:
        choices = space[name]
        return choices[0] if len(choices) == 1 else trial.suggest_categorical(name, choices)

    return _setting(pick)


def grid(space: dict[str, list[Any]]) -> list[Setting]:
    """Every setting of the space (the same conditions as `suggest`): what an exhaustive search measures."""
    out, seen = [], set()
    names = list(space)
    for combo in itertools.product(*(space[n] for n in names)):
        values = dict(zip(names, combo))
        s = _setting(values.__getitem__)
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def _setting(pick) -> Setting:
    mode = pick("execution_mode")
    concurrency = pick("concurrency")
    return Setting(provider=pick("provider"), threads=pick("threads"), batch=pick("batch"), concurrency=concurrency,
                   sessions=pick("sessions") if concurrency > 1 else "shared",
                   session=OrtSettings(execution_mode=mode,
                                       inter_op_threads=pick("inter_op_threads") if mode == "parallel" else None,
                                       graph_optimization=pick("graph_optimization"),
                                       cpu_mem_arena=pick("cpu_mem_arena"), mem_pattern=pick("mem_pattern")))


# ------------------------------------------------------------------------------------------------ inputs
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


def providers_here() -> list[str]:
    import onnxruntime as ort

    have = ort.get_available_providers()
    return ["cpu"] + [p for p, name in (("cuda", "CUDAExecutionProvider"), ("tensorrt", "TensorrtExecutionProvider"))
                      if name in have]


# ------------------------------------------------------------------------------------------------ storage
CONNECT_TIMEOUT_S = 5  # one connection try to a database server (its driver's connect_timeout)
# what a database server says while it is down, starting, stopping or full: worth trying again
_TRANSIENT = re.compile(r"refused|timeout expired|timed out|starting up|shutting down|not yet accepting|recovery mode|"
                        r"too many (clients|connections)|remaining connection slots|could not receive data|"
                        r"server closed the connection|connection reset|no route to host|temporarily unavailable|"
                        r"could not connect|can't connect|lost connection|consuming input failed|"
                        r"terminating connection", re.I)


def default_study_path(output: Path) -> Path:
    """The default study file beside `-o`: best.json -> best.optkit-study.db (a name of optkit's own)."""
    return output.with_name(output.stem + STUDY_SUFFIX)


def stage_study_path(ctx) -> Path:
    """The default study of a tune.onnx stage: in a recipe's run folder beside the stage's folder
    (runs/<recipe>/<run-id>/NN-<stage>.optkit-study.db, where a run stopped mid-tune resumes it), for run_pass
    beside its output (OUT.optkit-study.db, as optkit tune keeps it); never in the user's cache. The runner
    names that place as the context's `aside` (where a refused result is kept: NN-<stage>.REJECTED.onnx)."""
    if ctx.aside is None:
        return default_study_path(Path(ctx.output))
    aside = Path(ctx.aside)
    return aside.with_name(aside.stem.removesuffix(".REJECTED") + STUDY_SUFFIX)


def sqlite_url(path: Path) -> str:
    """The sqlite:/// URL that SQLAlchemy resolves to exactly `path` (a '?' or '%' in a folder's name escaped,
    else the URL would name another file)."""
    path = Path(path).absolute()
    url = "sqlite:///" + str(path).replace("%", "%25").replace("?", "%3F")
    if storage_file(url) != path:
        raise UsageError(f"the tune study file {path} cannot be named in an SQLite URL; give another -o or "
                         "storage (--storage)")
    return url


def storage_file(url: str) -> Path | None:
    """The file a storage keeps its study in: a journal:PATH, or the file an SQLite URL really opens, resolved
    as SQLAlchemy and SQLite resolve it (relative or absolute, query strings, `sqlite+pysqlite://`, URI filenames
    `file:...?...&uri=true`). None for a database server or an SQLite database in memory. An SQLite URL whose
    file cannot be told is refused (UsageError)."""
    if url.startswith("journal:"):
        return Path(url[len("journal:"):]).absolute() if url[len("journal:"):] else None
    if not is_sqlite(url):
        return None
    return _sqlite_file(url)


def _sqlite_file(url: str) -> Path | None:
    return dburl.sqlite_file(url, "tune storage")


_db_message = dburl.db_message


def _optuna_schema() -> dict[str, set[str] | None]:
    """Optuna's tables and their columns (None: the columns are not known)."""
    try:
        from optuna.storages._rdb.models import BaseModel

        schema: dict[str, set[str] | None] = {name: {c.name for c in t.columns}
                                               for name, t in BaseModel.metadata.tables.items()}
    except Exception:  # noqa: BLE001 - a moved private module: Optuna 5's tables, columns unchecked
        schema = dict.fromkeys(("studies", "study_directions", "study_system_attributes", "study_user_attributes",
                                "trial_heartbeats", "trial_intermediate_values", "trial_params",
                                "trial_system_attributes", "trial_user_attributes", "trial_values", "trials",
                                "version_info"))
    return schema | {"alembic_version": {"version_num"}}


def _schema_problem(tables: set[str], others: set[str], columns: Callable[[str], set[str]]) -> str | None:
    """None when a database (its tables, its views and triggers, a table's columns) is empty or exactly an
    Optuna study's (every table of Optuna's, with its columns, and nothing else); else what it holds instead."""
    if not tables and not others:
        return None
    schema = _optuna_schema()
    problem = dburl.foreign(tables, others, columns, schema, "Optuna", "an Optuna study")
    if problem:
        return problem
    missing = sorted(set(schema) - tables)
    if missing:  # PARTIAL: perhaps another worker is creating the study's tables right now
        return (f"holds only some of an Optuna study's tables ({dburl.shown(sorted(tables))}; "
                f"no {dburl.shown(missing)}), not a whole study{PARTIAL}")
    return None


PARTIAL = "\0"  # marks a schema problem another worker creating the tables explains for a moment
SCHEMA_WAIT_S = 3.0  # how long a partial Optuna schema is given to become whole


def _settled(read: Callable[[], str | None]) -> str | None:
    """A schema problem that stays: a partial Optuna schema (tables with Optuna's columns, some missing) is read
    again for up to SCHEMA_WAIT_S, as a worker starting beside this one may be creating it."""
    end = time.monotonic() + SCHEMA_WAIT_S
    while True:
        problem = read()
        if not problem or not problem.endswith(PARTIAL):
            return problem
        if time.monotonic() >= end:
            return problem[:-len(PARTIAL)]
        time.sleep(0.25)


def _sqlite_schema_problem(con: sqlite3.Connection) -> str | None:
    objects = con.execute("SELECT type, name FROM sqlite_master WHERE type IN ('table', 'view', 'trigger') "
                          "AND name NOT LIKE 'sqlite_%'").fetchall()
    return _schema_problem({n for t, n in objects if t == "table"}, {n for t, n in objects if t != "table"},
                           lambda name: {row[1] for row in con.execute(f'PRAGMA table_info("{name}")')})


def check_server_schema(url: str, wait: float | None = None) -> bool:
    """Before Optuna creates its tables in a database server's database: it is empty or exactly an Optuna
    study's, as an SQLite file must be (its default schema; read only). True when it holds Optuna's tables."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, **engine_kwargs(url, wait))
    seen: set[str] = set()

    def read() -> str | None:
        tables, views, columns = dburl.read_schema(engine)
        seen.clear()
        seen.update(tables)
        return _schema_problem(tables, views, columns)

    try:
        problem = _settled(read)
    finally:
        engine.dispose()
    if problem:
        raise UsageError(f"database {_redact(url)} {problem}; optkit does not write into it: give another "
                         "storage (--storage), a database of its own")
    return "studies" in seen


def check_storage_file(url: str) -> None:
    """Before any work: an existing SQLite file (however its URL names it) is used only when it is empty or
    exactly an Optuna study's database. optkit never adds its tables to someone's own database."""
    if not is_sqlite(url):
        return
    path = storage_file(url)
    if path is None:
        return
    hint = ("give another -o or storage (--storage)" if path.name.endswith(STUDY_SUFFIX)
            else "give another storage (--storage)")
    if not dburl.has_sqlite_data(path, "the tune study file", hint):
        return

    def read() -> str | None:
        con = sqlite3.connect(f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro", uri=True)
        try:
            return _sqlite_schema_problem(con)
        finally:
            con.close()

    try:
        problem = _settled(read)
    except sqlite3.Error as e:
        raise UsageError(f"cannot read the tune study file {path}: {first_line(e)}") from None
    if problem:
        raise UsageError(f"{path} {problem}; optkit does not write into it: {hint}")


def open_storage(url: str, stale_callback=None, wait: float = 20.0, create: bool = True):
    """An Optuna storage: a database URL (sqlite:///file.db, postgresql://..., mysql://...) or journal:PATH (a
    journal file several processes can share). A database gets Optuna's heartbeat (HEARTBEAT_S, GRACE_S):
    `stale_callback(study, trial)` hears of each trial failed because its worker went silent. A database server
    that does not accept a connection yet is tried again for up to `wait` seconds (connection_retries). Without
    `create`, a server database that holds no Optuna tables is a UsageError (a reader writes nothing there)."""
    import optuna

    try:
        if url.startswith("journal:"):
            from optuna.storages.journal import JournalFileBackend

            path = url[len("journal:"):]
            if not path or not Path(path).parent.is_dir():
                raise UsageError(f"journal storage {url!r}: the folder of {path or '(no path)'} does not exist")
            if os.path.exists(path) and not Path(path).is_file():  # a FIFO blocked Optuna's read for ever
                raise UsageError(f"journal storage {path} exists and is not a regular file; give another storage "
                                 "(--storage)")
            try:
                return optuna.storages.JournalStorage(JournalFileBackend(path))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise UsageError(f"{path} is not an Optuna journal file") from None
        if "://" not in url:
            raise UsageError(f"cannot read storage {url!r}: give a database URL (sqlite:///tune.db, "
                             "postgresql://user@host/db) or journal:PATH")
        if is_sqlite(url):  # an SQLite file was checked before any work
            return _rdb(url, stale_callback)

        def connect():
            if not check_server_schema(url, wait) and not create:
                raise UsageError(f"no study in tune storage {_redact(url)}: the database holds none (no Optuna "
                                 "tables); start a study there with optkit tune --storage")
            return _rdb(url, stale_callback, wait=wait)

        return connection_retries(url, connect, wait)
    except (UsageError, DependencyError):
        raise
    except ImportError as e:  # a missing database driver (optuna wraps sqlalchemy's ModuleNotFoundError)
        missing = getattr(e.__cause__, "name", None) or getattr(e, "name", None)
        package = DRIVERS.get(missing or "", missing)
        raise DependencyError(f"storage {url.split(':')[0]} needs its database driver"
                              + (f": pip install {package}" if package else f" ({first_line(e)[:120]})")) from None
    except Exception as e:  # noqa: BLE001 - sqlalchemy and drivers raise many kinds: the user's URL is wrong
        raise UsageError(f"cannot open tune storage {_redact(url)}: {_db_message(e)}") from None


def _rdb(url: str, stale_callback=None, attempts: int = 10, wait: float | None = None):
    """An RDB storage; workers starting together race to create its tables, so a clash is retried."""
    import optuna
    import sqlalchemy.exc

    def make():
        with warnings.catch_warnings():  # the heartbeat is "experimental" (there since Optuna 2.5)
            warnings.simplefilter("ignore")
            return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True, **engine_kwargs(url, wait)},
                                              heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
                                              heartbeat_stale_trial_callback=stale_callback)

    for i in range(attempts - 1):
        try:
            return make()
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError, sqlalchemy.exc.ProgrammingError) as e:
            # SQLite: "locked", "UNIQUE"; PostgreSQL: "relation ... already exists" (ProgrammingError),
            # "duplicate key value" on its catalog (IntegrityError)
            if not any(w in str(e) for w in ("locked", "UNIQUE", "already exists", "duplicate key")):
                raise
            time.sleep(0.2 * (i + 1))
    return make()


STALE_REASON = "its worker's heartbeat stopped (failed by the heartbeat, not counted)"


def engine_kwargs(url: str, wait: float | None = None) -> dict[str, Any]:
    """A database server's connection bounded in time: its driver's connect_timeout (CONNECT_TIMEOUT_S) unless the
    URL sets one. A server that accepts TCP and never answers would otherwise hold a worker forever."""
    scheme = url.split(":", 1)[0].lower()
    if not scheme.startswith(("postgresql", "postgres", "mysql", "mariadb")) or "connect_timeout" in url:
        return {}
    timeout = CONNECT_TIMEOUT_S if wait is None else max(2, min(CONNECT_TIMEOUT_S, math.ceil(wait)))
    return {"connect_args": {"connect_timeout": timeout}}


def transient(e: BaseException) -> bool:
    """A database error that says the server is not there (yet): refused, timed out, starting or stopping, full.
    A wrong password, a missing database or role is not: trying again changes nothing."""
    import sqlalchemy.exc

    if not isinstance(e, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError, ConnectionError,
                          TimeoutError)):
        return False
    text = str(getattr(e, "orig", None) or e)
    if re.search(r"password|authentication|does not exist|permission denied|access denied|no pg_hba", text, re.I):
        return False
    return bool(_TRANSIENT.search(text))


def connection_retries(url: str, connect: Callable[[], Any], wait: float):
    """`connect()` tried again while the server does not accept connections, with back-off (0.5 s doubling to
    4 s), for at most `wait` seconds (each try bounded by its connect_timeout); then a UsageError that states the
    limit, the tries and the server's last word."""
    start, tries, pause = time.monotonic(), 0, 0.5
    while True:
        tries += 1
        try:
            return connect()
        except Exception as e:  # noqa: BLE001 - sorted below: only a server that is not there is tried again
            if not transient(e):
                raise
            left = wait - (time.monotonic() - start)
            if left <= 0:
                raise UsageError(f"tune storage {_redact(url)} did not accept a connection within {wait:g} s "
                                 f"({tries} tr{'ies' if tries > 1 else 'y'}, the last: {_db_message(e)}); start the "
                                 "database server, or give storage_wait (--storage-wait) more seconds") from None
            log.info("tune storage %s: %s; trying again (%.0f s left)", _redact(url), _db_message(e), left)
            time.sleep(min(pause, left))
            pause = min(2 * pause, 4.0)


def _side_files(path: Path) -> list[Path]:
    """A study file and the files SQLite (or a journal's lock) keeps beside it."""
    return [path, *(path.with_name(path.name + s) for s in ("-journal", "-wal", "-shm", ".lock"))]


def _redact(url: str) -> str:
    """A storage URL fit to show: its password masked (core.text.redact_url)."""
    return redact_url(url)


# ------------------------------------------------------------------------------------------------ workers
def _host() -> str:
    """This machine: its name and boot (a pid means nothing on another machine or after a reboot)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def machine_kind() -> dict[str, Any]:
    """What a trial's figures depend on besides the setting: the CPU (its model), how many cores this process may
    use, the architecture. Part of a study's identity: figures measured on different kinds are never mixed."""
    import platform

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model", "Hardware")):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"arch": platform.machine(), "cpu": cpu or platform.processor(), "cores": cores()}


def _kind_label(kind: Any) -> str:
    if not isinstance(kind, dict):
        return "an unknown machine (a study made before optkit recorded the machine)"
    return f"{kind.get('cpu') or '?'}, {kind.get('cores')} cores, {kind.get('arch')}"


def worker_label(worker: Any) -> str:
    """A worker as people read it: its host name and process id."""
    if not isinstance(worker, dict):
        return "(no worker)"
    return f"{str(worker.get('host', '?')).split('/')[0]} pid {worker.get('pid', '?')}"


def _this_worker() -> dict[str, Any]:
    import psutil

    return {"host": _host(), "pid": os.getpid(), "started": psutil.Process().create_time()}


def _worker_alive(worker: Any) -> bool | None:
    """Whether the process that runs a trial is still there: True or False on this machine, None elsewhere."""
    import psutil

    if not isinstance(worker, dict) or worker.get("host") != _host():
        return None
    try:
        p = psutil.Process(int(worker["pid"]))
        return abs(p.create_time() - float(worker["started"])) < 1.0 and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


class _Heartbeat:
    """While a trial runs, tell the storage every HEARTBEAT_S seconds that its worker lives: Optuna's heartbeat
    on a database, a `heartbeat` user attribute in a journal (which has none)."""

    def __init__(self, storage, trial_id: int):
        self.storage, self.trial_id, self.stop = storage, trial_id, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="optkit-tune-heartbeat")

    def beat(self) -> None:
        try:
            if hasattr(self.storage, "record_heartbeat") and self.storage.get_heartbeat_interval():
                self.storage.record_heartbeat(self.trial_id)
            else:
                self.storage.set_trial_user_attr(self.trial_id, "heartbeat", time.time())
        except Exception as e:  # noqa: BLE001 - a missed beat is not worth stopping a tune for
            log.debug("tune heartbeat: %s", first_line(e))

    def _loop(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            self.beat()

    def __enter__(self):
        with interrupts.deferred():  # never half a write
            self.beat()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


# ------------------------------------------------------------------------------------------------ the search
class Tuner:
    """One tune: the search, then the confirmation of the best settings. `run()` returns the result dict
    (what the report keeps under measurements.tune and the best-settings JSON holds)."""

    def __init__(self, artifact: Artifact, cfg: TuneConfig, *, settings: MeasureSettings, data,
                 default_storage: Path, notes: list[str]):
        if artifact.format != Format.ONNX:
            raise UsageError(f"optkit tune searches onnxruntime settings: {artifact.path} is "
                             f"{artifact.format.value}; convert it to ONNX first (optkit convert)")
        self.artifact, self.cfg, self.settings, self.data, self.notes = artifact, cfg, settings, data, notes
        self.slos = [Slo(s) for s in cfg.slo]
        self.figures = [OBJECTIVES[o][0] for o in cfg.objective]
        self.directions = [OBJECTIVES[o][1] for o in cfg.objective]
        self.storage_url = cfg.storage or sqlite_url(default_storage)
        check_storage_file(self.storage_url)
        # the study's file (the default one or what --storage names), and the files of it this run creates: a
        # failed or interrupted run with no finished trial removes those again
        self.own_file = Path(default_storage).absolute() if cfg.storage is None else storage_file(cfg.storage)
        self.created = [p for p in _side_files(self.own_file) if not os.path.lexists(p)] \
            if self.own_file is not None and not os.path.lexists(self.own_file) else []
        self.deadline = time.monotonic() + cfg.time_budget if cfg.time_budget else math.inf
        self.storage = None
        self.study_name = ""
        self.stale: list[int] = []        # trials of stopped workers this run marked failed
        self.overheads: list[float] = []  # seconds a measurement took beyond its timed part
        self.kept: str | None = None      # after a failure: what the study file still holds, to resume from
        self.left_out_count, self.left_out_last = 0, ""  # settings not measured: too many pool threads

    # -------------------------------------------------------------- setup
    def _left(self, deadline: float | None = None) -> float:
        return (self.deadline if deadline is None else deadline) - time.monotonic()

    def _prepare(self) -> None:
        left = self._left()
        self.feeds, no_batch = model_inputs(self.artifact, self.settings, self.data,
                                            timeout=left if math.isfinite(left) else None)
        if no_batch:
            self.notes.append(f"batch size left out of the search: the model cannot batch ({no_batch})")
        self.space = default_space(self.cfg, batchable=no_batch is None, providers=providers_here(),
                                   no_batch=no_batch)
        self.left_out = {"batch": no_batch} if no_batch else {}
        check_pool(self.space)

    def _study(self):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.DEBUG if log.isEnabledFor(logging.DEBUG) else optuna.logging.ERROR)
        asked = {"model_sha256": self.artifact.sha256, "space": self.space, "objective": self.cfg.objective,
                 "slo": self.cfg.slo, "max_memory_mb": self.cfg.max_memory_mb,
                 # figures measured on another CPU are another search's: one study per kind of machine
                 "machine": machine_kind(),
                 "inputs": {k: list(np.shape(v)) for k, v in self.feeds.items()},
                 # the values too: another --value, other data or seed is another search
                 "inputs_sha256": hashlib.sha256(b"".join(np.ascontiguousarray(self.feeds[k]).tobytes()
                                                          for k in sorted(self.feeds))).hexdigest()}
        digest = hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()[:10]
        name = self.cfg.study or f"optkit-tune-{Path(self.artifact.path).stem}-{digest}"
        self.study_name = name
        self.storage = storage = open_storage(self.storage_url, lambda study, t: self.stale.append(t.number),
                                              wait=self.cfg.storage_wait)
        # several workers of one study: each its own seed, so their first random settings differ
        seed = self.cfg.seed if self.cfg.storage is None else self.cfg.seed + os.getpid()
        with warnings.catch_warnings():  # multivariate and group are "experimental" (stable since Optuna 2.x)
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # multivariate + group: the dimensions that exist only together (inter-op threads in parallel mode,
            # sessions with several requests in flight) are modelled jointly
            sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, max(3, self.cfg.trials // 4)),
                                                 multivariate=True, group=True)
        try:
            with interrupts.deferred():  # never half a study (an interrupt is raised once it is whole)
                study = optuna.create_study(storage=storage, study_name=name, sampler=sampler,
                                            load_if_exists=True, directions=self.directions)
        except json.JSONDecodeError:
            raise UsageError(f"{_redact(self.storage_url)} is not an Optuna journal file") from None
        except ValueError as e:  # the stored study has other directions
            raise UsageError(f"study {name!r} in {_redact(self.storage_url)} was made for a different search "
                             f"({first_line(e)}); name a new one with study (--study)") from None
        except Exception as e:  # noqa: BLE001 - the storage cannot be written or read
            raise UsageError(f"cannot use tune storage {_redact(self.storage_url)}: {_db_message(e)}") from None
        asked = json.loads(json.dumps(asked))  # as storage gives it back (lists, string keys)
        stored = study.user_attrs.get("optkit")
        if stored is None:
            with interrupts.deferred():
                study.set_user_attr("optkit", asked)
        elif stored != asked:
            differs = [k for k in asked if json.dumps(stored.get(k), sort_keys=True) !=
                       json.dumps(asked[k], sort_keys=True)]
            if "machine" in differs:
                others = [k for k in differs if k != "machine"]
                raise UsageError(f"study {name!r} in {_redact(self.storage_url)} holds figures measured on another "
                                 f"kind of machine ({_kind_label(stored.get('machine'))}; this one: "
                                 f"{_kind_label(asked['machine'])})"
                                 + (f", and its {', '.join(others)} differ too" if others else "")
                                 + "; optkit does not mix figures from different machines: give each kind of machine "
                                 "its own study (--study NAME-KIND)")
            raise UsageError(f"study {name!r} in {_redact(self.storage_url)} was made for a different search "
                             f"(its {', '.join(differs)} differ from this one's); name a new one with study (--study), or "
                             "ask for the same search")
        self.study_name = name
        return study

    # -------------------------------------------------------------- workers that are gone
    def _fail_stale(self, study) -> None:
        """Trials left RUNNING by a worker that is gone are marked failed: on this machine when its process is
        gone, elsewhere when its heartbeat is older than GRACE_S (Optuna's, on a database)."""
        import optuna

        RUNNING, FAIL = optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.FAIL
        optuna.storages.fail_stale_trials(study)  # a database's heartbeat; calls back into self.stale
        now = time.time()
        for t in study.get_trials(deepcopy=False, states=(RUNNING,)):
            worker = t.user_attrs.get("worker")
            alive = _worker_alive(worker)
            # a journal has no heartbeat of Optuna's; on a database, a trial whose worker stopped between asking
            # for it and naming itself has no heartbeat either (Optuna would never fail it, and every later worker
            # would wait for it as "still choosing its setting")
            if alive is None and (not isinstance(worker, dict)
                                  or not getattr(study._storage, "get_heartbeat_interval", lambda: None)()):
                beat = t.user_attrs.get("heartbeat")  # a journal: the trial's own heartbeat attribute
                if not isinstance(beat, (int, float)) and t.datetime_start is not None:
                    beat = t.datetime_start.timestamp()
                alive = not isinstance(beat, (int, float)) or now - beat <= GRACE_S
            if alive is not False:
                continue
            try:
                pid = worker.get("pid") if isinstance(worker, dict) else None
                study._storage.set_trial_user_attr(t._trial_id, "failed", "left running by a worker that stopped"
                                                   + (f" (pid {pid})" if pid else ""))
                if study._storage.set_trial_state_values(t._trial_id, state=FAIL):
                    self.stale.append(t.number)
            except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError):
                pass  # another worker finished or failed it meanwhile

    def _counted(self, study, before: int | None = None) -> int:
        """Trials toward `trials`: finished ones and those live workers are running (numbers below `before`)."""
        import optuna

        S = optuna.trial.TrialState
        return sum(1 for t in study.get_trials(deepcopy=False, states=(S.COMPLETE, S.PRUNED, S.RUNNING))
                   if (before is None or t.number < before) and not t.user_attrs.get("skipped"))

    def _running(self, study) -> int:
        """Trials other workers are running now (counted toward `trials` until they finish or fail)."""
        import optuna

        return sum(1 for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
                   if not t.user_attrs.get("skipped"))

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
                self._fail_stale(study)
                trials = study.get_trials(deepcopy=False, states=(S.COMPLETE, S.PRUNED, S.RUNNING))
            done = next((t for t in trials if t.state != S.RUNNING and t.user_attrs.get("setting") == mine
                         and "figures" in t.user_attrs), None)
            if done is not None:
                return done
            ahead = [t for t in trials if t.state == S.RUNNING and t._trial_id < trial._trial_id
                     and not t.user_attrs.get("skipped") and t.user_attrs.get("setting", mine) == mine]
            if not ahead or self._left(deadline) <= POLL_S:
                return None
            log.info("trial %d: waiting for trial %d (same setting, another worker)", trial.number, ahead[0].number)
            time.sleep(POLL_S)

    # -------------------------------------------------------------- one trial
    def _trial_seconds_needed(self) -> float:
        """What a trial takes: its probe and timed run, and the set-up trials here have shown (the slowest of
        the last few; SETUP_S before any)."""
        setup = max(self.overheads[-5:]) if self.overheads else SETUP_S
        return PROBE_S + self.cfg.trial_seconds + setup

    def _limit(self, deadline: float) -> float:
        """Seconds a measurement may take: the trial limit (trial_limit), or what is left of the budget when
        that is less."""
        return min(self._left(deadline), trial_limit(self.cfg.trial_seconds))

    def _measure(self, setting: Setting, deadline: float, hopeless=None) -> dict:
        """A setting's figures, its child stopped at `deadline` (TimedOut); the overhead is remembered."""
        t0 = time.monotonic()
        figures = measure_setting(self.artifact, setting, self.feeds, seconds=self.cfg.trial_seconds,
                                  hopeless=hopeless, timeout=self._limit(deadline))
        timed = PROBE_S + (0.0 if figures.get("pruned") else self.cfg.trial_seconds)
        self.overheads.append(max(0.0, time.monotonic() - t0 - timed))
        return figures

    def _run_trial(self, study, deadline: float) -> str:
        """Ask for a trial, measure it and tell the study. Optuna's and the storage's calls run with interrupts
        deferred; one that comes while the setting is measured fails the trial (told FAIL), then goes on up.
        Returns "done", "full" (the study has its trials), "timeout" (the budget ran out inside it) or "failed"
        (no budget: the setting did not come back in time)."""
        import optuna

        S = optuna.trial.TrialState
        trial, told = None, False
        try:
            with interrupts.deferred():
                trial = study.ask()
                trial.set_user_attr("worker", self.worker)
            with _Heartbeat(study._storage, trial._trial_id):
                with interrupts.deferred():
                    if self._counted(study, before=trial.number) >= self.cfg.trials:
                        trial.set_user_attr("skipped", True)  # the study has its trials (other workers ran them)
                        study.tell(trial, state=S.PRUNED)
                        told = True
                        return "full"
                    setting = suggest(trial, self.space)
                    trial.set_user_attr("setting", setting.model_dump(mode="json"))
                    if pool_threads(setting) > pool_cap():  # not measured, not counted: TPE learns it is bad
                        self.left_out_last = (f"{setting.label()}: its sessions start {pool_threads(setting)} "
                                              f"onnxruntime pool threads, more than {pool_cap()} on {cores()} cores")
                        trial.set_user_attr("skipped", True)
                        trial.set_user_attr("left_out", self.left_out_last)
                        study.tell(trial, state=S.PRUNED)
                        told = True
                        log.info("trial %d left out: %s", trial.number, self.left_out_last)
                        return "left-out"
                duplicate = self._same_setting(study, trial, deadline)
                if duplicate is not None:
                    figures = duplicate.user_attrs["figures"]
                else:
                    limit = self._limit(deadline)
                    budget = limit < trial_limit(self.cfg.trial_seconds)
                    try:
                        figures = self._measure(setting, deadline, hopeless=self._hopeless)
                    except TimedOut:
                        reason = (f"stopped at the time budget: {setting.label()} was still setting up or being "
                                  f"measured when its {limit:.1f} s ran out" if budget else
                                  f"stopped at the trial limit: {setting.label()} was not measured within "
                                  f"{limit:.1f} s (probe, trial_seconds (--trial-seconds) and max(30 s, 10 x trial_seconds) "
                                  "for set-up)")
                        with interrupts.deferred():
                            trial.set_user_attr("failed", reason)
                            study.tell(trial, state=S.FAIL)
                            told = True
                        log.info("trial %d: %s", trial.number, reason)
                        return "timeout" if budget else "failed"
                    log.info("trial %d: %s -> %s", trial.number, setting.label(), _short(figures))
                with interrupts.deferred():
                    state, values = self._record(trial, figures,
                                                 duplicate_of=duplicate.number if duplicate is not None else None)
                    study.tell(trial, values, state=state)
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

    def _record(self, trial, figures: dict, duplicate_of: int | None = None):
        """Keep a trial's figures and constraints; the state and values to tell the study."""
        import optuna

        trial.set_user_attr("figures", figures)
        trial.set_user_attr("constraints", self._violations(figures))
        for i, v in enumerate(trial.user_attrs["constraints"]):  # TPE learns what is infeasible from these
            trial.set_constraint(f"c{i}", v)
        if duplicate_of is not None:
            trial.set_user_attr("duplicate_of", duplicate_of)
        values = [figures.get(f) for f in self.figures]
        if figures.get("pruned") or any(v is None or not math.isfinite(v) for v in values):
            if not figures.get("pruned"):
                trial.set_user_attr("pruned_reason", "no figure")
            return optuna.trial.TrialState.PRUNED, None
        return optuna.trial.TrialState.COMPLETE, values if len(values) > 1 else values[0]

    def _violations(self, figures: dict) -> list[float]:
        out = [s.violation(figures) for s in self.slos]
        if self.cfg.max_memory_mb is not None:
            m = figures.get("memory_mb")
            out.append(math.inf if m is None else (m - self.cfg.max_memory_mb) / self.cfg.max_memory_mb)
        return [min(v, 1e9) for v in out]

    def _hopeless(self, probe: dict) -> str | None:
        for s in self.slos:
            if s.hopeless(probe):
                return f"clearly misses {s.text} (probe: {_short(probe)})"
        return None

    # -------------------------------------------------------------- the whole tune
    def run(self) -> dict[str, Any]:
        """The tune. A failed or interrupted one removes the default study file when this run created it and
        no trial finished in it; else `kept` says what is there to resume from."""
        try:
            return self._run()
        except BaseException as e:
            self._after_failure()
            cause = _database_error(e) if self.storage is not None else None
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
        return UsageError(f"lost the tune storage {_redact(self.storage_url)} mid-study ({_db_message(e)}); the "
                          f"study {self.study_name!r} keeps its finished trials: run the same command to resume "
                          "once the database is back (a trial this worker left running is failed then, not "
                          "counted)")

    def _finished(self, study) -> list:
        import optuna

        states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        return [t for t in study.get_trials(deepcopy=False, states=states)
                if not t.user_attrs.get("skipped") and "figures" in t.user_attrs]

    def _run(self) -> dict[str, Any]:
        import optuna

        self._prepare()
        self.worker = _this_worker()
        study = self._study()
        with interrupts.deferred():
            self._fail_stale(study)
            done = len(self._finished(study))
            if done:
                self.notes.append(f"study {self.study_name}: {done} trials already done (resumed)")
            elif not study.trials:
                for params in starting_points(self.space):
                    study.enqueue_trial(params, skip_if_exists=True)
        self._search(study)
        trials = self._finished(study)
        if self.stale:
            n = len(self.stale)
            self.notes.append(f"{n} stale trial{'s' if n > 1 else ''} left running by a stopped worker marked "
                              "failed (not counted)")
        failed = [{"number": t.number, "label": Setting(**t.user_attrs["setting"]).label()
                   if "setting" in t.user_attrs else "", "reason": t.user_attrs.get("failed", STALE_REASON),
                   "worker": worker_label(t.user_attrs.get("worker"))}
                  for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
                  if not t.user_attrs.get("confirm")]  # a shared confirmation's bookkeeping trial is no trial
        if self.left_out_count:
            n = self.left_out_count
            self.notes.append(f"{n} setting{'s' if n > 1 else ''} left out unmeasured: their sessions start more "
                              f"than {pool_cap()} onnxruntime pool threads ({POOL_PER_CORE} per core)")
        if not trials:
            why = f"; the last: trial {failed[-1]['number']} {failed[-1]['reason']}" if failed else \
                f"; every setting tried was left out, the last: {self.left_out_last}" if self.left_out_count else \
                " (time budget too short?)"
            raise ValidationError(f"no tune trial finished{why}; nothing was written")
        return self._result(trials, failed, study=study)

    def _search(self, study) -> None:
        """Trials until the study has `trials` of them, the budget's search part is spent, or trials keep
        failing. With a budget, a share of it (up to a third) is kept for the confirmation."""
        per = self._trial_seconds_needed()
        reserve = min(self.cfg.confirm * ROUNDS * per, self.cfg.time_budget / 3) \
            if self.cfg.time_budget and self.cfg.confirm else 0.0
        deadline = self.deadline - reserve
        timeouts = failures = left_out = 0
        waited = 0.0
        while True:
            with interrupts.deferred():
                self._fail_stale(study)
                counted, running = self._counted(study), self._running(study)
            if counted >= self.cfg.trials:
                if not running:
                    if waited >= 1:
                        self.notes.append(f"waited {waited:.0f} s for other workers' last trials")
                    return
                # other workers' trials make up the count: wait for them, as one that fails (or whose worker
                # stops: its heartbeat) leaves a trial to run again, so that the study has exactly `trials`
                if self._left(deadline) <= POLL_S:
                    return
                time.sleep(POLL_S)
                waited += POLL_S
                continue
            until = deadline
            if math.isfinite(deadline):
                first = not self._finished(study)
                left, need = self._left(deadline), self._trial_seconds_needed()
                if left < need and not (first and self._left() > PROBE_S + self.cfg.trial_seconds):
                    self.notes.append(f"time budget: the search stopped with {max(0.0, left):.1f} s of its "
                                      f"share left (a trial takes about {need:.1f} s here)")
                    return
                if first and left < need:
                    until = self.deadline  # no trial yet: the first may use the whole budget
            outcome = self._run_trial(study, until)
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

    def _after_failure(self) -> None:
        """After an error or an interrupt: drop the study file (and its -journal, -wal, -shm) this run created
        when no trial finished in it and no other worker uses it (nothing to resume from); else say what it
        keeps."""
        import optuna

        path = self.own_file
        if path is None or not os.path.lexists(path):
            return
        finished, others, storage = 0, False, self.storage
        with interrupts.deferred():
            try:
                if storage is not None:
                    S = optuna.trial.TrialState
                    studies = storage.get_all_studies()
                    for s in studies:
                        for t in storage.get_all_trials(s._study_id, deepcopy=False):
                            worker = t.user_attrs.get("worker")
                            if isinstance(worker, dict) and (worker.get("pid"), worker.get("host")) != \
                                    (os.getpid(), _host()):
                                others = True  # another worker's trial (an enqueued one has no worker)
                            if t.state in (S.COMPLETE, S.PRUNED, S.RUNNING) and not t.user_attrs.get("skipped"):
                                finished += 1
                    others = others or len(studies) > 1
            except Exception as e:  # noqa: BLE001 - cannot read it: leave it
                log.debug("tune study after a failure: %s", first_line(e))
                return
            if finished:
                self.kept = (f"the study is kept in {path} ({finished} measured trial{'s' if finished != 1 else ''}; "
                             "run the same command to resume)")
                return
            if not self.created or others:
                return
            if storage is not None and hasattr(storage, "engine"):
                storage.engine.dispose()
            for p in self.created:
                try:
                    p.unlink()
                except FileNotFoundError:
                    pass
                except OSError as e:
                    log.debug("cannot remove %s: %s", p, e)

    def _result(self, trials: list, failed: list[dict] | None = None, study=None) -> dict[str, Any]:
        rows = [{"number": t.number, "state": t.state.name.lower(), "setting": t.user_attrs["setting"],
                 "label": Setting(**t.user_attrs["setting"]).label(), "figures": t.user_attrs["figures"],
                 "feasible": all(v <= 0 for v in t.user_attrs.get("constraints", [])),
                 **({"duplicate_of": t.user_attrs["duplicate_of"]} if "duplicate_of" in t.user_attrs else {})}
                for t in trials]
        complete = [r for r in rows if r["state"] == "complete" and "duplicate_of" not in r]
        feasible = [r for r in complete if r["feasible"]]
        if not feasible:
            raise self._missed(rows)
        ranked = sorted(feasible, key=self._key)
        top = ranked[:self.cfg.confirm] if self.cfg.confirm >= 1 else []
        shared = study is not None and len(workers_of(trials)) > 1
        confirmed = (self._shared_confirm(study, top) if shared else self._confirm(top)) if top else []
        best = confirmed[0] if confirmed else {**ranked[0], "confirmed": None}
        ties = [c for c in confirmed[1:] if c["tie"]]
        _mark_pareto(rows)
        setting = Setting(**best["setting"])
        figure, direction = self.figures[0], self.directions[0]
        failed = failed or []
        return {
            "objective": self.cfg.objective, "slo": self.cfg.slo, "max_memory_mb": self.cfg.max_memory_mb,
            "best": {"setting": best["setting"], "label": best["label"], "figures": best["figures"],
                     "trial": best["number"], "confirmed": best.get("confirmed")},
            "ties": [{"setting": t["setting"], "label": t["label"], "confirmed": t["confirmed"]} for t in ties],
            "session_options": setting.session.snippet(setting.threads),
            "recipe": {"measure": setting.recipe_measure(), "gates": self._gates(best["figures"])},
            "space": self.space, "left_out": self.left_out,
            "study": {"storage": _redact(self.storage_url), "name": self.study_name, "trials": len(rows),
                      "pruned": sum(r["state"] == "pruned" for r in rows),
                      "duplicates": sum("duplicate_of" in r for r in rows),
                      "failed": len(failed), "stale": len(self.stale),
                      "workers": workers_of(trials), "machine": machine_kind()},
            "objective_figure": figure, "direction": direction,
            "trials": rows,
            "failed_trials": failed,
        }

    def _key(self, row: dict) -> float:
        v = row["figures"][self.figures[0]]
        return -v if self.directions[0] == "maximize" else v

    def _confirm(self, top: list[dict]) -> list[dict]:
        """The best settings measured again, interleaved over ROUNDS rounds (each sees the machine the others
        see); the winner has the best mean; a setting whose 95% interval overlaps the winner's is a tie. With a
        time budget: as many settings as its rest fits, only whole rounds count, and at least two of them."""
        figure = self.figures[0]
        if math.isfinite(self.deadline):
            per = self._trial_seconds_needed()
            fits = int(self._left() // (ROUNDS * per))
            if fits < 1:
                self.notes.append(f"the best setting was not measured again: {max(0.0, self._left()):.1f} s of the "
                                  f"time budget left, {ROUNDS} rounds take about {ROUNDS * per:.1f} s")
                return []
            if fits < len(top):
                self.notes.append(f"measured again: the best {fits} of {len(top)} settings (the time budget's "
                                  "rest fits no more)")
                top = top[:fits]
        runs: dict[int, list[dict]] = {r["number"]: [] for r in top}
        rounds = 0
        try:
            for _ in range(ROUNDS):
                for r in top:
                    runs[r["number"]].append(self._measure(Setting(**r["setting"]), self.deadline))
                rounds += 1
        except TimedOut as e:
            why = "the time budget ran out" if math.isfinite(self.deadline) else first_line(e)
            if rounds < 2:
                self.notes.append(f"the best setting was not measured again: {why}")
                return []
            self.notes.append(f"measured again over {rounds} rounds ({why})")
        runs = {k: v[:rounds] for k, v in runs.items()}
        out = []
        for r in top:
            values = [f[figure] for f in runs[r["number"]] if f.get(figure) is not None]
            mean = float(np.mean(values))
            half = t95(len(values) - 1) * float(np.std(values, ddof=1)) / math.sqrt(len(values)) \
                if len(values) > 1 else 0.0
            merged = {k: float(np.median([f[k] for f in runs[r["number"]] if f.get(k) is not None]))
                      for k in runs[r["number"]][0] if isinstance(runs[r["number"]][0][k], (int, float))}
            out.append({**r, "figures": merged, "confirmed": {"figure": figure, "mean": mean, "ci95": [mean - half,
                                                                                                      mean + half],
                                                              "rounds": len(values)}})
        sign = -1 if self.directions[0] == "maximize" else 1
        out.sort(key=lambda c: sign * c["confirmed"]["mean"])
        lo, hi = out[0]["confirmed"]["ci95"]
        for c in out:
            c_lo, c_hi = c["confirmed"]["ci95"]
            c["tie"] = c_lo <= hi and c_hi >= lo
        return out

    def _shared_confirm(self, study, top: list[dict]) -> list[dict]:
        """The confirmation of a study several workers ran, done once and shared, so that every worker names the
        same best: each asks a bookkeeping trial (skipped: never counted) marked with the settings to confirm;
        the worker whose trial came first measures them again and keeps the outcome in its trial; the others
        wait for it (a worker that dies is found by its heartbeat, and the next in line measures)."""
        import optuna

        S = optuna.trial.TrialState
        key = hashlib.sha256(json.dumps([r["number"] for r in top]).encode()).hexdigest()[:16]
        with interrupts.deferred():
            trial = study.ask()
            trial.set_user_attr("worker", self.worker)
            trial.set_user_attr("skipped", True)
            trial.set_user_attr("confirm", key)
        told = False
        try:
            with _Heartbeat(study._storage, trial._trial_id):
                while True:
                    with interrupts.deferred():
                        self._fail_stale(study)
                        marked = [t for t in study.get_trials(deepcopy=False)
                                  if t.user_attrs.get("confirm") == key and t._trial_id != trial._trial_id]
                    done = next((t for t in marked if t.state != S.RUNNING and "confirmed" in t.user_attrs), None)
                    if done is not None:
                        out = done.user_attrs["confirmed"]
                        self.notes.append(f"the best settings were measured again by "
                                          f"{worker_label(done.user_attrs.get('worker'))} (trial {done.number})")
                        break
                    if not any(t.state == S.RUNNING and t._trial_id < trial._trial_id for t in marked):
                        out = self._confirm(top)
                        with interrupts.deferred():
                            trial.set_user_attr("confirmed", json.loads(json.dumps(out)))
                        break
                    if self._left() <= POLL_S:
                        self.notes.append("the best setting was not measured again: the time budget ran out while "
                                          "another worker measured it")
                        out = []
                        break
                    time.sleep(POLL_S)
                with interrupts.deferred():
                    study.tell(trial, state=S.PRUNED)
                    told = True
        finally:
            if not told:
                with interrupts.deferred():
                    try:
                        study.tell(trial, state=S.FAIL)
                    except Exception as e:  # noqa: BLE001 - the storage itself failed: the first error goes on
                        log.debug("could not mark trial %d failed: %s", trial.number, first_line(e))
        return out

    def _gates(self, figures: dict) -> list[str]:
        """Gates a recipe can keep: the SLOs, the memory limit, and throughput not more than 10% under the
        tuned figure."""
        gates = []
        for s in self.slos:
            metric = {"p50_ms": "latency_p50_ms", "p90_ms": "latency_p90_ms", "p99_ms": "latency_p99_ms",
                      "throughput_per_s": "throughput"}[s.figure]
            gates.append(f"{metric} {'<=' if s.upper else '>='} {s.limit:g}")
        if self.cfg.max_memory_mb is not None:
            gates.append(f"memory_mb <= {self.cfg.max_memory_mb:g}")
        if "throughput" in self.cfg.objective and figures.get("throughput_per_s"):
            gates.append(f"throughput >= {num(0.9 * figures['throughput_per_s'])}")
        return gates

    def _missed(self, rows: list[dict]) -> ValidationError:
        measured = [r for r in rows if "duplicate_of" not in r]
        closest = min(measured, key=lambda r: sum(max(0.0, v) for v in self._violations(r["figures"])))
        asked = ", ".join(self.cfg.slo + ([f"memory <= {self.cfg.max_memory_mb:g} MiB"]
                                          if self.cfg.max_memory_mb is not None else []))
        return ValidationError(f"no setting met {asked} in {len(measured)} trials; the closest: "
                               f"{closest['label']} ({_short(closest['figures'])})",
                               details={"trials": rows})


def workers_of(trials: list) -> dict[str, int]:
    """Finished trials per worker (host name and pid), most first: who ran the study's trials."""
    counts: dict[str, int] = {}
    for t in trials:
        label = worker_label(t.user_attrs.get("worker"))
        counts[label] = counts.get(label, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _database_error(e: BaseException) -> BaseException | None:
    """The database's error under an Optuna storage error (SQLAlchemy's, or its driver's), following the chain
    (Optuna wraps a failed commit in its StorageInternalError); None when the error is not the database's."""
    try:
        import sqlalchemy.exc
    except ImportError:
        return None
    seen = 0
    while e is not None and seen < 10:
        if isinstance(e, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError,
                          sqlalchemy.exc.DisconnectionError)) or (
                isinstance(e, sqlalchemy.exc.DBAPIError) and getattr(e, "connection_invalidated", False)):
            return e
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def _mark_pareto(rows: list[dict]) -> None:
    """Mark the feasible trials no other beats on both p50 latency and throughput."""
    pts = [r for r in rows if r["state"] == "complete" and r["feasible"] and "duplicate_of" not in r]
    for r in rows:
        r["pareto"] = False
    for r in pts:
        f = r["figures"]
        r["pareto"] = not any(o is not r and o["figures"]["p50_ms"] <= f["p50_ms"]
                              and o["figures"]["throughput_per_s"] >= f["throughput_per_s"]
                              and (o["figures"]["p50_ms"] < f["p50_ms"]
                                   or o["figures"]["throughput_per_s"] > f["throughput_per_s"]) for o in pts)


def num(v: float) -> str:
    """A figure as people read it: 108,213 or 0.0351."""
    return f"{v:,.0f}".replace(",", "") if abs(v) >= 1000 else f"{v:.4g}"


def _short(f: dict) -> str:
    parts = []
    if f.get("throughput_per_s") is not None:
        parts.append(f"{f['throughput_per_s']:,.1f} samples/s")
    for k in ("p50_ms", "p99_ms"):
        if f.get(k) is not None:
            parts.append(f"{k[:3]} {f[k]:.3g} ms")
    if f.get("memory_mb") is not None:
        parts.append(f"memory {f['memory_mb']:.0f} MiB")
    return ", ".join(parts)


@register
class TuneOnnx(Pass):
    name = "tune.onnx"
    summary = "Serving settings (threads, batch, concurrency, session options) found by Bayesian search"
    accepts = (Format.ONNX,)
    produces = Format.ONNX
    extra = "tune"
    Config = TuneConfig

    def run(self, artifact: Artifact, config: TuneConfig, ctx: PassContext) -> Artifact:
        data = ctx.data.get("eval")  # real samples to time, when the recipe has them
        settings = MeasureSettings(shapes=ctx.shapes, values=ctx.values, seed=ctx.seed)
        tuner = Tuner(artifact, config, settings=settings, data=data, default_storage=stage_study_path(ctx),
                      notes=ctx.notes)
        result = tuner.run()
        ctx.measurements["tune"] = result
        ctx.note(f"tuned for {', '.join(config.objective)}: {result['best']['label']} "
                 f"({_short(result['best']['figures'])})")
        copy_model(artifact.path, ctx.output)
        return Artifact.load(str(ctx.output))


# ------------------------------------------------------------------------------------------------ reading a study
def read_study(url: str, name: str | None, wait: float = 20.0) -> dict[str, Any]:
    """A study's results as its storage holds them, read from any machine without measuring: its search (the
    model, objective, machine kind), the finished trials with their figures, the best feasible setting by the
    search's figures, the trials per worker and the failed ones. `name` None: the storage's one study."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if storage_file(url) is not None and not os.path.exists(storage_file(url)):
        raise UsageError(f"tune storage {_redact(url)}: {storage_file(url)} does not exist")
    storage = open_storage(url, wait=wait, create=False)
    S = optuna.trial.TrialState
    with interrupts.deferred():
        try:
            names = sorted(s.study_name for s in storage.get_all_studies())
            if name is None:
                if len(names) != 1:
                    raise UsageError(f"tune storage {_redact(url)} holds {len(names)} studies"
                                     + (f" ({', '.join(names[:10])})" if names else "")
                                     + "; name one with study (--study)")
                name = names[0]
            if name not in names:
                raise UsageError(f"no study {name!r} in tune storage {_redact(url)}"
                                 + (f"; it holds {', '.join(names[:10])}" if names else "; it holds none"))
            study = optuna.load_study(study_name=name, storage=storage)
            all_trials = study.get_trials(deepcopy=False)
        except OptkitError:
            raise
        except Exception as e:  # noqa: BLE001 - the database failed under us
            cause = _database_error(e)
            if cause is not None:
                raise UsageError(f"cannot read tune storage {_redact(url)}: {_db_message(cause)}") from None
            raise
    search = study.user_attrs.get("optkit") or {}
    objective = search.get("objective") or ["throughput"]
    figure, direction = OBJECTIVES.get(objective[0], OBJECTIVES["throughput"])
    finished = [t for t in all_trials if t.state in (S.COMPLETE, S.PRUNED) and not t.user_attrs.get("skipped")
                and "figures" in t.user_attrs]
    rows = [{"number": t.number, "state": t.state.name.lower(), "setting": t.user_attrs.get("setting"),
             "label": Setting(**t.user_attrs["setting"]).label() if "setting" in t.user_attrs else "",
             "figures": t.user_attrs["figures"], "worker": worker_label(t.user_attrs.get("worker")),
             "feasible": all(v <= 0 for v in t.user_attrs.get("constraints", [])),
             **({"duplicate_of": t.user_attrs["duplicate_of"]} if "duplicate_of" in t.user_attrs else {})}
            for t in finished]
    ranked = sorted((r for r in rows if r["state"] == "complete" and r["feasible"] and "duplicate_of" not in r
                     and r["figures"].get(figure) is not None),
                    key=lambda r: -r["figures"][figure] if direction == "maximize" else r["figures"][figure])
    # the study's shared confirmation (Tuner._shared_confirm), the latest: its winner is the workers' best
    confirmation = next((t for t in reversed(all_trials) if t.state != S.RUNNING and t.user_attrs.get("confirmed")),
                        None)
    if confirmation is not None:
        won = confirmation.user_attrs["confirmed"][0]
        best = {"setting": won["setting"], "label": won["label"], "figures": won["figures"], "trial": won["number"],
                "confirmed": won["confirmed"],
                "confirmed_by": worker_label(confirmation.user_attrs.get("worker"))}
    else:
        best = ({"setting": ranked[0]["setting"], "label": ranked[0]["label"], "figures": ranked[0]["figures"],
                 "trial": ranked[0]["number"], "confirmed": None} if ranked else None)
    failed = [{"number": t.number, "worker": worker_label(t.user_attrs.get("worker")),
               "reason": t.user_attrs.get("failed", STALE_REASON)} for t in all_trials
              if t.state == S.FAIL and not t.user_attrs.get("confirm")]
    return {"storage": _redact(url), "study": name, "search": search, "objective": objective,
            "objective_figure": figure, "direction": direction,
            "machine": search.get("machine"),
            "trials": len(rows), "pruned": sum(r["state"] == "pruned" for r in rows),
            "duplicates": sum("duplicate_of" in r for r in rows), "failed": len(failed),
            "running": sum(1 for t in all_trials if t.state == S.RUNNING and not t.user_attrs.get("skipped")),
            "workers": workers_of(finished),
            "best": best,
            "rows": rows, "failed_trials": failed}
