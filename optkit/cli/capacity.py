"""optkit capacity FIGURES (--peak RATE | --history FILE) -o CAPACITY.json [--html PAGE]"""
from __future__ import annotations

import typer

from optkit.cli import common, flags, options
from optkit.core.atomic import write_text


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
    from optkit.package.capacity import config as capacity_config
    from optkit.package.capacity import pictures, plan, replica, traffic

    cfg = capacity_config.build(config)
    common.guard_outputs({"-o": cfg.output, "--html": cfg.html}, [figures, cfg.history])
    per = replica.load(figures)
    tr = traffic.load(cfg.history) if cfg.history else traffic.constant(cfg.peak)
    p = plan.make_plan(per, tr, plan.Options.from_config(cfg))
    text = p.to_json()
    page = pictures.to_html(p) if cfg.html else None
    write_text(cfg.output, text + "\n")
    if page is not None:
        write_text(cfg.html, page)
    if shared.as_json:
        common.print_json(text)
    else:
        pictures.to_console(p, common.console())


def register(app: typer.Typer) -> None:
    app.command("capacity")(capacity_cmd)
