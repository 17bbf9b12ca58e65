"""optkit report compare A.json B.json; optkit report render REPORT.json --format md|html|junit|console"""
from __future__ import annotations

import importlib
from typing import Optional

import typer

from optkit.cli import common, flags, options
from optkit.core import strictjson
from optkit.core.atomic import write_text
from optkit.core.errors import UsageError

report_app = typer.Typer(help="Render and compare reports.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(report_app, name="report")


@report_app.command("compare")
@flags.groups("json")
def compare_cmd(
    a: str = typer.Argument(..., help="First report.json (A, e.g. the baseline), or a package version folder."),
    b: str = typer.Argument(..., help="Second report.json (B, e.g. this change), or a package version folder."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown instead of a table."),
    *,
    shared: options.Shared,
) -> None:
    """Side-by-side differences of two runs: size, p50 latency (with noise) and accuracy per stage."""
    from optkit.report import compare as cmp
    from optkit.report.schema import Report

    ra, rb = Report.load(_report_file(a)), Report.load(_report_file(b))
    rows = cmp.compare(ra, rb)
    if shared.as_json:
        common.print_json(strictjson.dumps([{"stage": r["stage"], **r["raw"]} for r in rows], indent=2, nulls=True))
    elif markdown:
        common.print_json(cmp.to_markdown(a, b, rows))
    else:
        cmp.to_console(a, b, rows, common.console())


@report_app.command("render")
def render_cmd(
    report: str = typer.Argument(..., help="A report.json."),
    fmt: str = typer.Option("console", "--format", help="console, md, html, junit or json."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout."),
) -> None:
    """Render a report as a table, Markdown, self-contained HTML or JUnit XML."""
    from optkit.report.schema import Report

    renderers = {"md": "optkit.report.render:to_markdown", "markdown": "optkit.report.render:to_markdown",
                 "html": "optkit.report.html:to_html", "junit": "optkit.report.junit:to_junit",
                 "json": "optkit.report.render:to_json"}
    if fmt not in renderers and fmt != "console":
        raise UsageError(f"unknown --format {fmt!r}; choose console, md, html, junit or json")
    common.guard_outputs({"-o": output}, {"REPORT": report})
    rep = Report.load(report)
    if fmt == "console":
        from optkit.report.render import to_console

        to_console(rep, common.console(), verbose=bool(common.STATE.verbose))
        return
    mod, fn = renderers[fmt].split(":")
    text = getattr(importlib.import_module(mod), fn)(rep)
    if output:
        write_text(output, text if text.endswith("\n") else text + "\n")
    else:
        common.print_json(text)


def _report_file(path: str) -> str:
    """A report.json, or the report a package version folder (REPO/NAME/N) carries."""
    from pathlib import Path

    from optkit.package.lineage import REPORT_FILE

    p = Path(path)
    if p.is_dir():
        if not (p / REPORT_FILE).is_file():
            raise UsageError(f"{path} is a folder without {REPORT_FILE}; give a report.json or a package version "
                             "folder (REPO/NAME/N)")
        return str(p / REPORT_FILE)
    return path
