"""The figures every renderer shows, as rows of formatted cells (one row per stage)."""
from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Shown:
    """A stage's latency figures as every table and plot shows them. A stage timed call by call against the first
    stage (latency_change) shows the first stage's figures times that paired ratio, so its p50, p90, samples/s and
    speedup tell one story; `same`: the paired interval holds 1.0 (±3%), and the cells read "same". Any other
    stage shows its own figures. The stage's own trials stay in the report's JSON (measurements.latency)."""
    p50: float | None = None
    p90: float | None = None
    throughput: float | None = None
    paired: bool = False
    same: bool = False


def shown_latency(f: StageFigures, base: StageFigures) -> Shown:
    change = f.latency_change
    ratio = finite(change.ratio) if change is not None else None
    own = Shown(finite(f.p50_ms), finite(f.p90_ms), finite(f.throughput))
    if not ratio or f.batch != base.batch or finite(base.p50_ms) is None:
        return own
    # a throughput under load (requests in flight) is not one call's: the paired ratio does not scale it
    one_call = f.load_throughput_per_s is None and base.load_throughput_per_s is None
    tput = finite(base.throughput_per_s)
    return Shown(p50=base.p50_ms * ratio, p90=None if finite(base.p90_ms) is None else base.p90_ms * ratio,
                 throughput=(tput / ratio if tput else None) if one_call else own.throughput,
                 paired=True, same=not change.significant)


LEGEND = ("speedup, p50, p90, samples/s: the first stage's figures times the paired ratio (timed call by call); "
          "\"same\": the 95% interval holds 1.0 (±3%)")


def legend(report: Report) -> str | None:
    """The line under a table whose rows show paired figures (shown_latency), else None."""
    base = StageFigures.of(report.stages[0] if report.stages else None)
    return LEGEND if any(shown_latency(StageFigures.of(s), base).paired for s in report.stages[1:]) else None


def stage_rows(report: Report) -> list[dict[str, str]]:
    rows = []
    base = StageFigures.of(report.stages[0] if report.stages else None)
    base_size = finite(base.size_bytes)
    label = accuracy_label(report)
    for stage in report.stages:
        f = StageFigures.of(stage)
        shown = shown_latency(f, base)
        size, params, agree, mem = finite(f.size_bytes), finite(f.parameters), finite(f.top1_agreement), finite(
            f.memory_mb)

        def cell(v: float | None, spec: str, suffix: str = "") -> str:
            return "same" if shown.same else "-" if v is None else format(v, spec) + suffix

        rows.append({
            "stage": stage.name + (" (cached)" if stage.cached else ""),
            "format": stage.output.format,
            "size": human_bytes(size),
            "size x": f"{size / base_size:.2f}" if size and base_size else "-",
            "params": f"{params:,.0f}" if params is not None else "-",
            "p50 ms": cell(shown.p50, ".3f", "" if shown.paired else _band(f.ci95_pct)),
            "p90 ms": cell(shown.p90, ".3f"),
            "speedup": _speedup(f, shown.p50, finite(base.p50_ms)) if f.batch == base.batch else "-",  # other sizes
            "samples/s": cell(shown.throughput, ",.1f", f" @{f.concurrency}" if f.concurrency else ""),
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
    and more (a stage timed against the first one shows its paired figures: shown_latency)."""
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
