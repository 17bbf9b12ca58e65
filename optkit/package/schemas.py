"""The files optkit reads back from a package repository, each through one validated schema: the version index
(`optkit-versions.json`), a version's lineage (`optkit-package.json`), `optkit tune`'s best.json as package reads
it, the report figures a package uses, and a version's `config.pbtxt`.

They are user input (anyone may have edited them): strict types, finite numbers, bounds, no unknown keys where
optkit wrote every key. A bad one is exit 2, one line naming the file and the key; readers get the plain dict back
once it is valid.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from optkit.core.errors import UsageError
from optkit.core.readback import read_regular
from optkit.core.text import redact_url

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
TAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
# Triton's versions are int64; a package keeps to a signed 32-bit int so every tool on the way can hold it
MAX_VERSION = 2 ** 31 - 1
MAX_MIB = float(2 ** 24)          # 16 TiB: no server has more memory than this
MAX_MS = 1e9                      # a latency past 11 days is no figure
MAX_FILE_BYTES = 64 << 20         # an index, lineage, best.json or config of optkit's is far smaller
MAX_CONFIG_BYTES = 1 << 20

Version = Annotated[int, Field(ge=1, le=MAX_VERSION)]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")]
TargetName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,63}$")]  # a registered package target's name
Tag = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")]
MiB = Annotated[float, Field(ge=0, le=MAX_MIB)]
Ms = Annotated[float, Field(ge=0, le=MAX_MS)]
Fraction = Annotated[float, Field(ge=0, le=1e6)]


class Strict(BaseModel):
    """Every key optkit writes, of its type; nothing else."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, populate_by_name=True)


class Open(BaseModel):
    """The keys optkit uses, checked; other keys are kept (figures of other groups) but their numbers must be
    finite."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    @model_validator(mode="after")
    def _finite_extras(self):
        for key, value in (self.model_extra or {}).items():
            _finite(value, key)
        return self


def _finite(value: Any, key: str) -> None:
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        raise ValueError(f"{key} is {value}, not a finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            _finite(v, f"{key}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _finite(v, f"{key}.{i}")


# ------------------------------------------------------------------ best.json (optkit tune -o) as package reads it

class SessionSetting(Strict):
    """onnxruntime session options, as optkit.onnx.session.OrtSettings (what tune searches)."""

    inter_op_threads: Annotated[int, Field(ge=1, le=256)] | None = None
    execution_mode: Literal["sequential", "parallel"] | None = None
    graph_optimization: Literal["disable", "basic", "extended", "all"] | None = None
    cpu_mem_arena: bool | None = None
    mem_pattern: bool | None = None


class TunedSetting(Strict):
    """A serving setting, as optkit.measure.serving.Setting (what tune writes under best.setting)."""

    provider: Literal["cpu", "cuda", "tensorrt"] = "cpu"
    threads: Annotated[int, Field(ge=1, le=1024)] | None = None
    batch: Annotated[int, Field(ge=1, le=65536)] = 1
    concurrency: Annotated[int, Field(ge=1, le=1024)] = 1
    sessions: Literal["shared", "per-thread"] = "shared"
    session: SessionSetting = Field(default_factory=SessionSetting)


class TunedFigures(Open):
    """A setting's measured figures; memory_mb (peak RSS) sizes the manifests' memory request."""

    memory_mb: MiB | None = None
    load_mb: MiB | None = None
    p50_ms: Ms | None = None
    p90_ms: Ms | None = None
    p99_ms: Ms | None = None
    throughput_per_s: Annotated[float, Field(ge=0)] | None = None


Label = Annotated[str, Field(pattern=r"^[^\x00-\x1f\x7f]{0,512}$")]  # a setting's label: one short line


class Confirmed(Strict):
    figure: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.]{1,64}$")]
    mean: float
    ci95: Annotated[list[float], Field(min_length=2, max_length=2)]
    rounds: Annotated[int, Field(ge=1, le=1_000_000)] | None = None

    @model_validator(mode="after")
    def _band(self):
        if self.ci95[0] > self.ci95[1]:
            raise ValueError(f"ci95: its low end {self.ci95[0]} is above its high end {self.ci95[1]}")
        return self


class Best(Strict):
    setting: TunedSetting
    label: Label = ""
    figures: TunedFigures = Field(default_factory=TunedFigures)
    trial: Annotated[int, Field(ge=0)] | None = None
    confirmed: Confirmed | None = None
    confirmed_by: Any = None


class TunedFile(Open):
    """best.json: the model it was tuned for and the best setting; tune's other keys are not read here."""

    model: str | None = None
    model_sha256: Sha256 | None = None
    objective: list[Literal["throughput", "latency", "cost"]] = Field(default_factory=list)
    best: Best


