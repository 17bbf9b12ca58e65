"""optkit inspect MODEL"""
from __future__ import annotations

import typer

from optkit.cli import common, flags, options
from optkit.cli.package import show
from optkit.core import strictjson
from optkit.core.shapes import format_shape
from optkit.core.text import printable


@flags.groups("weights", "json")
def inspect_cmd(
    model: str = typer.Argument(..., help="Model file, SavedModel folder or file.py:factory; or a package "
                                          "that optkit package made (as optkit package inspect)."),
    *, shared: options.Shared,
) -> None:
    """Format, inputs/outputs with shapes and dtypes, opset, op histogram, parameters, size."""
    from optkit.package.manage import is_package  # here: its schemas import pydantic, which --help must not

    if is_package(model):
        return show(model, shared.as_json)
    from optkit.measure.inspect import inspect_model

    info = inspect_model(common.load_artifact(model, shared.weights))
    if shared.as_json:
        common.print_json(strictjson.dumps(info, indent=2, default=str))
    else:
        _render(info)


def _render(info: dict) -> None:
    from rich.table import Table

    from optkit.report.table import human_bytes

    con = common.console()
    size = info.get("size", {})
    from rich.text import Text

    con.print(Text(printable(info["path"]), "bold"), f" format {info['format']}"
              + (f", opset {info['opset']}" if "opset" in info else "")
              + (f", producer {info['producer']}" if info.get("producer") else ""))
    params = size.get("parameters")
    con.print(f"size {human_bytes(size.get('bytes'))} (gzip {human_bytes(size.get('gzip_bytes'))})"
              + (f", {params:,} parameters" if params is not None else "")
              + (f", sparsity {size['sparsity']:.1%}" if size.get("sparsity") else ""))
    io = Table("", "name", "shape", "dtype", title="inputs and outputs", title_justify="left")
    for kind in ("inputs", "outputs"):
        for t in info.get(kind, []):
            io.add_row(kind[:-1], t["name"], format_shape(t["shape"]), t["dtype"])
    con.print(io)
    if info.get("ops"):
        ops = Table("op", "count", title=f"ops ({info.get('nodes')} nodes)", title_justify="left")
        for op, n in info["ops"].items():
            ops.add_row(op, str(n))
        con.print(ops)


def register(app: typer.Typer) -> None:
    app.command("inspect")(inspect_cmd)
