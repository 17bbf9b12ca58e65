"""The capacity plan shown: a console summary (the three strategies side by side) and a self-contained HTML page
(inline SVG, no script, no network, fits 1280 px): traffic with the capacity the ready replicas serve, and the
replicas of each strategy over the replayed minutes, the minutes over the SLO marked."""
from __future__ import annotations

from html import escape

import numpy as np

from optkit.capacity.plan import Plan
from optkit.core.text import printable
from optkit.report.html import CSS, capacity_section
from optkit.report.schema import MAX_POINTS, CapacitySection

COLUMNS = (("fixed", "fixed for the peak"), ("reactive", "reactive HPA"), ("forecast", "HPA + forecast schedule"))


def to_console(d: dict, console) -> None:
    """The plan as CAPACITY.json holds it (its document: what the capacity stage hands over), on the console."""
    from rich.table import Table

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


def _bucket(x: np.ndarray, k: int, how=np.max) -> list[float]:
    n = len(x) // k * k
    out = how(np.asarray(x[:n], float).reshape(-1, k), axis=1) if n else np.zeros(0)
    if len(x) > n:
        out = np.append(out, how(np.asarray(x[n:], float)))
    return [round(float(v), 4) for v in out]


def _runs(mask: np.ndarray, k: int) -> list[list[int]]:
    n = len(mask) // k * k
    b = mask[:n].reshape(-1, k).any(axis=1) if n else np.zeros(0, bool)
    if len(mask) > n:
        b = np.append(b, mask[n:].any())
    edges = np.diff(np.concatenate(([0], b.astype(np.int8), [0])))
    return [[int(a), int(c)] for a, c in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1))]


def section(plan: Plan, output: str = "", html: str | None = None) -> CapacitySection:
    """The plan as the report carries it: figures, and series bucketed to at most MAX_POINTS points."""
    d = plan.to_contract()
    load = plan.traffic.rates[plan.begin:]
    k = max(1, -(-len(load) // MAX_POINTS))
    auto = plan.autoscaled
    strategies = {}
    for name, _ in COLUMNS:
        st = plan.strategies.get(name)
        strategies[name] = None if st is None else {
            **st.summary(), "replicas": _bucket(st.replay.replicas, k), "over": _runs(st.replay.over, k)}
    return CapacitySection(
        output=output, html=html, chosen=plan.chosen, throughput_per_s=plan.per.throughput_per_s,
        throughput_source=plan.per.throughput_source, minutes=len(load), start=d["replay"]["from"], bucket_min=k,
        traffic=_bucket(load, k), capacity=_bucket(auto.replay.ready * plan.per.throughput_per_s, k, np.min),
        needed=_bucket(plan.needed[plan.begin:], k),
        forecast=_bucket(plan.forecast.predicted, k) if plan.forecast is not None else None,
        strategies=strategies, notes=list(d["replay"]["repairs"]) + list(d["notes"]))


def to_html(plan: Plan) -> str:
    """The stand-alone page (`optkit capacity --html`): the report's capacity section, the schedule and the
    notes; a recipe's run report shows the same section."""
    d = plan.to_contract()
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>optkit capacity</title><style>{CSS}</style>"
             "</head><body><h1>optkit capacity</h1>",
             f"<p class='meta'>{_text(d['per_replica']['source'])}</p>",
             capacity_section(section(plan), link=False)]
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
