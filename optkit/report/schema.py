"""The report: one JSON document with a versioned schema."""
from __future__ import annotations

import platform
import sys
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from optkit.core.atomic import write_text
from optkit.core.errors import UsageError

SCHEMA_VERSION = "1.0"
TRACKED = ("optkit", "numpy", "onnx", "onnxruntime", "onnxruntime-gpu", "torch", "onnxscript", "tensorflow",
           "tf-keras", "tensorflow-model-optimization", "tf2onnx", "onnxslim", "onnxsim",
           "onnxconverter-common", "tensorrt")


class ArtifactRef(BaseModel):
    path: str
    format: str
    sha256: str
    parent: str | None = None
    produced_by: str | None = None


class Stage(BaseModel):
    name: str
    pass_name: str | None = Field(default=None, alias="pass")
    input: ArtifactRef | None = None
    output: ArtifactRef
    config: dict[str, Any] = Field(default_factory=dict)
    duration_s: float = 0.0
    cached: bool = False
    notes: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    measurements: dict[str, Any] = Field(default_factory=dict)   # size, latency, accuracy, fidelity, io

    model_config = {"populate_by_name": True}


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

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, by_alias=True)

    def save(self, path: str | Path) -> Path:
        return write_text(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Report":
        p = Path(path)
        if not p.is_file():
            raise UsageError(f"report {p} not found")
        try:
            report = cls.model_validate_json(p.read_text())
        except ValueError as e:
            raise UsageError(f"{p} is not an optkit report: {str(e).splitlines()[0]}") from None
        if report.schema_version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise UsageError(f"{p} has report schema {report.schema_version}; this optkit reads {SCHEMA_VERSION}")
        return report


def machine_info() -> dict[str, Any]:
    import os

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