# ------------------------------------------------------------------ the report figures a package uses

class MemoryFigures(Open):
    peak_mb: MiB | None = None
    baseline_mb: MiB | None = None
    peak_rss_mb: MiB | None = None
    load_mb: MiB | None = None


class LatencyFigures(Open):
    p50_ms: Ms | None = None
    ci95_pct: Fraction | None = None


class SizeFigures(Open):
    bytes: Annotated[int, Field(ge=0)] | None = None


class Figures(Open):
    """A group of figures: any keys, every number finite."""


class Measured(Open):
    """A stage's measurements carried into the lineage: manifests read memory, inspect shows the rest."""

    size: SizeFigures | None = None
    latency: LatencyFigures | None = None
    memory: MemoryFigures | None = None
    accuracy: Figures | None = None
    fidelity: Figures | None = None
    latency_change: Figures | None = None


# ------------------------------------------------------------------ optkit-versions.json

class Registry(Strict):
    """Where an MLflow version was registered (optkit.package.registry): the URI as shown, without a password."""

    uri: str
    version: str | int
    alias: str

    @model_validator(mode="after")
    def _no_secret(self):
        if redact_url(self.uri) != self.uri:
            raise ValueError("uri: holds a password or token; optkit stores a registry URI without it")
        return self


class VersionEntry(Strict):
    version: Version
    tag: Tag | None = None
    created: str
    model_sha256: Sha256
    tuned: Label
    registry: Registry | None = None


class HistoryEntry(Strict):
    time: str
    served: Version
    before: Version | None = None
    why: str


class VersionIndex(Strict):
    schema_: Literal["optkit-versions/1"] = Field(alias="schema")
    target: TargetName
    name: Name
    versions: list[VersionEntry]
    served: Version | None = None
    history: list[HistoryEntry]
    parts: list[Name] = Field(default_factory=list)   # model folders an ensemble's versions own (Triton)

    @model_validator(mode="after")
    def _consistent(self):
        numbers = [v.version for v in self.versions]
        if len(set(numbers)) != len(numbers):
            raise ValueError("versions: a version is listed twice")
        tags = [v.tag for v in self.versions if v.tag is not None]
        if len(set(tags)) != len(tags):
            raise ValueError("versions: a tag is given to two versions")
        if self.served is not None and self.served not in numbers:
            raise ValueError(f"served: version {self.served} is not among the versions")
        return self


# ------------------------------------------------------------------ optkit-package.json (a version's lineage)

class FileRef(Strict):
    path: str
    sha256: str
    format: str
    parent: str | None = None
    produced_by: str | None = None


class PassRecord(Strict):
    stage: str
    pass_: str | None = Field(default=None, alias="pass")
    config: dict[str, Any] | None = None
    input: FileRef | None = None
    output: FileRef
    duration_s: Annotated[float, Field(ge=0)] | None = None
    cached: bool | None = None


class ReportRecord(Strict):
    path: str | None = None
    command: str
    created: str


class TunedRecord(Strict):
    source: str | None = None
    label: Label
    setting: TunedSetting
    objective: list[str] = Field(default_factory=list)
    figures: TunedFigures = Field(default_factory=TunedFigures)
    confirmed: Confirmed | None = None


class SplitRecord(Strict):
    """A model in parts (package/ensemble.py): where the split came from, its parts, and each part model's files
    as written (model folder -> {file: sha256})."""
    kind: Literal["split", "preprocess"]
    source: str
    source_sha256: Sha256
    parts: list[dict[str, Any]]
    cuts: list[dict[str, Any]] = Field(default_factory=list)
    models: dict[Name, dict[str, Sha256]]


