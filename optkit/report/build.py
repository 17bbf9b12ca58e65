"""Turning artifacts, stage results and measurements into report stages."""
from __future__ import annotations

from typing import Any

from optkit.core.artifact import Artifact
from optkit.report.schema import ArtifactRef, Stage


def ref(artifact: Artifact | ArtifactRef) -> ArtifactRef:
    if isinstance(artifact, ArtifactRef):  # a stage that made no model records the file it wrote
        return artifact
    d = {**artifact.to_dict(), "path": str(artifact.path)}   # the file record is strict: a path as text
    return ArtifactRef(**{k: d[k] for k in ArtifactRef.model_fields})


def input_stage(artifact: Artifact, measurements: dict[str, Any], name: str = "input") -> Stage:
    return Stage(name=name, output=ref(artifact), measurements=measurements, notes=inputs_note(measurements))


def inputs_note(measurements: dict[str, Any]) -> list[str]:
    """Which input shapes the figures come from, when optkit chose them (dynamic dims nobody set)."""
    inputs = measurements.get("inputs") or {}
    if inputs.get("dims") not in ("probed", "from the dim names"):
        return []
    shapes = ", ".join(f"{k} [{','.join(map(str, v))}]" for k, v in (inputs.get("shapes") or {}).items())
    return [f"inputs synthesized as {shapes} (dynamic dims {inputs['dims']}; set them with --shape)"]


def pass_stage(result, measurements: dict[str, Any]) -> Stage:
    """A report stage from a pipeline StageResult; figures the pass measured itself are kept too."""
    return Stage(
        name=result.name, pass_name=result.pass_name, input=ref(result.input) if result.input is not None else None,
        output=ref(result.output),
        config=result.config, duration_s=round(result.duration_s, 3), cached=result.cached,
        notes=list(result.ctx.notes), brief=list(result.ctx.brief or result.ctx.notes[:1]),
        warnings=list(result.ctx.warnings), measurements={**result.ctx.measurements, **measurements},
    )


def tune_stage(artifact: Artifact, result: dict[str, Any], notes: list[str], size: dict[str, Any]) -> Stage:
    """`optkit tune`'s one stage: the search (measurements.tune) and the best setting's figures, which tables
    and gates read as throughput under load and memory."""
    best, setting = result["best"]["figures"], result["best"]["setting"]
    return Stage(name="tune", pass_name="tune.onnx", output=ref(artifact), notes=notes, measurements={
        "tune": result,
        "size": size,
        "concurrency": {"concurrency": setting["concurrency"],
                        "sessions": setting["concurrency"] if setting["sessions"] == "per-thread" else 1,
                        "batch": setting["batch"], "throughput_per_s": best.get("throughput_per_s"),
                        "p50_ms": best.get("p50_ms"), "p90_ms": best.get("p90_ms"), "p99_ms": best.get("p99_ms")},
        "memory": {"peak_mb": best.get("memory_mb"), "load_mb": best.get("load_mb")},
    })
