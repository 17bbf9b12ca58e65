"""optkit capacity FIGURES (--peak RATE | --history FILE) -o CAPACITY.json [--html PAGE]: the one-stage recipe of
the capacity.plan stage (optkit/capacity/stage.py), with no model: the figures are its input."""
from __future__ import annotations

import typer

from optkit.cli import common, flags, onestage, options


@flags.pass_options("capacity.plan")
@flags.groups("json", "print_recipe")
def capacity_cmd(
    figures: str = typer.Argument(..., help="Per-replica figures: a tune best.json, a bench report.json "
                                            "(bench --url URL --concurrency N --report FILE) or a package "
                                            "version's optkit-package.json (or its folder)."),
    *, config: dict, shared: options.Shared,
) -> None:
    """Replicas and autoscaling from per-replica figures and traffic: the HPA rule replayed minute by minute
    (fixed for the peak, reactive, and with a forecast's KEDA cron schedule), the target utilisation searched."""
    from pathlib import Path

    from optkit.capacity import config as capacity_config
    from optkit.capacity import pictures, replica
    from optkit.capacity import run as capacity_run
    from optkit.contracts import base
    from optkit.contracts import capacity as contract

    cfg = capacity_config.build({**config, "figures": figures})  # each error names its flag
    common.guard_outputs({"-o": cfg.output, "--html": cfg.html}, {"FIGURES": figures, "--history": cfg.history})
    if not shared.print_recipe:  # the command's own lines for its inputs, before the recipe runs
        capacity_run.load_traffic(cfg)
        replica.load(figures)
    cfg = cfg.model_copy(update={k: str(Path(v).absolute()) for k in ("output", "history", "html", "figures")
                                 if (v := getattr(cfg, k))})  # the printed recipe runs from anywhere
    report = onestage.run_recipe_stage("capacity.plan", None, cfg, settings=None, command=f"optkit capacity {figures}",
                                       output=cfg.output, keep=lambda stage: None, print_recipe=shared.print_recipe)
    if report is None:  # --print-recipe: printed, nothing ran
        return
    doc = report.stages[-1].measurements["capacity"]
    if shared.as_json:
        common.print_json(base.text(base.validate(doc, contract.CapacityFile, cfg.output, contract.HINT)).rstrip("\n"))
    else:
        pictures.to_console(doc, common.console())


def register(app: typer.Typer) -> None:
    app.command("capacity")(capacity_cmd)
