"""What a tune asks for: its options (`TuneConfig`), its service-level objectives (`Slo`), and `Goal`, the
objectives, SLOs and memory limit read from one config (the figures a trial is judged by, the gates a recipe
keeps). `num` and `short` write figures as people read them."""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from optkit.contracts.base import MAX_MIB
from optkit.contracts.best import SLO_FIGURES, parse_slo
from optkit.core import dburl
from optkit.core.atomic import PathRole
from optkit.core.dburl import is_sqlite
from optkit.core.errors import UsageError, ValidationError
from optkit.core.registry import PassConfig, cli

# objective -> (figure, direction)
OBJECTIVES = {"throughput": ("throughput_per_s", "maximize"), "latency": ("p50_ms", "minimize"),
              "cost": ("cpu_s_per_1k", "minimize")}
MAX_TIME_BUDGET_S = 30 * 86_400
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_SIZE = re.compile(rf"^\s*{_NUMBER}\s*(b|kb|mb|gb|kib|mib|gib)?\s*$", re.I)
_DURATION = re.compile(rf"^\s*{_NUMBER}\s*(s|sec|m|min|h)?\s*$", re.I)
_BYTES = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30}
_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}


def parse_memory(value: Any) -> Any:
    """'2GB', '512MiB', '800' (MiB) -> MiB; a number is MiB already (a recipe takes what the command takes)."""
    return _in_units(value, _SIZE, _BYTES, "mib", 2 ** 20, "a size: give one such as 2GB, 512MB or 512MiB")


def parse_duration(value: Any) -> Any:
    """'10m', '90s', '1h', '600' (seconds) -> seconds; a number is seconds already."""
    return _in_units(value, _DURATION, _SECONDS, "s", 1, "a duration: give one such as 90s, 10m or 1h")


def _in_units(value: Any, pattern: re.Pattern, units: dict[str, float], default: str, per: float, what: str) -> Any:
    if not isinstance(value, str):
        return value
    m = pattern.match(value)
    if not m:
        raise ValueError(f"{value[:40]!r} is not {what}")
    return float(m[1]) * units[(m[2] or default).lower()] / per


DIMENSIONS = ("runtime", "provider", "threads", "execution_mode", "inter_op_threads", "graph_optimization", "batch",
              "concurrency", "sessions", "cpu_mem_arena", "mem_pattern")


def storage_file(url: str) -> Path | None:
    """The file a storage keeps its study in: a journal:PATH, or the file an SQLite URL really opens, resolved
    as SQLAlchemy and SQLite resolve it (relative or absolute, query strings, `sqlite+pysqlite://`, URI filenames
    `file:...?...&uri=true`). None for a database server or an SQLite database in memory. An SQLite URL whose
    file cannot be told is refused (UsageError)."""
    if url.startswith("journal:"):
        return Path(url[len("journal:"):]).absolute() if url[len("journal:"):] else None
    if not is_sqlite(url):
        return None
    return dburl.sqlite_file(url, "tune storage")


