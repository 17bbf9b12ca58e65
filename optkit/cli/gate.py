"""optkit gate REPORT.json [GATE ...] [--baseline BASE.json]"""
from __future__ import annotations

from typing import Optional

import typer

from optkit.cli import common, flags, options
from optkit.core import strictjson
from optkit.core.atomic import write_text
from optkit.core.errors import GateFailed, UsageError


@flags.groups("baseline", "json")
def gate_cmd(
    report: str = typer.Argument(..., help="A report.json (from optkit run, or any command's --report)."),
    gates: Optional[list[str]] = typer.Argument(
        None, help="Gates like 'size_mb <= 5', 'accuracy_drop <= 0.01', 'latency_regression_pct <= 10', "
                   "'latency_p90_ms@quantize <= 3'. Default: the recipe's gates stored in the report."),
    junit: Optional[str] = typer.Option(None, "--junit", help="Also write JUnit XML (one test case per gate)."),
    markdown: Optional[str] = typer.Option(None, "--markdown", help="Also write the Markdown report."),
    output: Optional[str] = typer.Option(None, "--output", help="Write the report with these verdicts."),
    *, shared: options.Shared,
) -> None:
    """Check gates on a report: exit 1 when one fails or cannot be judged (its figure's noise straddles the
    threshold), with a table of every gate, its margin and its verdict (pass, FAIL, cannot judge)."""
    from optkit.pipeline.gates import evaluate, parse_gates
    from optkit.report.schema import Report

    baseline = shared.baseline
    common.guard_outputs({"--junit": junit, "--markdown": markdown, "--output": output},
                         common.inputs_of(shared, {"REPORT": report}))
    rep = Report.load(report)
    specs = list(gates or []) or list((rep.recipe or {}).get("gates") or [])
    if not specs:
        raise UsageError("no gates given and the report's recipe has none; e.g. optkit gate "
                         f"{report} 'size_mb <= 5'")
    parsed = parse_gates(specs)
    base = Report.load(baseline) if baseline else None
    rep.gates = evaluate(rep, parsed, base)
    if output:
        rep.save(output)
    if junit:
        from optkit.report.junit import to_junit

        write_text(junit, to_junit(rep))
    if markdown:
        from optkit.report.render import to_markdown

        write_text(markdown, to_markdown(rep))
    if shared.as_json:
        common.print_json(strictjson.dumps(rep.gates, indent=2, nulls=True))
    else:
        _print_gates(rep)
    bad = [g for g in rep.gates if not g.passed]
    if bad:
        from optkit.report.table import failed_gate

        raise GateFailed(f"{len(bad)} of {len(rep.gates)} gates failed: " + ", ".join(failed_gate(g) for g in bad))


def _print_gates(rep) -> None:
    from rich.table import Table
    from rich.text import Text

    from optkit.report.table import gate_rows

    t = Table(title="gates", title_justify="left")
    for c in ("gate", "stage", "value", "threshold", "margin", "verdict", "detail"):
        t.add_column(c)
    for g, row in zip(rep.gates, gate_rows(rep)):
        word = g.verdict
        style = "green" if g.passed else "bold red" if word == "fail" else "bold yellow"
        t.add_row(row["gate"], g.stage, row["value"], row["threshold"], row["margin"],
                  Text("FAIL" if word == "fail" else word, style), g.detail)
    common.console().print(t)


def register(app: typer.Typer) -> None:
    app.command("gate")(gate_cmd)
