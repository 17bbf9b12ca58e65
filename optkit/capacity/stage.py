"""`capacity.plan`: `optkit capacity` as a recipe stage (pipeline/kinds.py lists it), its options CapacityConfig (the
command's flags are derived from it). The stage passes its model through (no copy, not measured again) and writes
CAPACITY.json and the page; the CAPACITY.json document is the stage's `measurements.capacity`, which a later
`package:` entry takes in memory, and the run's report carries the section its HTML report shows.

    stages: [..., {pass: capacity.plan, config: {history: traffic.csv, output: CAPACITY.json, slo_p99_ms: 50}}]
    capacity: {figures: best.json, peak: 400, output: CAPACITY.json}      # the same, as the run's last stage

The per-replica figures: `figures` (a best.json, report.json or lineage, as the command takes), else the tune stage
before it in this run (its best setting, in memory), else the run's stages so far (the last one timed with a
throughput). A recipe with no model runs it on `figures` alone: `optkit capacity` is that one-stage recipe.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from optkit.capacity import pictures, replica
from optkit.capacity import run as crun
from optkit.capacity.config import CapacityConfig
from optkit.contracts.files import FileRef
from optkit.core.artifact import Artifact
from optkit.core.errors import UsageError
from optkit.core.formats import Format
from optkit.core.registry import ConfigError, Pass, PassContext

FORMAT = "capacity"   # the output record of a run without a model: CAPACITY.json itself


class CapacityPlan(Pass):
    name = "capacity.plan"
    summary = "Replicas and autoscaling from the run's figures and a traffic history (the model passes through)"
    accepts = tuple(Format)
    produces = Format.ONNX     # not used: the stage passes its model through (passes_through)
    Config = CapacityConfig
    measured = False
    cached = False
    passes_through = True
    recipe_paths = True

    @classmethod
    def runs_without_model(cls, config: CapacityConfig) -> bool:
        return config.figures is not None

    @classmethod
    def check(cls, config: CapacityConfig) -> None:
        """Before any stage runs: the traffic history reads (exit 2 naming the key and the row)."""
        try:
            crun.load_traffic(config)
        except UsageError as e:
            raise ConfigError(cls.name, ("history" if config.history else "peak",), e.message) from None

    def run(self, artifact: Artifact | None, config: CapacityConfig, ctx: PassContext):
        per = figures_of(config, ctx.earlier)
        result = crun.run(per, config)
        ctx.measurements["capacity"] = json.loads(result.text)
        ctx.report_fields["capacity"] = pictures.section(result.plan, config.output, config.html)
        ctx.note(f"CAPACITY.json written to {config.output}" + (f", the page to {config.html}" if config.html else "")
                 + f" (autoscaling: {result.plan.chosen})")
        if artifact is not None:
            return artifact
        return FileRef(path=str(config.output), format=FORMAT, sha256=hashlib.sha256(result.text.encode()
                                                                                      + b"\n").hexdigest())


def figures_of(config: CapacityConfig, earlier: list) -> replica.PerReplica:
    """The figures the plan is for: the file named, else this run's last tune stage (in memory), else its stages."""
    if config.figures:
        return replica.load(config.figures)
    tune = next((s for s in reversed(earlier) if s.pass_name == "tune.onnx"
                 and isinstance(s.measurements.get("tune"), dict)), None)
    if tune is not None:
        return replica.from_tune_result(tune.measurements["tune"], f"stage {tune.name} (tune.onnx)",
                                        tune.output.path, tune.output.sha256)
    return replica.from_stages(list(earlier), "", "this run's report")


def document(stage) -> dict | None:
    """The CAPACITY.json document a capacity stage (a report Stage) wrote, as it holds it."""
    doc = stage.measurements.get("capacity") if stage.pass_name == CapacityPlan.name else None
    return doc if isinstance(doc, dict) else None


def output_of(stage) -> Path | None:
    """Where a capacity stage wrote CAPACITY.json."""
    return Path(stage.config["output"]) if document(stage) is not None else None
