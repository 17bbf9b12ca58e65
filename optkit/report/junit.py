"""JUnit XML: one test case per gate, so CI systems show each gate as a test."""
from __future__ import annotations

from optkit.core.text import printable
from optkit.report.schema import Report
from optkit.report.table import gate_rows


def escape(text: str) -> str:
    """Text from a report for an XML element: printable first (a control byte is not allowed in XML 1.0, so one
    in a gate, stage or command made the whole file unreadable to CI; a bidi override hides what it says)."""
    from xml.sax import saxutils  # here: it imports urllib.request, 40 ms of every command's start-up

    return saxutils.escape(printable(text))


def quoteattr(text: str) -> str:
    from xml.sax import saxutils

    return saxutils.quoteattr(printable(text))


def to_junit(report: Report, suite: str = "optkit.pipeline.gates") -> str:
    gates = report.gates
    failures = sum(not g.passed for g in gates)
    name = (report.run or {}).get("run_id") or report.command or "optkit"
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<testsuites name={quoteattr("optkit")} tests="{len(gates)}" failures="{failures}" errors="0">',
           f'  <testsuite name={quoteattr(suite)} tests="{len(gates)}" failures="{failures}" errors="0" '
           f'skipped="0" timestamp={quoteattr(report.created)} hostname={quoteattr("optkit")}>',
           f'    <properties><property name="run" value={quoteattr(str(name))}/>'
           f'<property name="command" value={quoteattr(report.command)}/></properties>']
    for g, row in zip(gates, gate_rows(report)):
        text = (f"{g.gate} at stage {g.stage}: value {row['value']}, threshold {row['threshold']}, "
                f"margin {row['margin']}" + (f" ({g.detail})" if g.detail else ""))
        head = f'    <testcase classname={quoteattr(suite + "." + g.stage)} name={quoteattr(g.gate)} time="0">'
        if g.passed:
            out.append(head + f"<system-out>{escape(text)}</system-out></testcase>")
        else:
            out.append(head + f"<failure message={quoteattr('gate failed: ' + text)} type=\"GateFailed\">"
                       f"{escape(text)}</failure></testcase>")
    out += ["  </testsuite>", "</testsuites>", ""]
    return "\n".join(out)