class Slo:
    """A service-level objective: `p99<=20ms`, `p50 < 5 ms`, `throughput>=200`, read as best.json's readers read
    it (contracts.best.parse_slo: the limit bounded as they bound the figure)."""

    def __init__(self, text: str):
        try:
            what, _, self.limit = parse_slo(text)
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.text, self.figure = text.strip(), SLO_FIGURES[what]
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
    max_memory_mb: float | None = Field(default=None, gt=0, le=MAX_MIB, allow_inf_nan=False,
                                        description="Peak memory (RSS) a setting may use: a size (2GB, 512MiB) or a number of MiB.",
                                        json_schema_extra=cli("--max-memory", kind="str", group="budgets",
                                                              help="Peak memory a setting may use, e.g. 2GB."))
    trials: int = Field(default=40, ge=1, le=10_000, strict=True, description="Trials in the study.",
                        json_schema_extra=cli("--trials", group="budgets"))
    time_budget: float | None = Field(default=None, gt=0, le=MAX_TIME_BUDGET_S, allow_inf_nan=False,
                                      description="Stop searching after this long: a duration (90s, 10m, 1h) or a number of seconds.",
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
    storage: Annotated[str | None, PathRole("output", names=storage_file)] = Field(default=None, description="Optuna storage shared by workers: sqlite:///f.db, "
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
    seed: int = Field(default=0, ge=0, le=2 ** 32 - 1, strict=True, description="Sampler seed.", json_schema_extra=cli("--seed"))
    # best settings measured again in ROUNDS interleaved rounds: ties, and the best's interval (1: the best
    # only, for its interval; 0: none)
    confirm: int = Field(default=3, ge=0, le=20, strict=True,
                         description="Best settings measured again in 3 interleaved rounds to tell a win from noise "
                                     "(default 3; 1: the best only, for its 95% interval; 0: none).",
                         json_schema_extra=cli("--confirm", group="measurement"))

    @field_validator("max_memory_mb", "time_budget", mode="before")
    @classmethod
    def _with_units(cls, v: Any, info) -> Any:
        """A size or a duration as the command takes it ("2GB", "10m"), or a plain number of MiB / seconds."""
        return parse_memory(v) if info.field_name == "max_memory_mb" else parse_duration(v)

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
                    choice(name, c)
            except UsageError as e:
                raise ValueError(e.message) from None
        return v


def choice(name: str, value: Any) -> Any:
    """A choice from the command line or a recipe, checked against what the dimension takes."""
    ints = ("threads", "inter_op_threads", "batch", "concurrency")
    words = {"runtime": ("onnxruntime", "openvino"), "provider": ("cpu", "cuda", "tensorrt"), "execution_mode": ("sequential", "parallel"),
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


class Goal:
    """The objectives (their figures and directions), the SLOs and the memory limit of one tune: how a trial's
    figures are judged, ranked and turned into a recipe's gates."""

    def __init__(self, cfg: TuneConfig):
        self.cfg = cfg
        self.slos = [Slo(s) for s in cfg.slo]
        self.figures = [OBJECTIVES[o][0] for o in cfg.objective]
        self.directions = [OBJECTIVES[o][1] for o in cfg.objective]

    @property
    def figure(self) -> str:
        """The first objective's figure: what ranks settings and what the confirmation measures again."""
        return self.figures[0]

    @property
    def maximize(self) -> bool:
        return self.directions[0] == "maximize"

    def values(self, figures: dict) -> list:
        return [figures.get(f) for f in self.figures]

    def violations(self, figures: dict) -> list[float]:
        """One per SLO (and the memory limit): <= 0 when met, else how far off (relative, capped at 1e9)."""
        out = [s.violation(figures) for s in self.slos]
        if self.cfg.max_memory_mb is not None:
            m = figures.get("memory_mb")
            out.append(math.inf if m is None else (m - self.cfg.max_memory_mb) / self.cfg.max_memory_mb)
        return [min(v, 1e9) for v in out]

    def hopeless(self, probe: dict) -> str | None:
        for s in self.slos:
            if s.hopeless(probe):
                return f"clearly misses {s.text} (probe: {short(probe)})"
        return None

    def key(self, row: dict) -> float:
        """A trial row's sort key: the best first."""
        v = row["figures"][self.figure]
        return -v if self.maximize else v

    def gates(self, figures: dict) -> list[str]:
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

    def missed(self, rows: list[dict]) -> ValidationError:
        """No setting met the SLOs and the memory limit: the error, naming the closest."""
        measured = [r for r in rows if "duplicate_of" not in r]
        closest = min(measured, key=lambda r: sum(max(0.0, v) for v in self.violations(r["figures"])))
        asked = ", ".join(self.cfg.slo + ([f"memory <= {self.cfg.max_memory_mb:g} MiB"]
                                          if self.cfg.max_memory_mb is not None else []))
        trials = f"{len(measured)} measured trial{'s' if len(measured) != 1 else ''}"
        return ValidationError(f"no setting met {asked} in {trials}; the closest: "
                               f"{closest['label']} ({short(closest['figures'])})",
                               details={"trials": rows})


def num(v: float) -> str:
    """A figure as people read it: 108,213 or 0.0351."""
    return f"{v:,.0f}".replace(",", "") if abs(v) >= 1000 else f"{v:.4g}"


def short(f: dict) -> str:
    """A trial's figures in one phrase: throughput, p50 and p99, memory."""
    parts = []
    if f.get("throughput_per_s") is not None:
        parts.append(f"{f['throughput_per_s']:,.1f} samples/s")
    for k in ("p50_ms", "p99_ms"):
        if f.get(k) is not None:
            parts.append(f"{k[:3]} {f[k]:.3g} ms")
    if f.get("memory_mb") is not None:
        parts.append(f"memory {f['memory_mb']:.0f} MiB")
    return ", ".join(parts)
