"""optkit capacity FIGURES (--peak RATE | --history FILE) -o CAPACITY.json [--html PAGE]"""
from __future__ import annotations

from typing import Optional

import typer

from optkit.cli import common, flags, options
from optkit.core.atomic import write_text
from optkit.core.errors import UsageError


@flags.groups("json")
def capacity_cmd(
    figures: str = typer.Argument(..., help="Per-replica figures: a tune best.json, a bench report.json "
                                            "(bench --url URL --concurrency N --report FILE) or a package "
                                            "version's optkit-package.json (or its folder)."),
    output: str = options.output_file("CAPACITY.json to write: replicas, requests, autoscaling, schedule and "
                                      "the replay (read by `optkit package --capacity`)."),
    peak: Optional[float] = typer.Option(None, "--peak", help="Peak request rate (requests/s), instead of a "
                                                              "history."),
    history: Optional[str] = typer.Option(None, "--history", help="Traffic history: CSV of timestamp,"
                                          "requests_per_s (ISO 8601 or epoch seconds) or a Prometheus "
                                          "range-query JSON."),
    html: Optional[str] = typer.Option(None, "--html", help="Also write an HTML page: traffic, capacity and "
                                                            "replicas over time, SLO minutes marked."),
    headroom: float = typer.Option(0.2, "--headroom", min=0, max=4,
                                   help="Spare capacity over the load when sizing (0.2: 20%)."),
    min_replicas: int = typer.Option(1, "--min-replicas", min=1, max=10000, help="Fewest replicas."),
    max_replicas: int = typer.Option(100, "--max-replicas", min=1, max=10000,
                                     help="Most replicas; a rate that needs more is exit 2."),
    startup: int = typer.Option(60, "--startup", min=0, max=3600,
                                help="Seconds a new pod takes before it serves."),
    lead: int = typer.Option(120, "--lead", min=0, max=86400,
                             help="Seconds before a predicted surge (beyond --startup) the schedule raises the "
                                  "minimum."),
    max_slo_minutes: int = typer.Option(0, "--max-slo-minutes", min=0,
                                        help="Minutes over the SLO the chosen target may allow in the replay."),
    tolerance: float = typer.Option(0.1, "--tolerance", min=0, max=1, help="HPA tolerance (its default 0.1)."),
    down_window: int = typer.Option(300, "--scale-down-window", min=0, max=3600,
                                    help="HPA scale-down stabilisation window, seconds (its default 300)."),
    slo_p99: Optional[float] = typer.Option(None, "--slo-p99", min=0,
                                            help="Latency objective, p99 in ms (default: tune's --slo)."),
    cpu: Optional[float] = typer.Option(None, "--cpu", min=0, help="CPU cores a replica uses at its throughput, "
                                                                   "where the figures carry none (bench --url)."),
    memory_mb: Optional[float] = typer.Option(None, "--memory-mb", min=0,
                                              help="Memory of one replica's container, MB (default: the model's "
                                                   "measured peak)."),
    no_forecast: bool = typer.Option(False, "--no-forecast", help="Reactive scaling only (no statsmodels)."),
    *, shared: options.Shared,
) -> None:
    """Replicas and autoscaling from per-replica figures and traffic: the HPA rule replayed minute by minute
    (fixed for the peak, reactive, and with a forecast's KEDA cron schedule), the target utilisation searched."""
    from optkit.package.capacity import pictures, plan, replica, traffic

    if (peak is None) == (history is None):
        raise UsageError("give one of --peak RATE or --history FILE")
    common.guard_outputs({"-o": output, "--html": html}, [figures, history])
    per = replica.load(figures)
    tr = traffic.load(history) if history else traffic.constant(peak)
    opts = plan.Options(headroom=headroom, min_replicas=min_replicas, max_replicas=max_replicas, startup_s=startup,
                        lead_s=lead, tolerance=tolerance, down_window_s=down_window, max_slo_minutes=max_slo_minutes,
                        slo_p99_ms=slo_p99, cpu_cores=cpu, memory_mb=memory_mb, forecast=not no_forecast)
    if min_replicas > max_replicas:
        raise UsageError(f"--min-replicas {min_replicas} is above --max-replicas {max_replicas}")
    p = plan.make_plan(per, tr, opts)
    text = p.to_json()
    page = pictures.to_html(p) if html else None
    write_text(output, text + "\n")
    if page is not None:
        write_text(html, page)
    if shared.as_json:
        common.print_json(text)
    else:
        pictures.to_console(p, common.console())


def register(app: typer.Typer) -> None:
    app.command("capacity")(capacity_cmd)
