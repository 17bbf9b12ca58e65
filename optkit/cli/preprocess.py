"""optkit preprocess MODEL -o OUT --preprocess SPEC [--top-k K | --score-threshold T --max-detections N]"""
from __future__ import annotations

import typer

from optkit.cli import common, flags, options


@flags.pass_options("preprocess.onnx")
@flags.groups("data", "labels", "metric_optional", "measure", "output", "print_recipe")
def preprocess_cmd(
    model: str = typer.Argument(..., help="ONNX model."),
    output: str = options.output_file("Where to write the model with pre/post-processing in its graph."),
    *, config: dict, shared: options.Shared,
) -> None:
    """Put image preprocessing (uint8 images in) and top-k / detection post-processing into an ONNX model, checked
    against optkit's PIL preprocessing + the original model; states the bytes that cross per request."""
    from optkit.measure.model import DataSpec

    common.guard_outputs({"-o": output, "--report": shared.report}, common.inputs_of(shared, {"MODEL": model}))
    if isinstance(config.get("preprocess"), str):
        config["preprocess"] = _spec(config["preprocess"])
    elif "preprocess" not in config:  # a model converted from a Hugging Face folder: its own image processor
        config.update(_from_image_processor(model))
    pre = config.get("preprocess")
    # the input is measured on the data prepared by the spec (PIL path: its top-1 is the reference's); the
    # result takes uint8 images and is checked by the pass on the same files
    eval_data = DataSpec(path=shared.data, labels=shared.labels, preprocess=pre) if shared.data else None
    common.run_single_stage("preprocess.onnx", model, output, config, command=f"optkit preprocess {model}",
                            settings=shared.settings(), eval_data=eval_data,
                            metric=shared.metric if shared.data and pre else None, report_path=shared.report,
                            as_json=shared.as_json, print_recipe=shared.print_recipe)


def _spec(text: str) -> dict:
    """--preprocess: a YAML (or JSON) mapping, the keys of a recipe's `preprocess` (checked by the pass's Config)."""
    from optkit.pipeline.yamlsafe import yaml_with_lines

    mapping, _ = yaml_with_lines(text, "--preprocess")
    return mapping


def _from_image_processor(model: str) -> dict:
    """{"preprocess": spec} from the image processor that travelled with the model (core.preprocessor), or {}."""
    from optkit.core import preprocessor
    from optkit.measure.image_processor import FILE, from_folder

    folder = preprocessor.resolve(model)
    if folder is None or not (folder / FILE).is_file():
        return {}
    return {"preprocess": from_folder(folder).model_dump(mode="json", exclude_defaults=True)}


def register(app: typer.Typer) -> None:
    app.command("preprocess")(preprocess_cmd)
