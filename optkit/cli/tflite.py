"""optkit tflite MODEL -o OUT.tflite --mode float32|float16|dynamic|int8 [--io int8] [--sparse] [--calib DATA]"""
from __future__ import annotations

from typing import Optional

import typer

from optkit.cli import common, flags, options


@flags.pass_options("tflite.export")
@flags.groups("eval_data", "metric", "layout", "measure", "output", "print_recipe")
def tflite_cmd(
    model: str = typer.Argument(..., help="Keras model (.keras / .h5, QAT included) or SavedModel folder."),
    output: str = options.output_file("Where to write the .tflite model."),
    calib: Optional[str] = typer.Option(None, "--calib", help="Representative data for int8 (.npz, images)."),
    *, config: dict, shared: options.Shared,
) -> None:
    """Export a Keras model or SavedModel to TFLite (float32, float16, dynamic range or int8)."""
    from optkit.core.registry import build_config
    from optkit.measure.model import DataSpec
    from optkit.passes import get_pass

    common.guard_outputs({"-o": output, "--report": shared.report},
                         common.inputs_of(shared, {"MODEL": model, "--calib": calib}))
    mode, signature = config.get("mode", flags.default("tflite.export", "mode")), config.get("signature")
    build_config(get_pass("tflite.export"), config)
    pre = {"layout": shared.layout or "nhwc"}  # Keras models and SavedModels take NHWC
    data = {"calibration": {"path": calib, "preprocess": pre}} if calib else {}
    common.run_single_stage(
        "tflite.export", model, output, config, command=f"optkit tflite {model} --mode {mode}",
        settings=shared.settings(), eval_data=DataSpec(path=shared.eval_data, preprocess=pre) if shared.eval_data
        else None, metric=shared.metric if shared.eval_data else None, report_path=shared.report,
        as_json=shared.as_json, signature=signature, print_recipe=shared.print_recipe, data=data)


def register(app: typer.Typer) -> None:
    app.command("tflite")(tflite_cmd)
