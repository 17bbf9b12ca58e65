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
MAX_REPORT_BYTES = 256 << 20
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
        import json

        p = Path(path)
        if p.is_dir():
            raise UsageError(f"report {p} is a folder; name its report.json")
        if not p.is_file():
            raise UsageError(f"report {p} not found")
        try:
            with open(p, "rb") as f:
                raw = f.read(MAX_REPORT_BYTES + 1)
            if len(raw) > MAX_REPORT_BYTES:
                raise UsageError(f"{p} is over {MAX_REPORT_BYTES >> 20} MB; not an optkit report")
            data = json.loads(raw)
        except OSError as e:
            raise UsageError(f"cannot read report {p}: {e.strerror or e}") from None
        except ValueError as e:  # also bad UTF-8
            raise UsageError(f"{p} is not an optkit report: not valid JSON ({str(e).splitlines()[0]})") from None
        # a report is what optkit writes: the tool, a schema version and at least the input stage
        if not isinstance(data, dict) or data.get("tool") != "optkit" or "schema_version" not in data:
            raise UsageError(f"{p} is not an optkit report (no \"tool\": \"optkit\" and \"schema_version\")")
        if not isinstance(data.get("stages"), list) or not data["stages"]:
            raise UsageError(f"{p} is not a complete optkit report: it has no stages")
        try:
            report = cls.model_validate(data)
        except ValueError as e:
            err = e.errors()[0] if hasattr(e, "errors") else None
            what = (".".join(str(x) for x in err["loc"]) + ": " + err["msg"]) if err else str(e).splitlines()[0]
            raise UsageError(f"{p} is not an optkit report: {what}") from None
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
