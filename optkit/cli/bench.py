"""optkit bench MODEL"""
from __future__ import annotations

from typing import Optional

import typer

from optkit.cli import common, flags, options
from optkit.core.errors import UsageError
from optkit.core.text import redact_url


@flags.groups("data", "text", "weights", "runtime", "provider", "measure", "timing", "output")
def bench_cmd(
    ctx: typer.Context,
    model: Optional[str] = typer.Argument(None, help="Model file, SavedModel folder or file.py:factory (or "
                                                     "--url for a served model)."),
    batch: int = typer.Option(1, "--batch", min=1, help="Batch size (sets a dynamic first dim)."),
    duration: Optional[float] = typer.Option(None, "--duration", min=0.01,
                                             help="Time runs for this many seconds instead of --runs."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency",
                                              help="Also time N requests in flight from N threads: throughput "
                                                   "and latency under load."),
    sessions: str = typer.Option("shared", "--sessions", help="Under --concurrency: shared (one session) or "
                                                              "per-thread (one session per thread)."),
    url: Optional[str] = typer.Option(None, "--url", help="Time a served model instead, through the KServe "
                                                          "v2 HTTP protocol (Triton, MLServer, KServe): "
                                                          "http://HOST:PORT/v2/models/NAME. Each check "
                                                          "request may take 10 s, each inference 60 s, each "
                                                          "timing loop 120 s (or --duration)."),
    *, shared: options.Shared,
) -> None:
    """Latency on the model's own runtime (p50/p90/p99, mean, std, throughput), memory, and with
    --concurrency throughput under load; with --url, of a model a KServe v2 server serves."""
    from optkit.measure.model import DataSpec

    data = DataSpec(path=shared.data, **shared.text()) if shared.data else None
    if url is not None:
        return _bench_url(ctx, model, url, shared, batch=batch, duration=duration, concurrency=concurrency, data=data)
    if model is None:
        raise UsageError("give the MODEL to time (a file, SavedModel folder or file.py:factory), or --url for "
                         "a served model; see optkit bench --help")
    if sessions not in ("shared", "per-thread"):
        raise UsageError(f"--sessions {sessions!r}: give shared or per-thread")
    if sessions != "shared" and not concurrency:
        raise UsageError("--sessions applies to --concurrency: give --concurrency N as well")
    common.guard_outputs({"--report": shared.report}, common.inputs_of(shared, {"MODEL": model}))
    settings = shared.settings(batch=batch, duration=duration, concurrency=concurrency, sessions=sessions)
    artifact = common.load_artifact(model, shared.weights)
    common.measure_and_report(artifact, settings, command=f"optkit bench {model}", latency=True, data=data,
                              report_path=shared.report, as_json=shared.as_json)


# flags about how optkit runs a model itself: a served model's server owns these
NOT_FOR_URL = ("threads", "runtime", "provider", "sessions", "weights")


def _bench_url(ctx, model: Optional[str], url: str, shared: options.Shared, *, batch: int, duration: Optional[float],
               concurrency: Optional[int], data) -> None:
    """optkit bench --url: the same figures as for a model file, timed through the server's v2 HTTP endpoint."""
    if model is not None:
        raise UsageError(f"give a MODEL or --url, not both: {model!r} would be timed in this process, --url on the "
                         "server")
    # typer may vendor click: compare the source by name, not with click's ParameterSource
    given = [p for p in NOT_FOR_URL if getattr(ctx.get_parameter_source(p), "name", "DEFAULT") != "DEFAULT"]
    if given:
        named = ", ".join(f"--{p}" for p in given)
        raise UsageError(f"{named} {'does' if len(given) == 1 else 'do'} not apply to --url: the server runs the "
                         "model with its own settings (set them in its model configuration)")
    common.guard_outputs({"--report": shared.report}, common.inputs_of(shared, {}))
    settings = shared.settings(batch=batch, duration=duration, concurrency=concurrency)
    common.measure_url_and_report(url, settings, command=f"optkit bench --url {redact_url(url)}", data=data,
                                  report_path=shared.report, as_json=shared.as_json)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench_cmd)
