"""optkit simplify MODEL -o OUT"""
from __future__ import annotations

from typing import Optional

import typer

from optkit.cli import common, flags, options
from optkit.core.errors import UsageError
from optkit.core.shapes import parse_shapes, parse_values


def register(app: typer.Typer) -> None:
    @app.command("simplify")
    @flags.pass_options("simplify.onnx")
    def simplify_cmd(
        model: str = typer.Argument(..., help="ONNX model."),
        output: str = typer.Option(..., "-o", "--output", help="Where to write the simplified model."),
        data: Optional[str] = options.DATA,
        threads: Optional[int] = options.THREADS,
        shape: Optional[list[str]] = options.SHAPE,
        value: Optional[list[str]] = options.VALUE,
        report: Optional[str] = options.OUTPUT_REPORT,
        as_json: bool = options.JSON,
        print_recipe: bool = options.PRINT_RECIPE,
        *,
        config: dict,
    ) -> None:
        """onnxslim + onnxruntime offline optimizations, checked for equal outputs and bounded growth."""
        from optkit.measure.model import DataSpec, MeasureSettings

        common.guard_outputs({"-o": output, "--report": report}, [model, data])
        engine = config.get("engine", flags.default("simplify.onnx", "engine"))
        if engine not in ("onnxslim", "onnxsim"):
            raise UsageError(f"unknown --engine {engine!r}; choose onnxslim or onnxsim")
        settings = MeasureSettings(threads=threads, shapes=parse_shapes(shape), values=parse_values(value))
        common.run_single_stage("simplify.onnx", model, output, config, command=f"optkit simplify {model}",
                                settings=settings, eval_data=DataSpec(path=data, max_samples=256) if data else None,
                                report_path=report, as_json=as_json, print_recipe=print_recipe)
