"""optkit-package.json: a package version's lineage (package/lineage.py builds it, package/build.py writes it
beside the model; MLflow's `metadata` carries it too). Where the model came from, the passes that made it and what
each wrote, what was measured with its noise, the tuned setting and its confirmation, the machine and the time;
`model.sha256` is the model its figures are for and `files` the sha256 of every file of the version, so a reader
(serve-version, inspect, `optkit capacity`) checks the folder is the one the lineage describes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from optkit.contracts.base import (
    Fraction,
    Label,
    MiB,
    Ms,
    Name,
    Open,
    Sha256,
    Strict,
    Tag,
    TargetName,
    Version,
    build,
    load,
)
from optkit.contracts.best import Confirmed, TunedFigures, TunedSetting
from optkit.contracts.files import FileRef
from optkit.core.artifact import path_sha256
from optkit.core.errors import UsageError

SCHEMA = "optkit-package/1"
FILE = "optkit-package.json"
HINT = "it is the lineage optkit wrote for this version: restore it or package the model again"


# ------------------------------------------------------------------ the report figures a package carries

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


# ------------------------------------------------------------------ the lineage

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
    """A model in parts (package/ensemble.py): where the split came from (its split.json or the model, and the
    sha256 of the model that was split), its parts, and each part model's files as written (folder -> {file:
    sha256})."""
    kind: Literal["split", "preprocess"]
    source: str
    source_sha256: Sha256
    model_sha256: Sha256 | None = None
    parts: list[dict[str, Any]]
    cuts: list[dict[str, Any]] = Field(default_factory=list)
    models: dict[Name, dict[str, Sha256]]


class SourceFolder(Strict):
    """The Hugging Face folder a model was converted from: its path and each of its files' sha256."""
    path: str
    files: dict[str, Sha256]


class PreprocessorRecord(Strict):
    """The model's preprocessor folder as the version carries it (package/preprocessor.py)."""
    path: Name
    sha256: Sha256
    kind: Literal["tokenizer", "image-processor"]
    source: SourceFolder | None = None


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
    preprocessor: PreprocessorRecord | None = None


def document(data: dict) -> Lineage:
    """The lineage as package writes it: exit 3 if a reader would refuse it."""
    return build(Lineage, data, FILE)


def read(path: Path) -> tuple[dict, Lineage]:
    """A version's lineage through its contract; exit 2 naming the file and the key."""
    return load(path, Lineage, HINT)


def verify_files(vdir: Path, recorded: dict, fix: str = "restore it or package the model again") -> None:
    """Every file the version's lineage records is there with the bytes optkit wrote (a server would load a
    damaged or replaced model.onnx as it stands; figures read from a lineage are of the model beside it), else
    exit 2 naming it."""
    for rel, digest in recorded["files"].items():
        p = vdir / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts or not rel:
            raise UsageError(f"{vdir / FILE}: key files.{rel}: not a file of the version folder; {HINT}")
        if p.is_symlink() or not p.is_file():
            raise UsageError(f"{p} is missing (the lineage lists it); {fix}")
        have = path_sha256(p)
        if have != digest:
            raise UsageError(f"{vdir / FILE}: key files.{rel}: {p} was edited after optkit packaged it, or "
                             f"is another model's (its sha256 {have[:12]}..., the lineage records {digest[:12]}...); "
                             f"{fix}")
