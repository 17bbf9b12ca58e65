"""The report: one JSON document with a versioned schema."""
from __future__ import annotations

import os
import platform
import sys
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field, computed_field, field_validator

from optkit.contracts.files import FileRef
from optkit.core import strictjson
from optkit.core.atomic import write_text
from optkit.core.errors import UsageError
from optkit.core.readback import read_regular
from optkit.core.text import first_line
from optkit.report.figures import StageFigures

SCHEMA_VERSION = "1.0"
MAX_REPORT_BYTES = 256 << 20
MAX_STAGE_NAME = 1024  # a recipe's stage names have at most 100 characters
TRACKED = ("optkit", "numpy", "onnx", "onnxruntime", "onnxruntime-gpu", "torch", "onnxscript", "tensorflow",
           "tf-keras", "tensorflow-model-optimization", "tf2onnx", "onnxslim", "onnxsim",
           "onnxconverter-common", "tensorrt")


ArtifactRef = FileRef  # a stage's input and output: the one file record reports and lineage share


class Stage(BaseModel):
    name: str
    pass_name: str | None = Field(default=None, alias="pass")
    input: ArtifactRef | None = None
    output: ArtifactRef
    config: dict[str, Any] = Field(default_factory=dict)
    duration_s: float = 0.0
    cached: bool = False
    notes: list[str] = Field(default_factory=list)
    # the lines the console shows without -v, at most two: what was done and the latency verdict (each a note, or a
    # note's short form); notes holds them all, which -v, report.md and report.html show
    brief: list[str] = Field(default_factory=list, max_length=2)
    warnings: list[str] = Field(default_factory=list)
    measurements: dict[str, Any] = Field(default_factory=dict)   # size, latency, accuracy, fidelity, io

    model_config = {"populate_by_name": True}

    @property
    def measured(self) -> bool:
        """Whether the stage's model was measured (a split or capacity stage passes its model through unmeasured:
        its entry holds its own product, no figures)."""
        return "size" in self.measurements


class GateResult(BaseModel):
    gate: str
    metric: str
    stage: str
    value: float | None
    threshold: float
    op: str
    passed: bool
    margin: float | None = None
    detail: str = ""

    @computed_field
    @property
    def verdict(self) -> str:
        """pass, fail, or cannot judge (the figure's noise band straddles the threshold: not a pass either)."""
        if self.passed:
            return "pass"
        return "cannot judge" if self.detail.startswith("cannot judge") else "fail"


MAX_POINTS = 2000          # a capacity series is bucketed to at most this many points


def _finite_list(v: list, what: str) -> list:
    for x in v:
        if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float)) or not (0 <= x <= 1e12)):
            raise ValueError(f"{what}: {str(x)[:40]} is not a figure between 0 and 1e12")
    return v


Series = Annotated[list[float], Field(max_length=MAX_POINTS)]


class CapacityStrategy(BaseModel):
    model_config = {"extra": "ignore"}
    slo_minutes: int = Field(ge=0)
    replica_hours: float = Field(ge=0, allow_inf_nan=False)
    peak_replicas: int = Field(ge=0)
    target_utilization: float | None = Field(default=None, ge=0, le=1)
    replicas: Series = Field(default_factory=list)
    over: list[Annotated[list[int], Field(min_length=2, max_length=2)]] = Field(default_factory=list,
                                                                                 max_length=MAX_POINTS)

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, v):
        return _finite_list(v, "replicas")


