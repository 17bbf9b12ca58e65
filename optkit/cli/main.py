"""The `optkit` command. Thin: each command parses flags, calls the library and renders."""
from __future__ import annotations

import sys

import typer

from optkit.cli import common

app = typer.Typer(
    name="optkit",
    help="Optimize trained models (export to ONNX, simplify, quantize, prune, TensorRT) and measure every step.\n\n"
         "Exit codes: 0 ok, 1 gate failed, 2 bad usage or input, 3 a pass or its validation failed, "
         "4 missing dependency or hardware, 130 interrupted.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors.")) -> None:
    common.STATE.debug = debug


# Command modules in help order; each has register(app). Frameworks are imported inside the commands.
COMMANDS = ("inspect", "bench", "eval", "passes", "convert", "simplify", "quantize", "prune", "qat", "tflite", "trt",
            "run", "gate", "report", "recipe")


def _register() -> None:
    import importlib
    import importlib.util

    for name in COMMANDS:
        if importlib.util.find_spec(f"optkit.cli.{name}") is not None:
            importlib.import_module(f"optkit.cli.{name}").register(app)


_register()


def main() -> None:
    sys.exit(common.run_app(app))


if __name__ == "__main__":
    main()
