"""optkit bench MODEL"""
from __future__ import annotations

from typing import Optional

import typer

from optkit.cli import common, options
from optkit.core.errors import UsageError
from optkit.core.shapes import parse_shapes, parse_values


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench_cmd(
        model: str = typer.Argument(..., help="Model file, SavedModel folder or file.py:factory."),
        threads: Optional[int] = options.THREADS,
        batch: int = typer.Option(1, "--batch", min=1, help="Batch size (sets a dynamic first dim)."),
        warmup: int = typer.Option(10, "--warmup", min=0, help="Untimed runs first."),
        runs: int = typer.Option(100, "--runs", min=1, help="Timed runs."),
        duration: Optional[float] = typer.Option(None, "--duration", min=0.01,
                                                 help="Time runs for this many seconds instead of --runs."),
        provider: str = options.PROVIDER,
        concurrency: Optional[int] = typer.Option(None, "--concurrency",
                                                  help="Also time N requests in flight from N threads: throughput "
                                                       "and latency under load."),
        sessions: str = typer.Option("shared", "--sessions", help="Under --concurrency: shared (one session) or "
                                                                  "per-thread (one session per thread)."),
        data: Optional[str] = options.DATA,
        shape: Optional[list[str]] = options.SHAPE,
        value: Optional[list[str]] = options.VALUE,
        weights: Optional[str] = options.WEIGHTS,
        report: Optional[str] = options.OUTPUT_REPORT,
        as_json: bool = options.JSON,
    ) -> None:
        """Latency on the model's own runtime (p50/p90/p99, mean, std, throughput), memory, and with
        --concurrency throughput under load."""
        from optkit.measure.model import DataSpec, MeasureSettings

        if sessions not in ("shared", "per-thread"):
            raise UsageError(f"--sessions {sessions!r}: give shared or per-thread")
        if sessions != "shared" and not concurrency:
            raise UsageError("--sessions applies to --concurrency: give --concurrency N as well")
        common.guard_outputs({"--report": report}, [model, weights, data])
        settings = MeasureSettings(provider=provider, threads=threads, batch=batch, warmup=warmup, runs=runs,
                                   duration=duration, shapes=parse_shapes(shape), values=parse_values(value),
                                   concurrency=concurrency, sessions=sessions)
        artifact = common.load_artifact(model, weights)
        common.measure_and_report(
            artifact, settings, command=f"optkit bench {model}", latency=True,
            data=DataSpec(path=data) if data else None, report_path=report, as_json=as_json,
        )
