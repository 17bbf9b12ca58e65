"""One capacity run, whichever way it is asked for (`optkit capacity`, a recipe's `capacity:` section, the
Python API): per-replica figures and a CapacityConfig -> the plan, CAPACITY.json and the HTML page written
(atomically). The same inputs give the same CAPACITY.json bytes."""
from __future__ import annotations

from dataclasses import dataclass

from optkit.capacity import pictures, plan, traffic
from optkit.capacity.config import CapacityConfig
from optkit.capacity.replica import PerReplica
from optkit.core.atomic import write_text


@dataclass
class Result:
    plan: plan.Plan
    text: str                       # CAPACITY.json as written


def load_traffic(cfg: CapacityConfig) -> traffic.Traffic:
    return traffic.load(cfg.history) if cfg.history else traffic.constant(cfg.peak)


def run(per: PerReplica, cfg: CapacityConfig, tr: traffic.Traffic | None = None) -> Result:
    tr = tr if tr is not None else load_traffic(cfg)
    p = plan.make_plan(per, tr, cfg)
    text = p.to_json()
    page = pictures.to_html(p) if cfg.html else None
    write_text(cfg.output, text + "\n")
    if page is not None:
        write_text(cfg.html, page)
    return Result(plan=p, text=text)