class Lineage(Strict):
    schema_: Literal["optkit-package/1"] = Field(alias="schema")
    optkit: str
    created: str
    target: TargetName
    name: Name
    version: Version
    tag: Tag | None = None
    model: FileRef
    source: FileRef
    passes: list[PassRecord]
    report: ReportRecord | None = None
    measured: Measured
    tuned: TunedRecord
    mapping: list[dict[str, Any]] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    files: dict[str, Sha256]
    machine: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, Any] = Field(default_factory=dict)
    split: SplitRecord | None = None


# ------------------------------------------------------------------ reading

def read_bytes(path: Path, limit: int = MAX_FILE_BYTES, *, links: bool = False) -> bytes:
    """A regular file's bytes, never from a FIFO or device, nor through a link unless `links` (a file the user
    named, not one inside a package); exit 2 otherwise."""
    try:
        return read_regular(path, limit, links=links, hint="optkit wrote a file there: remove it")
    except FileNotFoundError:
        raise UsageError(f"{path} is missing; package the model again or restore it") from None


def load(path: Path, schema: type[BaseModel], hint: str, *, links: bool = False) -> tuple[dict, BaseModel]:
    """(the JSON document, its validated model); exit 2 with one line naming the file and the key."""
    raw = read_bytes(path, links=links)
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text (byte {e.start}); {hint}") from None
    except (ValueError, RecursionError) as e:
        raise UsageError(f"{path}: not JSON ({str(e).splitlines()[0][:80]}); {hint}") from None
    return data, validate(data, schema, path, hint)


def validate(data: Any, schema: type[BaseModel], path: Path | str, hint: str) -> BaseModel:
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        raise UsageError(f"{path}: {problem(e)}; {hint}") from None


def problem(e: ValidationError) -> str:
    """The first error of a validation: 'key a.b.0: what is wrong (got X)' on one line."""
    err = e.errors(include_url=False)[0]
    key = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    got = ""
    if err["type"] not in ("missing", "extra_forbidden") and "input" in err and not isinstance(err["input"], dict):
        shown = repr(err["input"])
        got = f" (got {shown if len(shown) <= 40 else shown[:37] + '...'})"
    return f"{'key ' + key + ': ' if key else ''}{msg}{got}".replace("\n", " ")


INDEX_HINT = "it is optkit's version index: restore it (or package into a new folder)"
LINEAGE_HINT = "it is the lineage optkit wrote for this version: restore it or package the model again"
TUNED_HINT = "give the JSON `optkit tune -o` wrote, unedited"


def load_index(path: Path) -> dict:
    return load(path, VersionIndex, INDEX_HINT)[0]


def load_lineage(path: Path) -> tuple[dict, Lineage]:
    return load(path, Lineage, LINEAGE_HINT)  # type: ignore[return-value]


def load_tuned(path: Path) -> tuple[dict, TunedFile]:
    return load(path, TunedFile, TUNED_HINT, links=True)  # type: ignore[return-value]


def check_measured(figures: dict, where: str) -> dict:
    """The report figures a package carries (memory for the manifests, latency and size for inspect)."""
    validate(figures, Measured, where, "give the report of the run that made the model, unedited")
    return figures


def check_recorded_text(path: Path, sha256: str | None, limit: int = MAX_CONFIG_BYTES) -> str:
    """A version's text file (a server's config), before it is served: the bytes optkit recorded in the lineage
    (sha256) and UTF-8, else exit 2. The target checks what the text says."""
    raw = read_bytes(path, limit)
    if sha256 is None:
        raise UsageError(f"{path}: the version's lineage records no sha256 for it (files.{path.name}); "
                         "package the model again")
    if hashlib.sha256(raw).hexdigest() != sha256:
        raise UsageError(f"{path} was edited after optkit packaged it (its sha256 is not the lineage's "
                         f"files.{path.name}); restore it or package the model again")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text (byte {e.start}); package the model again") from None
