"""The figures every renderer shows, as rows of formatted cells (one row per stage)."""
from __future__ import annotations

from optkit.report.schema import Report, Stage

COLUMNS = ("stage", "format", "size", "vs first", "params", "p50 ms", "p90 ms", "speedup", "accuracy", "fidelity")


def _size(stage: Stage) -> float | None:
    return (stage.measurements.get("size") or {}).get("bytes")


def _p50(stage: Stage) -> float | None:
    return (stage.measurements.get("latency") or {}).get("p50_ms")


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return "-"


def accuracy_cell(stage: Stage) -> str:
    acc = stage.measurements.get("accuracy") or {}
    metric = acc.get("metric")
    if metric and metric in acc:
        return f"{metric} {acc[metric]:.4f}"
    values = [f"{k} {v:.4f}" for k, v in acc.items() if isinstance(v, float)]
    return ", ".join(values) or "-"


def fidelity_cell(stage: Stage) -> str:
    fid = stage.measurements.get("fidelity") or {}
    if not fid:
        return "-"
    cell = f"cos {fid['cosine']:.4f}, max|d| {fid['max_abs_error']:.2g}"
    if fid.get("top1_agreement") is not None:
        cell += f", top1 agree {fid['top1_agreement']:.3f}"
    return cell


def stage_rows(report: Report) -> list[dict[str, str]]:
    rows = []
    first = report.stages[0] if report.stages else None
    for stage in report.stages:
        size, p50 = _size(stage), _p50(stage)
        base_size, base_p50 = (_size(first), _p50(first)) if first else (None, None)
        lat = stage.measurements.get("latency") or {}
        params = (stage.measurements.get("size") or {}).get("parameters")
        rows.append({
            "stage": stage.name + (" (cached)" if stage.cached else ""),
            "format": stage.output.format,
            "size": human_bytes(size),
            "vs first": f"{size / base_size:.2f}x" if size and base_size else "-",
            "params": f"{params:,}" if params is not None else "-",
            "p50 ms": f"{p50:.3f}" if p50 is not None else "-",
            "p90 ms": f"{lat['p90_ms']:.3f}" if "p90_ms" in lat else "-",
            "speedup": f"{base_p50 / p50:.2f}x" if p50 and base_p50 else "-",
            "accuracy": accuracy_cell(stage),
            "fidelity": fidelity_cell(stage),
        })
    return rows


def gate_rows(report: Report) -> list[dict[str, str]]:
    return [{
        "gate": g.gate,
        "value": "-" if g.value is None else f"{g.value:.4g}",
        "threshold": f"{g.op} {g.threshold:.4g}",
        "margin": "-" if g.margin is None else f"{g.margin:+.4g}",
        "verdict": "pass" if g.passed else "FAIL",
        "detail": g.detail,
    } for g in report.gates]
