"""A self-contained HTML report: no CDN, no script, no network; plots are inline SVG. Every text from the
report (model, stage, gate and note text, machine and version strings) goes through _text: control characters
shown as escapes (`\x1b`, as the console and Markdown show them) and HTML escaped."""
from __future__ import annotations

import math
from html import escape

from optkit.core.text import printable
from optkit.report.figures import StageFigures, finite
from optkit.report.schema import CapacitySection, Report, Stage
from optkit.report.table import columns, gate_rows, legend, shown_latency, stage_rows

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1100px;color:#222;
padding:0 16px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#666;font-size:13px}
table{border-collapse:collapse;font-size:13px;width:100%}
th,td{padding:5px 6px;border-bottom:1px solid #e5e5e5;text-align:right;white-space:nowrap}
th{background:#f5f6f8;font-weight:600;white-space:normal} td.l,th.l{text-align:left}
td.l{white-space:normal;overflow-wrap:anywhere} .sub{display:block;color:#777;font-size:11px}
.legend{color:#666;font-size:12px;margin:4px 0}
.pass{color:#1a7f37;font-weight:600} .fail{color:#cf222e;font-weight:700}
.banner{padding:10px 14px;border-radius:6px;margin:14px 0;font-weight:600}
.banner.ok{background:#dafbe1;color:#1a7f37} .banner.bad{background:#ffebe9;color:#cf222e}
.plots{display:flex;flex-wrap:wrap;gap:18px} .plot{border:1px solid #e5e5e5;border-radius:6px;padding:8px}
.plot h3{font-size:13px;margin:0 0 4px;color:#444}
ul.notes{font-size:13px;color:#444} .warn{color:#9a6700}
svg text{font-family:inherit}
"""


def _text(value) -> str:
    """Text from a report, fit for HTML: printable (no control byte, no bidi override) and escaped."""
    return escape(printable(str(value)))


def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    if hi <= lo:
        hi = lo + 1
    step = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(step))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= step), default=step)
    start = math.floor(lo / step) * step
    out, v = [], start
    while not out or out[-1] < hi - step * 1e-6:   # the last tick is at or above the highest value
        out.append(round(v, 10))
        v += step
    return out


def bar_chart(title: str, labels: list[str], values: list, unit: str, errors: list | None = None,
              width: int = 340, height: int = 220, limit: float | None = None) -> str:
    """Vertical bars, one per stage; missing values are shown as 'n/a'. `limit` caps the axis (e.g. 1 for a rate)."""
    left, right, top, bottom = 48, 10, 10, 46
    pw, ph = width - left - right, height - top - bottom
    values = [finite(v) for v in values]  # NaN or Inf (a hand-made report) has no bar: shown as n/a
    errors = [finite(e) for e in errors] if errors else None
    present = [v for v in values if v is not None]
    hi = max([v + (e or 0) for v, e in zip(values, errors or [0] * len(values)) if v is not None] or [1])
    ticks = _ticks(0, min(hi * 1.1, limit) if limit is not None and hi <= limit else hi * 1.1)
    top_v = ticks[-1] or 1
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{_text(title)}">']
    for t in ticks:
        y = top + ph - ph * t / top_v
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end" fill="#666">{t:g}</text>')
    n = max(len(values), 1)
    slot = pw / n
    bw = min(46, slot * 0.6)
    for i, (lab, v) in enumerate(zip(labels, values)):
        x = left + slot * i + (slot - bw) / 2
        cx = x + bw / 2
        if v is None:
            parts.append(f'<text x="{cx:.1f}" y="{top + ph - 4}" font-size="10" text-anchor="middle" fill="#999">n/a</text>')
        else:
            h = ph * v / top_v
            color = PALETTE[i % len(PALETTE)]
            parts.append(f'<rect x="{x:.1f}" y="{top + ph - h:.1f}" width="{bw:.1f}" height="{h:.1f}" fill="{color}">'
                         f'<title>{_text(lab)}: {v:.4g} {_text(unit)}</title></rect>')
            e = (errors or [None] * n)[i]
            if e:
                y1, y2 = top + ph - ph * (v + e) / top_v, top + ph - ph * max(v - e, 0) / top_v
                parts.append(f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{y1:.1f}" y2="{y2:.1f}" stroke="#222"/>')
                for yy in (y1, y2):
                    parts.append(f'<line x1="{cx - 4:.1f}" x2="{cx + 4:.1f}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#222"/>')
            parts.append(f'<text x="{cx:.1f}" y="{top + ph - h - 3:.1f}" font-size="10" text-anchor="middle">{v:.3g}</text>')
        short = lab if len(lab) <= 14 else lab[:13] + "…"
        parts.append(f'<text x="{cx:.1f}" y="{top + ph + 14}" font-size="10" text-anchor="middle">{_text(short)}</text>')
    parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" stroke="#999"/>')
    parts.append(f'<text x="{left + pw / 2}" y="{height - 8}" font-size="11" text-anchor="middle" fill="#444">'
                 f'{_text(unit)}</text>')
    parts.append("</svg>")
    if not present:
        return ""
    return f'<div class="plot"><h3>{_text(title)}</h3>{"".join(parts)}</div>'


def _grid(xt: list[float], yt: list[float], sx, sy, left: float, top: float, pw: float, ph: float) -> list[str]:
    """A plot's grid lines and tick labels at the ticks, and its frame."""
    out = []
    for t in xt:
        out.append(f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{top}" y2="{top + ph}" stroke="#eee"/>')
        out.append(f'<text x="{sx(t):.1f}" y="{top + ph + 14}" font-size="10" text-anchor="middle" fill="#666">{t:g}</text>')
    for t in yt:
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" font-size="10" text-anchor="end" fill="#666">{t:g}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    return out


def _labels(x: str, y: str, left: float, top: float, pw: float, ph: float, height: float) -> list[str]:
    """A plot's axis titles."""
    return [f'<text x="{left + pw / 2}" y="{height - 6}" font-size="11" text-anchor="middle" fill="#444">'
            f'{_text(x)}</text>',
            f'<text transform="translate(14 {top + ph / 2}) rotate(-90)" font-size="11" text-anchor="middle" '
            f'fill="#444">{_text(y)}</text>']


LABEL_PX = 11          # a plot label's font size; its box is estimated at CHAR_PX per character
CHAR_PX = 6.8


def place_labels(points: list[tuple[float, float, float, str]], box: tuple[float, float, float, float]
                 ) -> list[tuple[float, float, str, bool]]:
    """Where each marker's label goes, so that no two overlap: (x, y of the baseline, text-anchor, leader line)
    per point (x, y, radius, text), inside `box` (left, top, right, bottom) where there is room. Each label
    takes the first free slot beside its marker, right then left, at its height then one line further up or
    down at a time; one moved off its marker's height gets a leader line."""
    left, top, right, bottom = box
    taken: list[tuple[float, float, float, float]] = []
    out = []
    for x, y, r, text in points:
        w, h = len(text) * CHAR_PX + 2, LABEL_PX + 3
        slots = [(side, dy) for k in range(int((bottom - top) // h) + 1) for dy in ((0,) if k == 0 else (-k * h, k * h))
                 for side in (1, -1)]
        choice = None
        for side, dy in slots:
            lx = x + side * (r + 4)
            x0, x1 = (lx, lx + w) if side > 0 else (lx - w, lx)
            y0 = y + dy - h / 2
            rect = (x0, y0, x1, y0 + h)
            inside = left <= x0 and x1 <= right and top <= y0 and y0 + h <= bottom
            if inside and not any(rect[0] < t[2] and t[0] < rect[2] and rect[1] < t[3] and t[1] < rect[3]
                                  for t in taken):
                choice = (side, dy, rect)
                break
        if choice is None:  # no room left in the plot: below the lowest label, clear of every other one
            lx = x + r + 4
            y0 = max([t[3] for t in taken] + [y - h / 2])
            choice = (1, y0 + h / 2 - y, (lx, y0, lx + w, y0 + h))
        side, dy, rect = choice
        taken.append(rect)
        out.append((x + side * (r + 4), y + dy + LABEL_PX * 0.35, "start" if side > 0 else "end", dy != 0))
    return out


def scatter(stages: list[Stage], p50s: list[float | None] | None = None, width: int = 520, height: int = 300) -> str:
    """Accuracy vs p50 latency (`p50s`: the figures the tables show, table.shown_latency; default each stage's
    own); the marker's area follows the model size. Labels are placed so that none overlaps another."""
    pts = []
    for i, s in enumerate(stages):
        f = StageFigures.of(s)
        p50 = finite(f.p50_ms) if p50s is None else p50s[i]
        pts.append((s.name, p50, finite(f.accuracy), finite(f.size_mb), i))
    pts = [p for p in pts if p[1] is not None and p[2] is not None]
    if not pts:
        return ""
    left, right, top, bottom = 56, 20, 14, 44
    pw, ph = width - left - right, height - top - bottom
    xs, ys = [p[1] for p in pts], [p[2] for p in pts]
    xt = _ticks(0, max(xs) * 1.15)
    ylo, yhi = min(ys), max(ys)
    pad = max((yhi - ylo) * 0.3, 0.01)
    yt = _ticks(max(ylo - pad, 0), min(yhi + pad, 1.0 if yhi <= 1 else yhi + pad))
    x0, x1, y0, y1 = xt[0], xt[-1] or 1, yt[0], yt[-1]
    if y1 == y0:
        y1 = y0 + 1
    sx = lambda v: left + pw * (v - x0) / (x1 - x0)  # noqa: E731
    sy = lambda v: top + ph - ph * (v - y0) / (y1 - y0)  # noqa: E731
    smax = max((p[3] or 0) for p in pts) or 1
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           f'aria-label="accuracy vs latency">']
    out += _grid(xt, yt, sx, sy, left, top, pw, ph)
    marks = [(sx(x), sy(y), 5 + 17 * ((size or 0) / smax) ** 0.5) for _, x, y, size, _ in pts]
    for (name, x, y, size, i), (cx, cy, r) in zip(pts, marks):
        color = PALETTE[i % len(PALETTE)]
        out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{r:.1f}" fill="{color}" fill-opacity="0.55" '
                   f'stroke="{color}"><title>{_text(name)}: {x:.4g} ms, {y:.4f}, '
                   f'{(size or 0):.3g} MB</title></circle>')
    placed = place_labels([(cx, cy, r, printable(p[0])) for p, (cx, cy, r) in zip(pts, marks)],
                          (left, top, left + pw, top + ph))
    for p, (cx, cy, r), (lx, ly, anchor, leader) in zip(pts, marks, placed):
        if leader:
            out.append(f'<line x1="{cx:.1f}" y1="{cy:.1f}" x2="{lx:.1f}" y2="{ly - LABEL_PX * 0.35:.1f}" '
                       'stroke="#999" stroke-width="0.8"/>')
        out.append(f'<text class="point-label" x="{lx:.1f}" y="{ly:.1f}" font-size="{LABEL_PX}" '
                   f'text-anchor="{anchor}">{_text(p[0])}</text>')
    out += _labels("p50 latency (ms)", "accuracy", left, top, pw, ph, height)
    out.append("</svg>")
    return ('<div class="plot"><h3>Accuracy vs latency (marker area: size)</h3>' + "".join(out) + "</div>")


def pareto(stage: Stage, width: int = 520, height: int = 320) -> str:
    """A tune stage's trials: throughput against p50 latency; the Pareto front (no trial is both faster and
    higher in throughput) joined by a line, settings that miss the SLO hollow, the chosen one ringed."""
    f = StageFigures.of(stage)
    pts = [(finite(t.p50_ms), finite(t.throughput_per_s), t.feasible, t.pareto, t.number, t.label)
           for t in f.tune_trials]
    pts = [p for p in pts if p[0] is not None and p[1] is not None]
    if not pts:
        return ""
    best = f.tune_best
    left, right, top, bottom = 64, 20, 14, 44
    pw, ph = width - left - right, height - top - bottom
    xt, yt = _ticks(0, max(p[0] for p in pts) * 1.1), _ticks(0, max(p[1] for p in pts) * 1.1)
    x1, y1 = xt[-1] or 1, yt[-1] or 1
    sx = lambda v: left + pw * v / x1  # noqa: E731
    sy = lambda v: top + ph - ph * v / y1  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           f'aria-label="throughput vs latency of the tune trials">']
    out += _grid(xt, yt, sx, sy, left, top, pw, ph)
    front = sorted((p for p in pts if p[3]), key=lambda p: p[0])
    if len(front) > 1:
        path = " ".join(f"{sx(p[0]):.1f},{sy(p[1]):.1f}" for p in front)
        out.append(f'<polyline points="{path}" fill="none" stroke="{PALETTE[1]}" stroke-width="1.5"/>')
    for x, y, ok, on_front, number, label in pts:
        color = PALETTE[1] if on_front else (PALETTE[0] if ok else PALETTE[3])
        fill = color if ok else "none"
        out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{fill}" fill-opacity="0.7" '
                   f'stroke="{color}"><title>trial {number}: {_text(label)}; p50 {x:.4g} ms, {y:,.1f} samples/s'
                   f'{"" if ok else " (misses the SLO)"}</title></circle>')
        if number == best:
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="9" fill="none" stroke="#222" '
                       f'stroke-width="1.5"/>')
    out += _labels("p50 latency per request (ms)", "throughput (samples/s)", left, top, pw, ph, height)
    out.append("</svg>")
    return (f'<div class="plot"><h3>{_text(stage.name)}: throughput vs latency per trial (line: Pareto front; '
            f'ringed: chosen; hollow: misses the SLO)</h3>' + "".join(out) + "</div>")


CAPACITY_COLUMNS = (("fixed", "fixed for the peak"), ("reactive", "reactive HPA"),
                    ("forecast", "HPA + forecast schedule"))
OVER = "#e15759"


def line_chart(title: str, series: list[tuple[str, list, str]], lanes: list[tuple[str, list, str]], unit: str,
               x_label: str, width: int = 1040, height: int = 260) -> str:
    """Lines over one x axis (points 0..n-1) and, under the plot, one lane per (label, [[a, b), ...], color):
    the spans (in points) shaded, e.g. the minutes each strategy is over its SLO."""
    left, right, top = 60, 12, 26
    lane_h = 14
    ph = height - top - 36
    total = height + lane_h * len(lanes)
    pw = width - left - right
    n = max((len(s[1]) for s in series), default=1)
    hi = max((max(v for v in s[1] if v is not None) for s in series if any(v is not None for v in s[1])),
             default=1.0) or 1.0
    yt = _ticks(0.0, hi)
    ymax = yt[-1] or 1.0

    def sx(i):
        return left + pw * i / max(1, n - 1)

    def sy(v):
        return top + ph * (1 - v / ymax)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total}" role="img" '
           f'aria-label="{_text(title)}" style="max-width:100%;height:auto">']
    for v in yt:
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(v):.1f}" y2="{sy(v):.1f}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{sy(v) + 4:.1f}" font-size="11" text-anchor="end">{v:g}</text>')
    for k, (label, y, color) in enumerate(series):
        pts = " ".join(f"{sx(i):.1f},{sy(float(v)):.1f}" for i, v in enumerate(y) if v is not None)
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.3" points="{pts}"/>')
        out.append(f'<rect x="{left + 10 + 240 * k}" y="6" width="12" height="3" fill="{color}"/>'
                   f'<text x="{left + 26 + 240 * k}" y="11" font-size="11">{_text(label)}</text>')
    base = top + ph + 4
    for j, (label, runs, color) in enumerate(lanes):
        y0 = base + j * lane_h
        out.append(f'<rect x="{left}" y="{y0}" width="{pw}" height="{lane_h - 3}" fill="#f5f6f8"/>'
                   f'<text x="{left - 6}" y="{y0 + 9}" font-size="9" text-anchor="end">{_text(label)}</text>')
        for a, b in runs:
            out.append(f'<rect x="{sx(a):.1f}" y="{y0}" width="{max(1.5, sx(b) - sx(a)):.1f}" height="{lane_h - 3}" '
                       f'fill="{color}" fill-opacity="0.75"><title>{_text(label)}: over the SLO</title></rect>')
    out.append(f'<text x="{left + pw / 2}" y="{total - 6}" font-size="11" text-anchor="middle">'
               f'{_text(x_label)}</text>')
    out.append(f'<text x="12" y="{top + ph / 2}" font-size="11" text-anchor="middle" '
               f'transform="rotate(-90 12 {top + ph / 2})">{_text(unit)}</text>')
    out.append("</svg>")
    return "".join(out)


def capacity_section(cap: CapacitySection, *, link: bool = True) -> str:
    """A recipe's capacity as a section of the report (and the whole of `optkit capacity --html`): the three
    strategies side by side, traffic and capacity over time, the replicas of every strategy, and under each chart
    a lane per strategy with its minutes over the SLO shaded."""
    h = ["<h2>Capacity</h2>",
         f'<p class="meta">per replica {cap.throughput_per_s:,.1f} requests/s: {_text(cap.throughput_source)}<br>'
         f"{cap.minutes:,} minutes replayed" + (f" from {_text(cap.start)} UTC" if cap.start else "")
         + (f"; each point the highest of {cap.bucket_min} minutes" if cap.bucket_min > 1 else "")
         + (f"; CAPACITY.json: {_text(cap.output)}" if cap.output and link else "")
         + (f' &middot; <a href="{_text(cap.html)}">the capacity page</a>' if cap.html and link else "") + "</p>",
         '<table><tr><th class="l"></th>'
         + "".join(f'<th>{_text(label)}{" (written)" if name == cap.chosen else ""}</th>'
                   for name, label in CAPACITY_COLUMNS) + "</tr>"]
    for label, key in (("SLO minutes", "slo_minutes"), ("replica-hours", "replica_hours"),
                       ("peak replicas", "peak_replicas"), ("target utilisation", "target_utilization")):
        cells = []
        for name, _ in CAPACITY_COLUMNS:
            st = cap.strategies.get(name)
            v = None if st is None else getattr(st, key)
            cells.append("n/a" if v is None else f"{v:,}")
        h.append(f'<tr><td class="l">{label}</td>' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    h.append("</table>")
    present = [(name, label, cap.strategies[name], PALETTE[k]) for k, (name, label) in enumerate(CAPACITY_COLUMNS)
               if cap.strategies.get(name) is not None]
    lanes = [(f"{name}: {st.slo_minutes:,} min", st.over, OVER) for name, _, st, _ in present]
    x_label = (f"minutes replayed ({cap.minutes:,}" + (f", {cap.bucket_min} per point" if cap.bucket_min > 1 else "")
               + "); lanes: each strategy's minutes over the SLO")
    series = [("traffic (requests/s)", cap.traffic, PALETTE[0]),
              (f"capacity served, {cap.chosen} (written)", cap.capacity, PALETTE[2])]
    if cap.forecast is not None:
        series.append(("forecast", cap.forecast, PALETTE[1]))
    h.append('<h3>Traffic and capacity</h3><div class="plot">'
             + line_chart("traffic and capacity", series, lanes, "requests/s", x_label) + "</div>")
    rs = [(label, st.replicas, color) for _, label, st, color in present]
    rs.append(("needed (with headroom)", cap.needed, PALETTE[4]))
    h.append('<h3>Replicas over time</h3><div class="plot">'
             + line_chart("replicas", rs, lanes, "replicas", x_label) + "</div>")
    return "\n".join(h)


def to_html(report: Report) -> str:
    stages = report.stages
    names = [s.name for s in stages]
    rows = stage_rows(report)
    h = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
         '<meta name="viewport" content="width=device-width, initial-scale=1">',
         f"<title>optkit: {_text(report.command or 'report')}</title><style>{CSS}</style></head><body>",
         f"<h1>optkit report</h1><div class=\"meta\">{_text(report.command)} &middot; {_text(report.created)}"]
    if report.run:
        h.append(f" &middot; run {_text(str(report.run.get('run_id')))}")
    h.append("</div>")
    if report.gates:
        bad = [g for g in report.gates if not g.passed]
        cls, text = ("bad", f"{len(bad)} of {len(report.gates)} gates failed") if bad else \
            ("ok", f"all {len(report.gates)} gates passed")
        h.append(f'<div class="banner {cls}">{text}</div>')
    # the pass and the stage's time go under its name (a long pass name never widens the table); the p50 cell
    # carries its noise band
    h.append("<h2>Stages</h2><table><tr>")
    left = ("stage", "format")
    cols = columns(report)
    h += [f'<th class="{"l" if c in left else ""}">{_text(c)}</th>' for c in cols]
    h.append("</tr>")
    figures = [StageFigures.of(s) for s in stages]
    for s, row in zip(stages, rows):
        sub = f'<span class="sub">{_text(s.pass_name)}, {s.duration_s:.2f}s</span>' if s.pass_name else ""
        h.append("<tr>" + "".join(f'<td class="{"l" if c in left else ""}">{_text(row[c])}'
                                  f'{sub if c == "stage" else ""}</td>' for c in cols) + "</tr>")
    h.append("</table>")
    if legend(report):
        h.append(f'<p class="legend">{_text(legend(report))}</p>')
    notes = [(s.name, n, False) for s in stages for n in s.notes] + \
            [(s.name, w, True) for s in stages for w in s.warnings]
    if notes:
        h.append('<ul class="notes">' + "".join(
            f'<li class="{"warn" if w else ""}"><b>{_text(n)}</b>: {_text(t)}</li>' for n, t, w in notes) + "</ul>")
    h.append('<h2>Plots</h2><div class="plots">')
    h.append(bar_chart("Size per stage", names, [f.size_mb for f in figures], "MB"))
    base = figures[0] if figures else StageFigures()
    shown = [shown_latency(f, base) for f in figures]
    errs = [v.p50 * f.ci95_pct / 100 if v.p50 is not None and f.ci95_pct and not v.paired else None
            for v, f in zip(shown, figures)]
    h.append(bar_chart("p50 latency per stage (95% CI)", names, [v.p50 for v in shown], "ms", errs))
    metric = next((f.metric for f in figures if f.metric), None)
    h.append(bar_chart(f"Accuracy per stage ({metric})" if metric else "Accuracy per stage", names,
                       [f.accuracy for f in figures], metric or "", limit=1.0))
    h.append(scatter(stages, [v.p50 for v in shown]))
    h += [pareto(s) for s in stages]
    h.append("</div>")
    if report.gates:
        h.append('<h2>Gates</h2><table><tr><th class="l">gate</th><th class="l">stage</th><th>value</th>'
                 '<th>threshold</th><th>margin</th><th class="l">verdict</th><th class="l">detail</th></tr>')
        for g, row in zip(report.gates, gate_rows(report)):
            word = "FAIL" if g.verdict == "fail" else _text(g.verdict)
            v = '<span class="pass">pass</span>' if g.passed else f'<span class="fail">{word}</span>'
            h.append(f'<tr><td class="l">{_text(row["gate"])}</td><td class="l">{_text(g.stage)}</td>'
                     f'<td>{_text(row["value"])}</td><td>{_text(row["threshold"])}</td>'
                     f'<td>{_text(row["margin"])}</td><td class="l">{v}</td>'
                     f'<td class="l">{_text(g.detail)}</td></tr>')
        h.append("</table>")
    if report.capacity is not None:
        h.append(capacity_section(report.capacity))
    m = report.machine
    versions = ", ".join(f"{_text(k)} {_text(v)}" for k, v in report.versions.items())
    h.append(f'<h2>Machine</h2><div class="meta">{_text(str(m.get("processor", "")))}, {_text(m.get("cpu_count"))} cores, '
             f'{_text(str(m.get("system", "")))} {_text(str(m.get("machine", "")))}, Python {_text(str(m.get("python", "")))}'
             f"<br>{versions}</div>")
    h.append("</body></html>\n")
    return "\n".join(x for x in h if x)
