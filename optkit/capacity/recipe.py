"""`capacity:` in a recipe: `optkit capacity` run on this run's figures after the stages (and whatever the gates
say), the traffic read and every option checked before any stage runs. The same CapacityConfig and the same
run (capacity/run.py) as the command: the same inputs give the same CAPACITY.json.

    capacity: {history: traffic.csv, output: CAPACITY.json, html: capacity.html, slo_p99_ms: 50}
    capacity: {figures: best.json, peak: 400, output: CAPACITY.json}
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optkit.capacity import config as cmod
from optkit.capacity import pictures, replica
from optkit.capacity import run as crun
from optkit.capacity.traffic import Traffic
from optkit.core.atomic import Input, Output
from optkit.core.errors import UsageError


@dataclass
class Prepared:
    cfg: cmod.CapacityConfig
    traffic: Traffic


@dataclass
class CapacityStep:
    """`capacity:` as a step of the run: the figures and the traffic history it reads, the CAPACITY.json and
    the page it writes."""
    loaded: Any  # pipeline.recipe.LoadedRecipe

    def paths(self) -> tuple[list[Input], list[Output]]:
        loaded, spec = self.loaded, self.loaded.recipe.capacity
        named = [(k, loaded.resolve(getattr(spec, k))) for k in ("figures", "history", "output", "html")]
        place = {k: (loaded.where(("capacity", k)), path) for k, path in named if path}
        return ([Input(*place[k]) for k in ("figures", "history") if k in place],
                [Output(*place[k]) for k in ("output", "html") if k in place])


def prepare(loaded) -> Prepared | None:
    """Before any stage runs: the options (exit 2 naming the recipe line), the figures file, the traffic (its
    outputs are checked with every other step's: CapacityStep, pipeline.steps.guard)."""
    spec = loaded.recipe.capacity
    if spec is None:
        return None
    where = loaded.where(("capacity",))
    resolved = {k: loaded.resolve(getattr(spec, k)) for k in ("output", "history", "html", "figures")}
    try:
        cfg = cmod.build(spec.model_dump() | resolved)
    except UsageError as e:
        raise UsageError(f"{where}: {e.message}") from None
    for key in ("figures", "history"):
        path = getattr(cfg, key)
        if path and not Path(path).exists():
            raise UsageError(f"{loaded.where(('capacity', key))}: {getattr(spec, key)} does not exist (paths are "
                             "relative to the recipe file)")
    try:
        tr = crun.load_traffic(cfg)
    except UsageError as e:
        raise UsageError(f"{loaded.where(('capacity', 'history' if cfg.history else 'peak'))}: {e.message}") \
            from None
    return Prepared(cfg=cfg, traffic=tr)


def figures_of(prep: Prepared, report) -> replica.PerReplica:
    if prep.cfg.figures:
        return replica.load(prep.cfg.figures)
    tune = next((s for s in reversed(report.stages) if s.pass_name == "tune.onnx"
                 and isinstance(s.measurements.get("tune"), dict)), None)
    if tune is not None:
        return replica.from_tune_result(tune.measurements["tune"], f"stage {tune.name} (tune.onnx)",
                                        tune.output.path, tune.output.sha256)
    return replica.from_report(report, "this run's report")


def run(prep: Prepared, report) -> crun.Result:
    """After the stages: the plan from this run's figures, CAPACITY.json and the page written, and the section the
    run's report carries (its HTML report shows it)."""
    result = crun.run(figures_of(prep, report), prep.cfg, prep.traffic)
    report.capacity = pictures.section(result.plan, prep.cfg.output, prep.cfg.html)
    return result
