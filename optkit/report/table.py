"""The figures every renderer shows, as rows of formatted cells (one row per stage)."""
from __future__ import annotations

from optkit.report.figures import Figures
from optkit.report.schema import Report, Stage

# Every renderer's stage columns; the accuracy column is named after the metric (see columns()).
COLUMNS = ("stage", "format", "size", "size x", "params", "p50 ms", "p90 ms", "speedup", "accuracy", "cosine",
           "top-1 agree", "max |diff|")
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
    metrics = {Figures(s).metric for s in report.stages} - {None}
    return metrics.pop() if len(metrics) == 1 else "accuracy"


def columns(report: Report, console: bool = False) -> list[str]:
    label = accuracy_label(report)
    return [label if c == "accuracy" else c for c in (CONSOLE_COLUMNS if console else COLUMNS)]


def accuracy_cell(stage: Stage, label: str | None = None) -> str:
    """The accuracy figure; named ("top1 0.97") unless the column header already names the metric."""
    figures = Figures(stage)
    acc = figures.group("accuracy")
    metric = figures.metric
    if isinstance(metric, str) and metric in acc:
        v = acc[metric]
        cell = f"{v:.4f}" if isinstance(v, (int, float)) else "nan"  # null: a non-finite figure
        return cell if metric == label else f"{metric} {cell}"
    values = [f"{k} {v:.4f}" for k, v in acc.items() if isinstance(v, float)]
    return ", ".join(values) or "-"


def stage_rows(report: Report) -> list[dict[str, str]]:
    rows = []
    first = report.stages[0] if report.stages else None
    label = accuracy_label(report)
    for stage in report.stages:
        figures, base = Figures(stage), Figures(first)
        size, p50, base_size, base_p50 = figures.size_bytes, figures.p50_ms, base.size_bytes, base.p50_ms
        p90 = figures.latency("p90_ms")
        fid = figures.group("fidelity")
        params = figures.parameters
        agree = figures.fidelity("top1_agreement")
        rows.append({
            "stage": stage.name + (" (cached)" if stage.cached else ""),
            "format": stage.output.format,
            "size": human_bytes(size),
            "size x": f"{size / base_size:.2f}" if size and base_size else "-",
            "params": f"{params:,.0f}" if params is not None else "-",
            "p50 ms": f"{p50:.3f}" if p50 is not None else "-",
            "p90 ms": f"{p90:.3f}" if p90 is not None else "-",
            "speedup": _speedup(stage, p50, base_p50),
            label: accuracy_cell(stage, label),
            "cosine": _num(fid, "cosine", ".5f"),
            "top-1 agree": f"{agree:.4f}" if agree is not None else "-",
            "agree": f"{agree:.3f}" if agree is not None else "-",
            "max |diff|": _num(fid, "max_abs_error", ".3g"),
        })
    return rows


def _speedup(stage: Stage, p50: float | None, base_p50: float | None) -> str:
    """first stage's p50 / this one's; "same" when a paired measurement found no significant change."""
    change = Figures(stage).latency_change
    if change and "ratio" in change:
        return f"{1 / change['ratio']:.2f}x" if change.get("significant") else "same"
    return f"{base_p50 / p50:.2f}x" if p50 and base_p50 else "-"


def _num(figures: dict, key: str, spec: str) -> str:
    """A figure as text: '-' when absent; 'inf' when the JSON report stored a non-finite value as null."""
    if key not in figures:
        return "-"
    v = figures[key]
    return format(v, spec) if isinstance(v, (int, float)) else "inf"


def gate_rows(report: Report) -> list[dict[str, str]]:
    return [{
        "gate": g.gate,
        "value": "-" if g.value is None else f"{g.value:.4g}",
        "threshold": f"{g.op} {g.threshold:.4g}",
        "margin": "-" if g.margin is None else f"{g.margin:+.4g}",
        "verdict": "pass" if g.passed else "FAIL",
        "detail": g.detail,
    } for g in report.gates]
