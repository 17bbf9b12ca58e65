"""optkit qat MODEL.keras -o OUT.h5 --train DATA: quantization-aware training (TF-MOT) with fine-tuning."""
from __future__ import annotations

import typer

from optkit.cli import common, flags, options
from optkit.cli.prune import add_tensorboard, run_stage, split_names
from optkit.core.atomic import Output, adding_folder


@flags.pass_options("qat.keras")
@flags.groups("finetune", "measure", "output", "print_recipe")
def qat_cmd(
    model: str = typer.Argument(..., help="tf-keras model (.keras / .h5)."),
    output: str = options.output_file("Where to write the QAT model (.h5)."),
    *, config: dict, shared: options.Shared,
) -> None:
    """Quantization-aware training for a Keras model; export it with `optkit tflite --mode int8`."""
    from optkit.core.registry import build_config
    from optkit.passes import get_pass

    common.guard_outputs([Output("-o", output), Output("--report", shared.report),
                          adding_folder("--tensorboard", config.get("tensorboard"))],
                         common.inputs_of(shared, {"MODEL": model}))
    if config.get("layers"):
        config["layers"] = split_names(config["layers"])
    add_tensorboard(config, config.pop("tensorboard", None))
    build_config(get_pass("qat.keras"), config)
    run_stage("qat.keras", model, output, config, shared=shared, command=f"optkit qat {model}",
              preprocess={"layout": shared.layout or "nhwc", "color": shared.color})


def register(app: typer.Typer) -> None:
    app.command("qat")(qat_cmd)
