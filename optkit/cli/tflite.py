"""optkit tflite MODEL -o OUT.tflite --mode float32|float16|dynamic|int8 [--io int8] [--sparse] [--calib DATA]"""
from __future__ import annotations

from typing import Optional

import typer

from optkit.cli import common, flags, options
from optkit.core.shapes import parse_shapes, parse_values


def register(app: typer.Typer) -> None:
    @app.command("tflite")
    @flags.pass_options("tflite.export")
    def tflite_cmd(
        model: str = typer.Argument(..., help="Keras model (.keras / .h5, QAT included) or SavedModel folder."),
        output: str = typer.Option(..., "-o", "--output", help="Where to write the .tflite model."),
        calib: Optional[str] = typer.Option(None, "--calib", help="Representative data for int8 (.npz, images)."),
        eval_data: Optional[str] = options.EVAL_DATA,
        metric: str = options.METRIC,
        layout: str = typer.Option("nhwc", "--layout", help="Image folders: nhwc or nchw."),
        threads: Optional[int] = options.THREADS,
        shape: Optional[list[str]] = options.SHAPE,
        value: Optional[list[str]] = options.VALUE,
        report: Optional[str] = options.OUTPUT_REPORT,
        as_json: bool = options.JSON,
        print_recipe: bool = options.PRINT_RECIPE,
        *,
        config: dict,
    ) -> None:
        """Export a Keras model or SavedModel to TFLite (float32, float16, dynamic range or int8)."""
        from optkit.core.registry import build_config
        from optkit.measure.model import DataSpec, MeasureSettings
        from optkit.passes import get_pass

        common.guard_outputs({"-o": output, "--report": report}, [model, calib, eval_data])
        mode, signature = config.get("mode", flags.default("tflite.export", "mode")), config.get("signature")
        build_config(get_pass("tflite.export"), config)
        pre = {"layout": layout}
        data = {"calibration": {"path": calib, "preprocess": pre}} if calib else {}
        settings = MeasureSettings(threads=threads, shapes=parse_shapes(shape), values=parse_values(value))
        common.run_single_stage(
            "tflite.export", model, output, config, command=f"optkit tflite {model} --mode {mode}",
            settings=settings, eval_data=DataSpec(path=eval_data, preprocess=pre) if eval_data else None,
            metric=metric if eval_data else None, report_path=report, as_json=as_json, signature=signature,
            print_recipe=print_recipe, data=data)
