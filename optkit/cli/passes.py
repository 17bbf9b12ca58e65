"""optkit passes"""
from __future__ import annotations

import typer

from optkit.cli import common, flags, options
from optkit.core import strictjson


@flags.groups("json")
def passes_cmd(*, shared: options.Shared) -> None:
    """Every registered pass (built-in and plugins, split.onnx and capacity.plan too), what it accepts and produces,
    and whether it can run here."""
    from optkit.passes import all_passes
    from optkit.pipeline.kinds import KINDS

    rows = []
    for name, cls in sorted({**all_passes(), **{kind.name: kind for kind in KINDS}}.items()):
        missing = cls.missing()
        rows.append({"name": name, "accepts": [f.value for f in cls.accepts],
                     "produces": "its input, unchanged" if cls.passes_through else cls.produces.value,
                     "extra": cls.extra, "available": missing is None, "install": missing,
                     "summary": cls.summary, "module": cls.__module__})
    if shared.as_json:
        common.print_json(strictjson.dumps(rows, indent=2))
        return
    if common.STATE.verbose:
        _details(rows)
    else:
        _short(rows)


def _short(rows: list[dict]) -> None:
    """One line a pass, cut to the terminal's width (80 columns included): -v gives the whole table."""
    from rich.table import Table
    from rich.text import Text

    table = Table("pass", "status", "summary (-v: what it takes and makes)", box=None, pad_edge=False)
    for r in rows:
        status = Text("available", "green") if r["available"] else Text("unavailable", "yellow")
        table.add_row(r["name"], status, Text(r["summary"], no_wrap=True, overflow="ellipsis"))
    common.console().print(table)


def _details(rows: list[dict]) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table("pass", "accepts", "produces", "status", "summary")
    for r in rows:
        status = Text("available", "green") if r["available"] else Text(f"unavailable: {r['install']}", "yellow")
        table.add_row(r["name"], ", ".join(r["accepts"]), r["produces"], status, r["summary"])
    common.console().print(table)


def register(app: typer.Typer) -> None:
    app.command("passes")(passes_cmd)
