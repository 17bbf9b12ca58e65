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


def _register() -> None:
    from optkit.cli import bench, eval as eval_cmd, inspect, passes

    for module in (inspect, bench, eval_cmd, passes):
        module.register(app)


_register()


def main() -> None:
    sys.exit(common.run_app(app))


if __name__ == "__main__":
    main()