class CapacitySection(BaseModel):
    """A recipe's `capacity:` result as the report carries it (rendered by report/html.py): the strategies'
    figures and their series bucketed to at most MAX_POINTS points, each bucket its highest minute."""
    model_config = {"extra": "ignore"}
    output: str = ""
    html: str | None = None
    chosen: str
    throughput_per_s: float = Field(gt=0, allow_inf_nan=False)
    throughput_source: str = ""
    minutes: int = Field(ge=0)
    start: str | None = None
    bucket_min: int = Field(ge=1)
    traffic: Series
    capacity: Series
    needed: Series
    forecast: Series | None = None
    strategies: dict[str, CapacityStrategy | None] = Field(max_length=8)
    notes: list[str] = Field(default_factory=list, max_length=200)

    @field_validator("traffic", "capacity", "needed", "forecast")
    @classmethod
    def _series(cls, v):
        return v if v is None else _finite_list(v, "series")


class Report(BaseModel):
    schema_version: str = SCHEMA_VERSION
    tool: str = "optkit"
    created: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    command: str = ""
    machine: dict[str, Any] = Field(default_factory=lambda: machine_info())
    versions: dict[str, str] = Field(default_factory=lambda: library_versions())
    recipe: dict[str, Any] | None = None
    run: dict[str, Any] | None = None          # run id, folder, whether it resumed (optkit run)
    stages: list[Stage] = Field(default_factory=list)
    gates: list[GateResult] = Field(default_factory=list)
    capacity: CapacitySection | None = None    # a recipe's `capacity:` section, as it ran

    def to_json(self) -> str:
        return strictjson.dumps(self, indent=2, nulls=True)  # a non-finite figure is null (figures.py: unbounded)

    def save(self, path: str | Path) -> Path:
        return write_text(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Report:
        p = Path(path)
        if p.is_dir():
            raise UsageError(f"report {p} is a folder; name its report.json")
        if not p.exists():
            raise UsageError(f"report {p} not found")
        try:
            data = strictjson.loads(read_regular(p, MAX_REPORT_BYTES, hint="name a report.json"))
        except FileNotFoundError:
            raise UsageError(f"report {p} not found") from None
        except ValueError as e:  # also bad UTF-8
            raise UsageError(f"{p} is not an optkit report: not valid JSON ({first_line(e)})") from None
        except RecursionError:
            raise UsageError(f"{p} is not an optkit report: its JSON is nested too deep") from None
        # a report is what optkit writes: the tool, a schema version and at least the input stage
        if not isinstance(data, dict) or data.get("tool") != "optkit" or "schema_version" not in data:
            raise UsageError(f"{p} is not an optkit report (no \"tool\": \"optkit\" and \"schema_version\")")
        if not isinstance(data.get("stages"), list) or not data["stages"]:
            raise UsageError(f"{p} is not a complete optkit report: it has no stages")
        _check_magnitudes(data, p)
        _check_figures(data, p)
        try:
            report = cls.model_validate(data)
        except ValueError as e:
            err = e.errors()[0] if hasattr(e, "errors") else None
            what = (".".join(str(x) for x in err["loc"]) + ": " + err["msg"]) if err else first_line(e)
            raise UsageError(f"{p} is not an optkit report: {what}") from None
        if report.schema_version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise UsageError(f"{p} has report schema {report.schema_version}; this optkit reads {SCHEMA_VERSION}")
        # every reader (gate, --baseline, render, compare, package --report) gets figures no measurement could
        # give refused here, naming the file: a band that is inverted, negative, NaN or does not hold its figure
        for i, stage in enumerate(report.stages):
            if len(stage.name) > MAX_STAGE_NAME:  # renderers repeat it beside every note: 5 MB x 10,000 notes
                raise UsageError(f"{p} is not an optkit report: stages.{i}.name is {len(stage.name):,} characters "
                                 f"long; a stage name has at most {MAX_STAGE_NAME}")
            try:
                StageFigures.of(stage, strict=True)
            except UsageError as e:
                raise UsageError(f"{p} is not an optkit report: stages.{i} {e}") from None
        return report


# figures that gates, comparisons and renderers read as numbers: each must be a number or null where present
_NUMBERS = {
    "size": ("bytes", "gzip_bytes", "size_mb", "parameters", "initializer_bytes", "sparsity"),
    "latency": ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "std_ms", "min_ms", "max_ms", "throughput_per_s", "runs",
                "batch", "ci95_pct", "low_ms", "low_ci95_pct", "normalized", "normalized_ci95_pct",
                "reference_p50_ms"),
    "fidelity": ("cosine", "top1_agreement", "max_abs_error", "mean_abs_error"),
}
_LISTS = ("trial_p50_ms", "trial_low_ms", "trial_normalized")


