"""optkit simplify MODEL -o OUT"""
from __future__ import annotations

import typer

from optkit.cli import common, flags, options
from optkit.core.errors import UsageError


@flags.pass_options("simplify.onnx")
@flags.groups("data", "measure", "output", "print_recipe")
def simplify_cmd(
    model: str = typer.Argument(..., help="ONNX model."),
    output: str = options.output_file("Where to write the simplified model."),
    *, config: dict, shared: options.Shared,
) -> None:
    """onnxslim + onnxruntime offline optimizations, checked for equal outputs and bounded growth."""
    from optkit.measure.model import DataSpec

    common.guard_outputs({"-o": output, "--report": shared.report}, common.inputs_of(shared, {"MODEL": model}))
    engine = config.get("engine", flags.default("simplify.onnx", "engine"))
    if engine not in ("onnxslim", "onnxsim"):
        raise UsageError(f"unknown --engine {engine!r}; choose onnxslim or onnxsim")
    common.run_single_stage("simplify.onnx", model, output, config, command=f"optkit simplify {model}",
                            settings=shared.settings(),
                            eval_data=DataSpec(path=shared.data, max_samples=256) if shared.data else None,
                            report_path=shared.report, as_json=shared.as_json, print_recipe=shared.print_recipe)


def register(app: typer.Typer) -> None:
    app.command("simplify")(simplify_cmd)
