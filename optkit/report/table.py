"""The figures every renderer shows, as rows of formatted cells (one row per stage)."""
from __future__ import annotations

from optkit.report.figures import StageFigures, finite
from optkit.report.schema import Report, Stage

# Every renderer's stage columns; the accuracy column is named after the metric (see columns()).
COLUMNS = ("stage", "format", "size", "size x", "params", "p50 ms", "p90 ms", "speedup", "samples/s", "memory MB",
           "accuracy", "cosine", "top-1 agree", "max |diff|")
CONSOLE_COLUMNS = ("stage", "format", "size", "size x", "p50 ms", "speedup", "accuracy", "cosine", "agree")


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 100 else f"{n:.1f} {unit}"
        n /= 1000
    return "-"


def accuracy_label(report: Report) -> str:
    """The accuracy column's header: the metric's name when every stage used the same one."""
    metrics = {StageFigures.of(s).metric for s in report.stages} - {None}
    return metrics.pop() if len(metrics) == 1 else "accuracy"


def columns(report: Report, console: bool = False) -> list[str]:
    """The columns with a figure in some stage (stage and format always)."""
    label = accuracy_label(report)
    rows = stage_rows(report)
    named = [label if c == "accuracy" else c for c in (CONSOLE_COLUMNS if console else COLUMNS)]
    return [c for c in named if c in ("stage", "format") or any(r[c] != "-" for r in rows)]


def accuracy_cell(stage: Stage, label: str | None = None) -> str:
    """The accuracy figure; named ("top1 0.97") unless the column header already names the metric."""
    f = StageFigures.of(stage)
    if f.accuracy is not None:
        cell = f"{f.accuracy:.4f}"  # nan: a non-finite figure (recorded as null)
        return cell if f.metric == label else f"{f.metric} {cell}"
    return ", ".join(f"{k} {v:.4f}" for k, v in f.scores.items()) or "-"


def stage_rows(report: Report) -> list[dict[str, str]]:
    rows = []
    base = StageFigures.of(report.stages[0] if report.stages else None)
    base_size, base_p50 = finite(base.size_bytes), finite(base.p50_ms)
    label = accuracy_label(report)
    for stage in report.stages:
        f = StageFigures.of(stage)
        size, p50, p90 = finite(f.size_bytes), finite(f.p50_ms), finite(f.p90_ms)
        params, agree = finite(f.parameters), finite(f.top1_agreement)
        throughput, mem = finite(f.throughput), finite(f.memory_mb)
        rows.append({
            "stage": stage.name + (" (cached)" if stage.cached else ""),
            "format": stage.output.format,
            "size": human_bytes(size),
            "size x": f"{size / base_size:.2f}" if size and base_size else "-",
            "params": f"{params:,.0f}" if params is not None else "-",
            "p50 ms": "-" if p50 is None else f"{p50:.3f}" + _band(f.ci95_pct),
            "p90 ms": f"{p90:.3f}" if p90 is not None else "-",
            "speedup": _speedup(f, p50, base_p50) if f.batch == base.batch else "-",  # calls of other sizes
            "samples/s": "-" if throughput is None else f"{throughput:,.1f}" + (f" @{f.concurrency}" if
                                                                              f.concurrency else ""),
            "memory MB": "-" if mem is None else f"{mem:.1f}",
            label: accuracy_cell(stage, label),
            "cosine": "-" if f.cosine is None else f"{f.cosine:.5f}",
            "top-1 agree": f"{agree:.4f}" if agree is not None else "-",
            "agree": f"{agree:.3f}" if agree is not None else "-",
            "max |diff|": "-" if f.max_abs_error is None else f"{f.max_abs_error:.3g}",  # inf: outputs with NaN/Inf
        })
    return rows


def _band(pct: float | None) -> str:
    """An absolute figure's 95% noise band, beside it: measured apart, two stages' p50s differ by this much
    and more (the speedup column compares them call by call)."""
    return f" ±{pct:.0f}%" if pct is not None and pct == pct and pct > 0 else ""


def _speedup(f: StageFigures, p50: float | None, base_p50: float | None) -> str:
    """first stage's p50 / this one's; "same" when a paired measurement found no significant change."""
    ratio = finite(f.latency_change.ratio) if f.latency_change else None
    if ratio:
        return f"{1 / ratio:.2f}x" if f.latency_change.significant else "same"
    return f"{base_p50 / p50:.2f}x" if p50 and base_p50 else "-"


def failed_gate(g) -> str:
    """A failed gate in an error line: the gate and its verdict; one that cannot be judged says why."""
    if g.verdict == "cannot judge":
        return f"{g.gate} ({'; '.join(g.detail.split('; ')[:2])})"   # the verdict, its noise and margin, advice
    return f"{g.gate} ({g.verdict})"


def gate_rows(report: Report) -> list[dict[str, str]]:
    return [{
        "gate": g.gate,
        "value": "-" if g.value is None else f"{g.value:.4g}",
        "threshold": f"{g.op} {g.threshold:.4g}",
        "margin": "-" if g.margin is None else f"{g.margin:+.4g}",
        "verdict": "FAIL" if g.verdict == "fail" else g.verdict,
        "detail": g.detail,
    } for g in report.gates]
