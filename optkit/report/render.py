"""Renderers: the console (rich), Markdown (pull-request comments, $GITHUB_STEP_SUMMARY) and JSON."""
from __future__ import annotations

from optkit.core.text import markdown as md
from optkit.core.text import printable
from optkit.report.figures import StageFigures, finite
from optkit.report.schema import Report
from optkit.report.table import columns, gate_rows, legend, stage_rows


def to_console(report: Report, console=None, *, verbose: bool = False) -> None:
    """The report's tables and, per stage, its brief (what was done, the latency verdict) or with `verbose` every
    note (the reasoning: skipped settings, kernel tables, candidate races, which report.json and report.html keep)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console(markup=False, highlight=False)
    table = Table(title=printable(report.command or "optkit report"), title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True, show_edge=False)
    rows = stage_rows(report)
    # a column with no figure in any row only takes width from the ones that matter
    shown = columns(report, console=True)
    if len(rows) == 1:
        shown = [c for c in shown if c not in ("size x", "speedup")]
    widest_stage = max((len(r["stage"]) for r in rows), default=5)
    for col in shown:
        table.add_column(col, justify="left" if col in ("stage", "format") else "right", no_wrap=col != "stage",
                         min_width=min(widest_stage, 12) if col == "stage" else None)
    for row in rows:
        table.add_row(*(printable(row[c]) for c in shown))
    console.print(table)
    if legend(report):
        console.print(Text(legend(report), "dim"))
    only = StageFigures.of(report.stages[0]) if len(report.stages) == 1 else None
    if only is not None and "latency" in only.measured:
        console.print(_latency_line(only))
    if only is not None and "concurrency" in only.measured:
        console.print(_load_line(only))
    if only is not None and "memory" in only.measured:
        console.print(f"memory: {_cell(only.load_mb, '.1f')} MiB to load, peak {_cell(only.memory_mb, '.1f')} MiB "
                      "above the process's baseline (RSS)")
    for stage in report.stages:
        for note in stage.notes if verbose else (stage.brief or stage.notes[:2]):
            console.print(Text(printable(f"{stage.name}: {note}"), "dim"))
        for warning in stage.warnings:
            console.print(Text("warning", "bold yellow"), printable(f"{stage.name}: {warning}"))
    if report.gates:
        gates = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for col in ("gate", "value", "threshold", "margin", "verdict"):
            gates.add_column(col)
        for row in gate_rows(report):
            style = "green" if row["verdict"] == "pass" else "bold red"
            gates.add_row(printable(row["gate"]), row["value"], row["threshold"], row["margin"],
                          Text(row["verdict"], style))
        console.print(gates)


def _cell(v, spec=".4f") -> str:
    """'-' for a figure a report lacks or a non-finite one."""
    return "-" if finite(v) is None else format(v, spec)


def _load_line(f: StageFigures) -> str:
    over = (f"{f.connections} connection{'s' if f.connections > 1 else ''}" if f.connections else
            f"{f.sessions} session{'s' if (f.sessions or 0) > 1 else ''}")
    lo, hi = f.load_ci95.get("throughput_per_s", (None, None))
    band = (f" (95% band {lo:,.1f}-{hi:,.1f})" if lo is not None and hi is not None else
            f" (95% band from {lo:,.1f}, too noisy to bound above)" if lo is not None else "")
    return (f"under load: {f.concurrency} requests in flight over {over}: "
            f"{_cell(f.load_throughput_per_s, ',.1f')} samples/s{band}, "
            f"p50 {_cell(f.load_p50_ms)} ms, p99 {_cell(f.load_p99_ms)} ms")


def _latency_line(f: StageFigures) -> str:
    """A one-stage report's latency in one line."""
    cell = _cell
    return (f"latency: p50 {cell(f.p50_ms)} ms, p90 {cell(f.p90_ms)}, p99 {cell(f.p99_ms)}, "
            f"mean {cell(f.mean_ms)} ± {cell(f.std_ms)} ms over {cell(f.runs, '')} runs; "
            f"batch {cell(f.batch, '')}, threads {f.threads or 'default'}, "
            f"{cell(f.throughput_per_s, '.1f')} samples/s" + (f"; on {f.runtime}" if f.runtime else ""))


def to_markdown(report: Report) -> str:
    # every text from a model, a file name or a report is escaped (md): a PR comment renders no HTML, link or
    # image from it
    lines = [f"### optkit: {md(report.command or 'report')}", ""]
    cols = columns(report)
    lines.append("| " + " | ".join(md(c) for c in cols) + " |")
    lines.append("|" + "|".join("---" if c in ("stage", "format") else "---:" for c in cols) + "|")
    for row in stage_rows(report):
        lines.append("| " + " | ".join(md(row[c]) for c in cols) + " |")
    if legend(report):
        lines += ["", f"<sub>{md(legend(report))}</sub>"]
    notes = [f"- **{md(s.name)}**: {md(n)}" for s in report.stages for n in s.notes]
    warnings = [f"- :warning: **{md(s.name)}**: {md(w)}" for s in report.stages for w in s.warnings]
    if notes or warnings:
        lines += ["", *warnings, *notes]
    if report.gates:
        failed = sum(not g.passed for g in report.gates)
        verdict = f"**{failed} of {len(report.gates)} gates failed**" if failed else \
            f"all {len(report.gates)} gates passed"
        lines += ["", f"#### Gates: {verdict}", "", "| gate | value | threshold | margin | verdict |",
                  "|---|---:|---:|---:|---|"]
        for row in gate_rows(report):
            mark = ":white_check_mark: pass" if row["verdict"] == "pass" else f":x: {row['verdict']}"
            lines.append(f"| {md(row['gate'])} | {md(row['value'])} | {md(row['threshold'])} | {md(row['margin'])} "
                         f"| {mark} |")
    versions = ", ".join(f"{k} {v}" for k, v in report.versions.items())
    lines += ["", f"<sub>{md(report.machine.get('processor', ''))}, {md(report.machine.get('cpu_count'))} cores; "
              f"{md(versions)}</sub>", ""]
    return "\n".join(lines)


def to_json(report: Report) -> str:
    return report.to_json()
