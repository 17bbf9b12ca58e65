"""The capacity plan shown: a console summary (the three strategies side by side) and a self-contained HTML page
(inline SVG, no script, no network, fits 1280 px): traffic with the capacity the ready replicas serve, and the
replicas of each strategy over the replayed minutes, the minutes over the SLO marked."""
from __future__ import annotations

from html import escape

import numpy as np

from optkit.core.text import printable
from optkit.package.capacity.plan import Plan
from optkit.report.html import CSS, PALETTE, _ticks

COLUMNS = (("fixed", "fixed for the peak"), ("reactive", "reactive HPA"), ("forecast", "HPA + forecast schedule"))


def to_console(plan: Plan, console) -> None:
    from rich.table import Table

    d = plan.to_contract()
    per = d["per_replica"]
    console.print(f"per replica: {per['throughput_per_s']:,.1f}/s ({per['throughput_source']})")
    t = Table(title=f"capacity replay: {d['replay']['minutes']:,} minutes"
                    + (f" from {d['replay']['from']} UTC" if d["replay"]["from"] else ""), title_justify="left")
    t.add_column("")
    for _, label in COLUMNS:
        t.add_column(label, justify="right")
    rows = {"SLO minutes": "slo_minutes", "replica-hours": "replica_hours", "peak replicas": "peak_replicas",
            "target utilisation": "target_utilization"}
    for label, key in rows.items():
        cells = []
        for name, _ in COLUMNS:
            s = d["replay"]["strategies"].get(name)
            v = None if s is None else s.get(key)
            cells.append("n/a" if v is None else f"{v:,.2f}" if isinstance(v, float) else f"{v:,}")
        t.add_row(label, *cells)
    console.print(t)
    a, r = d["autoscaling"], d["replicas"]
    console.print(f"replicas min {r['min']}, max {r['max']}, peak {r['peak']} (headroom {d['headroom']:.0%}); "
                  f"autoscaling on {a['metric']} at {a['target_utilization']:.0%} "
                  f"({a['target_rps_per_replica']:,.1f} requests/s per replica), {a['strategy']}; "
                  f"requests {d['resources']['requests']}; {len(d['schedule'])} cron entries")
    for line in d["replay"]["repairs"]:
        console.print(f"repaired: {line}")
    for line in d["notes"]:
        console.print(f"note: {line}")


def _text(v) -> str:
    return escape(printable(str(v)))


def _line_chart(title: str, series: list[tuple[str, np.ndarray, str]], over: np.ndarray | None, unit: str,
                width: int = 1040, height: int = 260) -> str:
    left, right, top, bottom = 60, 12, 26, 36
    pw, ph = width - left - right, height - top - bottom
    n = max(len(s[1]) for s in series)
    hi = max(float(np.max(s[1])) for s in series if len(s[1])) or 1.0
    yt = _ticks(0.0, hi)
    ymax = yt[-1] or 1.0

    def sx(i):
        return left + pw * i / max(1, n - 1)

    def sy(v):
        return top + ph * (1 - v / ymax)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           f'aria-label="{_text(title)}" style="max-width:100%;height:auto">']
    if over is not None and over.any():
        edges = np.diff(np.concatenate(([0], over.astype(np.int8), [0])))
        for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
            out.append(f'<rect x="{sx(a):.1f}" y="{top}" width="{max(1.5, sx(b) - sx(a)):.1f}" height="{ph}" '
                       'fill="#e15759" fill-opacity="0.25"><title>over the SLO</title></rect>')
    for v in yt:
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(v):.1f}" y2="{sy(v):.1f}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{sy(v) + 4:.1f}" font-size="11" text-anchor="end">{v:g}</text>')
    step = max(1, n // 1500)   # at most ~1500 points a line
    for k, (label, y, color) in enumerate(series):
        pts = " ".join(f"{sx(i):.1f},{sy(float(y[i])):.1f}" for i in range(0, len(y), step))
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.3" points="{pts}"/>')
        out.append(f'<rect x="{left + 10 + 230 * k}" y="6" width="12" height="3" fill="{color}"/>'
                   f'<text x="{left + 26 + 230 * k}" y="11" font-size="11">{_text(label)}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 6}" font-size="11" text-anchor="middle">minutes replayed '
               f'({n:,}); shaded: minutes over the SLO</text>')
    out.append(f'<text x="12" y="{top + ph / 2}" font-size="11" text-anchor="middle" '
               f'transform="rotate(-90 12 {top + ph / 2})">{_text(unit)}</text>')
    out.append("</svg>")
    return "".join(out)


def to_html(plan: Plan) -> str:
    d = plan.to_contract()
    thr = plan.per.throughput_per_s
    load = plan.traffic.rates[plan.begin:]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>optkit capacity</title><style>{CSS}</style>"
             "</head><body><h1>Capacity</h1>",
             f"<p class='meta'>{_text(d['per_replica']['source'])}<br>per replica {thr:,.1f} requests/s: "
             f"{_text(d['per_replica']['throughput_source'])}</p>",
             "<h2>Strategies</h2><table><tr><th class='l'></th>"
             + "".join(f"<th>{_text(label)}</th>" for _, label in COLUMNS) + "</tr>"]
    for label, key in (("SLO minutes", "slo_minutes"), ("replica-hours", "replica_hours"),
                       ("peak replicas", "peak_replicas"), ("target utilisation", "target_utilization")):
        cells = []
        for name, _ in COLUMNS:
            s = d["replay"]["strategies"].get(name)
            v = None if s is None else s.get(key)
            cells.append("n/a" if v is None else f"{v:,}")
        parts.append(f"<tr><td class='l'>{label}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    parts.append("</table>")
    auto = plan.autoscaled
    cap = auto.replay.ready * thr
    series = [("traffic (requests/s)", load, PALETTE[0]), (f"capacity served, {auto.name}", cap, PALETTE[2])]
    if plan.forecast is not None:
        series.append(("forecast", plan.forecast.predicted, PALETTE[1]))
    parts.append("<h2>Traffic and capacity</h2><div class='plot'>"
                 + _line_chart("traffic and capacity", series, auto.replay.over, "requests/s") + "</div>")
    rs = [(label, plan.strategies[name].replay.replicas, PALETTE[k])
          for k, (name, label) in enumerate(COLUMNS) if plan.strategies.get(name) is not None]
    rs.append(("needed (with headroom)", plan.needed[plan.begin:], PALETTE[4]))
    parts.append("<h2>Replicas over time</h2><div class='plot'>"
                 + _line_chart("replicas", rs, auto.replay.over, "replicas") + "</div>")
    if d["schedule"]:
        parts.append("<h2>Schedule (KEDA cron)</h2><table><tr><th class='l'>start</th><th class='l'>end</th>"
                     "<th>desired replicas</th><th class='l'>timezone</th></tr>")
        parts.extend(f"<tr><td class='l'>{_text(e['start'])}</td><td class='l'>{_text(e['end'])}</td>"
                     f"<td>{e['desired_replicas']}</td><td class='l'>{_text(e['timezone'])}</td></tr>"
                     for e in d["schedule"])
        parts.append("</table>")
    parts.append("<h2>Notes</h2><ul class='notes'>"
                 + "".join(f"<li>{_text(n)}</li>" for n in d["replay"]["repairs"] + d["notes"]) + "</ul>")
    parts.append("</body></html>")
    return "".join(parts)
