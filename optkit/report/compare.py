"""Side-by-side differences of two reports (stages matched by name, else by position)."""
from __future__ import annotations

from typing import Any

from optkit.report.figures import StageFigures, finite
from optkit.report.schema import Report, Stage
from optkit.report.table import accuracy_cell, human_bytes

COLUMNS = ("stage", "size A", "size B", "size Δ", "p50 A", "p50 B", "p50 Δ", "accuracy A", "accuracy B",
           "accuracy Δ")


def pair_stages(a: Report, b: Report) -> list[tuple[str, Stage | None, Stage | None]]:
    names_b = {s.name: s for s in b.stages}
    pairs, used = [], set()
    for i, sa in enumerate(a.stages):
        sb = names_b.get(sa.name)
        if sb is None and i < len(b.stages) and b.stages[i].name not in {s.name for s in a.stages}:
            sb = b.stages[i]
        if sb is not None:
            used.add(sb.name)
        pairs.append((sa.name if sb is None or sb.name == sa.name else f"{sa.name} / {sb.name}", sa, sb))
    for sb in b.stages:
        if sb.name not in used and sb.name not in {s.name for s in a.stages}:
            pairs.append((sb.name, None, sb))
    return pairs


def _pct(a, b) -> str:
    if a is None or b is None or not a:
        return "-"
    return f"{100 * (b / a - 1):+.1f}%"


def compare(a: Report, b: Report) -> list[dict[str, Any]]:
    """One row per stage: the raw figures and formatted cells."""
    rows = []
    for name, sa, sb in pair_stages(a, b):
        fa, fb = StageFigures.of(sa), StageFigures.of(sb)
        size_a, size_b = finite(fa.size_bytes), finite(fb.size_bytes)
        pa, pb = finite(fa.p50_ms), finite(fb.p50_ms)
        aa, ab = finite(fa.accuracy), finite(fb.accuracy)
        noise = ((finite(fa.ci95_pct) or 0) ** 2 + (finite(fb.ci95_pct) or 0) ** 2) ** 0.5
        lat_delta = _pct(pa, pb)
        if pa and pb and noise and abs(100 * (pb / pa - 1)) <= noise:
            lat_delta += " (within noise)"
        rows.append({
            "stage": name,
            "size A": human_bytes(size_a), "size B": human_bytes(size_b), "size Δ": _pct(size_a, size_b),
            "p50 A": "-" if pa is None else f"{pa:.3f}", "p50 B": "-" if pb is None else f"{pb:.3f}",
            "p50 Δ": lat_delta,
            "accuracy A": "-" if sa is None else accuracy_cell(sa),
            "accuracy B": "-" if sb is None else accuracy_cell(sb),
            "accuracy Δ": "-" if aa is None or ab is None else f"{ab - aa:+.4f}",
            "raw": {"size_a": size_a, "size_b": size_b, "p50_a": pa, "p50_b": pb, "accuracy_a": aa,
                    "accuracy_b": ab, "latency_noise_pct": noise or None},
        })
    return rows


def to_console(a_name: str, b_name: str, rows: list[dict], console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    t = Table(title=f"A: {a_name}   B: {b_name}", title_justify="left")
    for c in COLUMNS:
        t.add_column(c, justify="left" if c == "stage" else "right")
    for r in rows:
        t.add_row(*(r[c] for c in COLUMNS))
    console.print(t)


def to_markdown(a_name: str, b_name: str, rows: list[dict]) -> str:
    lines = ["### optkit: compare", "", f"A: `{a_name}`  ", f"B: `{b_name}`", "",
             "| " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * (len(COLUMNS) - 1)]
    for r in rows:
        lines.append("| " + " | ".join(r[c].replace("|", "\\|") for c in COLUMNS) + " |")
    return "\n".join(lines) + "\n"
