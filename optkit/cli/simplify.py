"""optkit simplify MODEL -o OUT"""
from __future__ import annotations

from typing import Optional

import typer

from optkit.cli import common, options
from optkit.core.errors import UsageError
from optkit.core.shapes import parse_shapes, parse_values


def register(app: typer.Typer) -> None:
    @app.command("simplify")
    def simplify_cmd(
        model: str = typer.Argument(..., help="ONNX model."),
        output: str = typer.Option(..., "-o", "--output", help="Where to write the simplified model."),
        engine: str = typer.Option("onnxslim", "--engine", help="onnxslim (default) or onnxsim."),
        no_ort: bool = typer.Option(False, "--no-ort", help="Skip onnxruntime's offline optimizations."),
        target: Optional[str] = typer.Option(None, "--target-provider",
                                             help="Allow this provider's fused ops (cpu, cuda): not portable."),
        max_growth: float = typer.Option(1.5, "--max-growth", min=0.01,
                                         help="Refuse results larger than this many times the input."),
        tolerance: float = typer.Option(1e-5, "--tolerance", min=0, help="Max output difference allowed."),
        data: Optional[str] = typer.Option(None, "--data", help="Check outputs on these inputs (default: random)."),
        threads: Optional[int] = options.THREADS,
        shape: Optional[list[str]] = options.SHAPE,
        value: Optional[list[str]] = options.VALUE,
        report: Optional[str] = options.OUTPUT_REPORT,
        as_json: bool = options.JSON,
        print_recipe: bool = options.PRINT_RECIPE,
    ) -> None:
        """onnxslim + onnxruntime offline optimizations, checked for equal outputs and bounded growth."""
        from optkit.measure.model import DataSpec, MeasureSettings

        common.guard_outputs({"-o": output, "--report": report}, [model, data])
        if engine not in ("onnxslim", "onnxsim"):
            raise UsageError(f"unknown --engine {engine!r}; choose onnxslim or onnxsim")
        settings = MeasureSettings(threads=threads, shapes=parse_shapes(shape), values=parse_values(value))
        config = dict(engine=engine, ort_optimize=not no_ort, provider=target, max_growth=max_growth,
                      tolerance=tolerance)
        common.run_single_stage("simplify.onnx", model, output, config, command=f"optkit simplify {model}",
                                settings=settings, eval_data=DataSpec(path=data, max_samples=256) if data else None,
                                report_path=report, as_json=as_json, print_recipe=print_recipe)
