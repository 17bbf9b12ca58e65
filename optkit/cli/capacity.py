"""optkit capacity FIGURES (--peak RATE | --history FILE) -o CAPACITY.json [--html PAGE]"""
from __future__ import annotations

import typer

from optkit.cli import common, flags, options


@flags.capacity_options()
@flags.groups("json")
def capacity_cmd(
    figures: str = typer.Argument(..., help="Per-replica figures: a tune best.json, a bench report.json "
                                            "(bench --url URL --concurrency N --report FILE) or a package "
                                            "version's optkit-package.json (or its folder)."),
    *, config: dict, shared: options.Shared,
) -> None:
    """Replicas and autoscaling from per-replica figures and traffic: the HPA rule replayed minute by minute
    (fixed for the peak, reactive, and with a forecast's KEDA cron schedule), the target utilisation searched."""
    from optkit.capacity import config as capacity_config
    from optkit.capacity import pictures, replica
    from optkit.capacity import run as capacity_run

    cfg = capacity_config.build(config)
    common.guard_outputs({"-o": cfg.output, "--html": cfg.html}, {"FIGURES": figures, "--history": cfg.history})
    result = capacity_run.run(replica.load(figures), cfg)
    if shared.as_json:
        common.print_json(result.text)
    else:
        pictures.to_console(result.plan, common.console())


def register(app: typer.Typer) -> None:
    app.command("capacity")(capacity_cmd)