_FLOAT_MAX = sys.float_info.max


def _check_magnitudes(data: Any, p: Path) -> None:
    """Refuse (exit 2) an integer past float's range anywhere in a report (JSON allows 10**400; every figure is
    read as a float somewhere), naming its key, before anything converts it."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        v, where = stack.pop()
        if isinstance(v, dict):
            stack.extend((x, f"{where}.{k}" if where else str(k)) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{where}.{i}") for i, x in enumerate(v))
        elif isinstance(v, int) and not isinstance(v, bool) and not -_FLOAT_MAX <= v <= _FLOAT_MAX:
            raise UsageError(f"{p} is not an optkit report: {where or 'the document'} is an integer of "
                             f"{len(str(abs(v)))} digits, past any figure's range")


def _check_figures(data: dict, p: Path) -> None:
    """Refuse (exit 2) a report whose figures have the wrong types, before anything reads them as numbers.
    NaN and Infinity (JSON literals some tools write) are numbers: the gates fail on them."""
    def number(v) -> bool:
        return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))

    def bad(where: str, v) -> UsageError:
        shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
        return UsageError(f"{p} is not an optkit report: {where} is {shown}, not a number")

    def numbers(d: dict, keys, where: str) -> None:
        for k in keys:
            if k in d and not number(d[k]):
                raise bad(f"{where}.{k}", d[k])

    def lists(d: dict, where: str) -> None:
        for k in _LISTS:
            if k in d and d[k] is not None:
                if not isinstance(d[k], list) or not all(number(x) for x in d[k]):
                    raise bad(f"{where}.{k}", d[k])

    for i, stage in enumerate(data.get("stages") or []):
        m = stage.get("measurements") if isinstance(stage, dict) else None
        if not isinstance(m, dict):
            continue  # the schema check names it
        for group in ("size", "latency", "accuracy", "fidelity"):
            d, where = m.get(group), f"stages.{i}.measurements.{group}"
            if d is None:
                continue
            if not isinstance(d, dict):
                raise UsageError(f"{p} is not an optkit report: {where} is not an object")
            numbers(d, _NUMBERS.get(group, ()), where)
            if group == "accuracy":
                metric = d.get("metric")
                if metric is not None and not isinstance(metric, str):
                    raise UsageError(f"{p} is not an optkit report: {where}.metric is not a name")
                if isinstance(metric, str):
                    numbers(d, (metric,), where)
            if group == "latency":
                lists(d, where)
                refs = d.get("references")
                if refs is not None and not isinstance(refs, dict):
                    raise UsageError(f"{p} is not an optkit report: {where}.references is not an object")
                for name, r in (refs or {}).items():
                    if not isinstance(r, dict):
                        raise UsageError(f"{p} is not an optkit report: {where}.references.{name} is not an object")
                    numbers(r, ("normalized", "ci95_pct", "low_ms", "bytes", "layers"), f"{where}.references.{name}")
                    lists(r, f"{where}.references.{name}")
    for i, g in enumerate(data.get("gates") or []):
        if isinstance(g, dict):
            numbers(g, ("value", "threshold", "margin"), f"gates.{i}")


def machine_info() -> dict[str, Any]:
    info = {"system": platform.system(), "machine": platform.machine(), "python": sys.version.split()[0],
            "cpu_count": os.cpu_count(), "processor": _cpu_model()}
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def library_versions() -> dict[str, str]:
    out = {}
    for name in TRACKED:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out
