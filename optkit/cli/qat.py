"""optkit qat MODEL.keras -o OUT.h5 --train DATA: quantization-aware training (TF-MOT) with fine-tuning."""
from __future__ import annotations

from typing import Optional

import typer

from optkit.cli import common, flags, options
from optkit.cli.prune import add_tensorboard, run_stage, split_names
from optkit.core.shapes import parse_shapes, parse_values


def register(app: typer.Typer) -> None:
    @app.command("qat")
    @flags.pass_options("qat.keras")
    def qat_cmd(
        model: str = typer.Argument(..., help="tf-keras model (.keras / .h5)."),
        output: str = typer.Option(..., "-o", "--output", help="Where to write the QAT model (.h5)."),
        train: Optional[str] = options.TRAIN,
        eval_data: Optional[str] = options.EVAL_DATA,
        metric: str = options.METRIC,
        layout: Optional[str] = options.LAYOUT,
        color: str = options.COLOR,
        threads: Optional[int] = options.THREADS,
        shape: Optional[list[str]] = options.SHAPE,
        value: Optional[list[str]] = options.VALUE,
        report: Optional[str] = options.OUTPUT_REPORT,
        as_json: bool = options.JSON,
        print_recipe: bool = options.PRINT_RECIPE,
        *,
        config: dict,
    ) -> None:
        """Quantization-aware training for a Keras model; export it with `optkit tflite --mode int8`."""
        from optkit.core.registry import build_config
        from optkit.measure.model import MeasureSettings
        from optkit.passes import get_pass

        common.guard_outputs({"-o": output, "--report": report}, [model, train, eval_data])
        if config.get("layers"):
            config["layers"] = split_names(config["layers"])
        add_tensorboard(config, config.pop("tensorboard", None))
        build_config(get_pass("qat.keras"), config)
        settings = MeasureSettings(threads=threads, shapes=parse_shapes(shape), values=parse_values(value))
        run_stage("qat.keras", model, output, config, train=train, eval_data=eval_data, metric=metric,
                  settings=settings, command=f"optkit qat {model}", weights=None, report=report, as_json=as_json,
                  print_recipe=print_recipe, preprocess={"layout": layout or "nhwc", "color": color})
