"""The plan: per-replica figures and a traffic history -> replicas over time (with the headroom), the
autoscaling target searched so that the HPA replay meets the SLO with the fewest replica-hours, the forecast's
schedule, and the three strategies side by side (fixed for the peak, reactive HPA, HPA + forecast schedule).
`to_contract` is CAPACITY.json (optkit/contracts/capacity.py), which `optkit package --capacity` reads; `to_json`
writes it through that contract."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optkit.capacity import forecast as fmod
from optkit.capacity import hpa as hpa_mod
from optkit.capacity.config import CapacityConfig
from optkit.capacity.replica import PerReplica
from optkit.capacity.traffic import Traffic
from optkit.contracts import base
from optkit.contracts import capacity as contract
from optkit.core.errors import UsageError

TARGETS = tuple(round(0.30 + 0.05 * i, 2) for i in range(14))   # 0.30 .. 0.95


@dataclass
class Strategy:
    name: str
    target: float | None
    replay: hpa_mod.Replay
    max_replicas: int
    floor: np.ndarray | None = None

    def summary(self) -> dict:
        return {**self.replay.summary(), "target_utilization": self.target}


@dataclass
class Plan:
    per: PerReplica
    traffic: Traffic
    cfg: CapacityConfig
    needed: np.ndarray
    begin: int                                 # the first minute replayed
    strategies: dict[str, Strategy | None]
    chosen: str
    searched: dict[str, list[dict]]
    forecast: Any = None
    notes: list[str] = field(default_factory=list)
    resources: dict = field(default_factory=dict)
    slo_p99_ms: float | None = None
    fixed_replicas: int = 0

    @property
    def cpu_cores(self) -> float | None:
        return self.cfg.cpu_cores if self.cfg.cpu_cores is not None else self.per.cpu_cores

    @property
    def cpu_source(self) -> str | None:
        if self.cfg.cpu_cores is not None:
            return "stated by the user (--cpu)" + (f"; the figures' own {self.per.cpu_cores:.4g} cores not used"
                                                   if self.per.cpu_cores is not None else "")
        return "measured (CPU s per 1,000 samples x throughput)" if self.per.cpu_cores is not None else None

    @property
    def memory_mb(self) -> float | None:
        return self.cfg.memory_mb if self.cfg.memory_mb is not None else self.per.memory_mb

    @property
    def memory_source(self) -> str | None:
        if self.cfg.memory_mb is not None:
            return "stated by the user (--memory-mb)" + (f"; the measured peak {self.per.memory_mb:.4g} MB not "
                                                         "used" if self.per.memory_mb is not None else "")
        return "measured peak (the model's own memory)" if self.per.memory_mb is not None else None

    @property
    def autoscaled(self) -> Strategy:
        return self.strategies[self.chosen]

    def to_contract(self) -> dict[str, Any]:
        s = self.autoscaled
        metric = "cpu" if self.cpu_cores is not None else "rps"
        per = self.per.to_contract()
        # a figure the user states (--cpu, --memory-mb) is the one used, and said to be the user's
        per["cpu_cores"], per["cpu_source"] = self.cpu_cores, self.cpu_source
        per["memory_mb"], per["memory_source"] = self.memory_mb, self.memory_source
        strategies = {k: (v.summary() if v else None) for k, v in self.strategies.items()}
        fc = self.forecast if self.chosen == "forecast" else None
        return {
            "schema": contract.SCHEMA,
            "model": self.per.model,
            "model_sha256": self.per.model_sha256,
            "slo": {"p99_ms": self.slo_p99_ms},
            "per_replica": per,
            "headroom": self.cfg.headroom,
            "replicas": {"min": self.cfg.min_replicas, "max": s.max_replicas,
                         "peak": int(s.replay.replicas.max()) if len(s.replay.replicas) else self.fixed_replicas,
                         "needed_at_peak": int(self.needed.max()), "fixed_for_peak": self.fixed_replicas},
            "resources": self.resources,
            "autoscaling": {"metric": metric, "target_utilization": s.target,
                            "target_rps_per_replica": round(s.target * self.per.throughput_per_s, 3),
                            "tolerance": self.cfg.tolerance,
                            "scale_down_stabilization_s": self.cfg.down_window_s,
                            "scale_up_stabilization_s": hpa_mod.UP_WINDOW_S,
                            "startup_s": self.cfg.startup_s, "strategy": self.chosen},
            "schedule": list(fc.schedule) if fc is not None else [],
            "replay": {"strategies": strategies, "minutes": int(len(self.traffic.rates) - self.begin),
                       "from": self.traffic.time_of(self.begin) if self.traffic.start else None,
                       "repairs": list(self.traffic.repairs),
                       "forecast": ({"method": self.forecast.method, "error_pct": round(self.forecast.error_pct, 1),
                                     "split_minute": self.forecast.split,
                                     "schedule_entries": len(self.forecast.schedule)}
                                    if self.forecast is not None else None),
                       "search": self.searched},
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        """CAPACITY.json's text (no trailing newline): exit 3 if package would refuse it."""
        return base.text(base.build(contract.CapacityFile, self.to_contract(), "CAPACITY.json")).rstrip("\n")


def _mi(mb: float) -> str:
    return f"{max(1, math.ceil(mb * 1e6 / 2 ** 20))}Mi"


def resources(per: PerReplica, cfg: CapacityConfig, notes: list[str]) -> dict:
    cpu = cfg.cpu_cores if cfg.cpu_cores is not None else per.cpu_cores
    mem = cfg.memory_mb if cfg.memory_mb is not None else per.memory_mb
    req: dict[str, Any] = {"cpu": None, "memory": None}
    lim: dict[str, Any] = {"cpu": None, "memory": None}
    if cpu is not None:
        milli = max(1, math.ceil(cpu * 1000))
        req["cpu"] = f"{milli}m"
        lim["cpu"] = f"{max(milli, 1000 * per.threads) if per.threads else 2 * milli}m"
        notes.append(f"CPU request {milli}m: the CPU a replica uses at {per.throughput_per_s:,.1f}/s "
                     + ("(--cpu)" if cfg.cpu_cores is not None else
                        f"({per.cpu_per_1000_samples_s:.4g} CPU s per 1,000 samples, measured)")
                     + (f"; limit: its {per.threads} threads" if per.threads else "; limit: twice the request"))
    else:
        notes.append("no CPU figure (the source carries none; give --cpu CORES): no CPU request, and the "
                     "autoscaling metric is requests per second per replica")
    if mem is not None:
        # the limit is never below the request (Kubernetes refuses that): twice the peak, or the request
        req["memory"], lim["memory"] = _mi(mem * (1 + cfg.headroom)), _mi(mem * max(2, 1 + cfg.headroom))
        notes.append(f"memory request: the measured peak {mem:.1f} MB + {cfg.headroom:.0%} headroom, limit twice "
                     "the peak (or the request, when the headroom is over 100%)" + ("" if cfg.memory_mb is not None else
                                   "; it is the model's own memory, not the serving process's: give --memory-mb "
                                   "for the whole container"))
    else:
        notes.append("no memory figure (give --memory-mb): no memory request")
    return {"requests": req, "limits": lim}


def make_plan(per: PerReplica, traffic: Traffic, cfg: CapacityConfig) -> Plan:
    """The plan, phase by phase: what is known (notes, the SLO), sizing for the peak, the forecast, the target
    search per strategy, the strategy written."""
    notes = _notes(per, traffic, cfg)
    slo = _slo(per, cfg, notes)
    rates = traffic.rates
    peak_at = int(np.argmax(rates))
    peak = float(rates[peak_at])
    needed, fixed_n = _sizing(per, traffic, cfg, peak_at, notes)
    fc = _forecast(per, traffic, cfg, notes)
    begin = fc.split if fc is not None else 0
    load = rates[begin:]
    thr = per.throughput_per_s
    strategies: dict[str, Strategy | None] = {
        "fixed": Strategy("fixed", None, hpa_mod.fixed(load, thr, fixed_n), fixed_n)}
    searched: dict[str, list[dict]] = {}
    for name, floor in (("reactive", None), ("forecast", fc.floor if fc is not None else None)):
        if name == "forecast" and fc is None:
            strategies[name] = None
            continue
        strategies[name], searched[name] = _search(name, load, thr, peak, fixed_n, floor, cfg, notes)
    chosen = _choose(strategies, cfg)
    notes.append(f"autoscaling written: {chosen} (target utilisation {strategies[chosen].target})")
    plan = Plan(per=per, traffic=traffic, cfg=cfg, needed=needed, begin=begin, strategies=strategies,
                chosen=chosen, searched=searched, forecast=fc, notes=notes, slo_p99_ms=slo, fixed_replicas=fixed_n)
    plan.resources = resources(per, cfg, plan.notes)
    if traffic.source == "--peak":
        plan.notes.append("--peak: a flat hour at the peak rate is replayed; give --history for the replay of "
                          "real traffic and the forecast")
    return plan


def _notes(per: PerReplica, traffic: Traffic, cfg: CapacityConfig) -> list[str]:
    stated = cfg.cpu_cores is not None and cfg.memory_mb is not None
    return [f"per-replica throughput: {per.throughput_source}"] + [
        n for n in per.notes if not (stated and n.startswith("served figures"))] + list(traffic.notes)


def _slo(per: PerReplica, cfg: CapacityConfig, notes: list[str]) -> float | None:
    """The latency objective (the flag's, else the figures'): exit 2 when one replica misses it at any load."""
    slo = cfg.slo_p99_ms if cfg.slo_p99_ms is not None else per.slo_p99_ms
    if slo is not None and per.p99_ms is not None and per.p99_ms > slo:
        raise UsageError(f"{per.source}: its p99 {per.p99_ms:.3g} ms is over the SLO p99 {slo:g} ms at any load: no "
                         "replica count meets it; tune for the SLO (optkit tune --slo 'p99<=...')")
    if slo is None:
        notes.append("no latency SLO stated (--slo-p99 or tune's --slo): 'over the SLO' means a minute's load "
                     "above what the ready replicas serve at their measured throughput")
    return slo


def _sizing(per: PerReplica, traffic: Traffic, cfg: CapacityConfig, peak_at: int,
            notes: list[str]) -> tuple[np.ndarray, int]:
    """Replicas each minute needs with the headroom, and the fixed fleet for the peak (exit 2 past the most)."""
    thr, rates = per.throughput_per_s, traffic.rates
    peak = float(rates[peak_at])
    bare = math.ceil(peak / thr - 1e-9)
    if bare > cfg.max_replicas:
        raise UsageError(f"{traffic.source} {traffic.row_at(peak_at) or 'peak'}: {peak:,.1f} requests/s needs "
                         f"{bare:,} replicas of {thr:,.1f}/s, over --max-replicas {cfg.max_replicas}; raise it or "
                         "serve a faster model")
    needed = np.maximum(cfg.min_replicas, np.ceil(rates * (1 + cfg.headroom) / thr - 1e-9)).astype(np.int64)
    fixed_n = int(needed.max())
    if fixed_n > cfg.max_replicas:
        notes.append(f"the peak with {cfg.headroom:.0%} headroom needs {fixed_n} replicas; --max-replicas "
                     f"{cfg.max_replicas} caps it (the headroom at the peak is {cfg.max_replicas * thr / peak - 1:.0%})")
        fixed_n = cfg.max_replicas
    return needed, fixed_n


def _forecast(per: PerReplica, traffic: Traffic, cfg: CapacityConfig, notes: list[str]):
    """The forecast of a history (None for --peak, --no-forecast, or a history too short: the note says why)."""
    if not cfg.forecast or traffic.source == "--peak":
        return None
    fc = fmod.forecast(traffic.rates, traffic.start, per.throughput_per_s, cfg.headroom, cfg.startup_s, cfg.lead_s,
                       cfg.min_replicas, cfg.max_replicas)
    if isinstance(fc, str):
        notes.append(fc)
        return None
    notes.append(f"forecast: {fc.method}; its error on the held-out part: {fc.error_pct:.1f}% of the "
                 "traffic; the three strategies are replayed on that part only")
    notes.extend(fc.notes)
    return fc


def _search(name: str, load: np.ndarray, thr: float, peak: float, fixed_n: int, floor, cfg: CapacityConfig,
            notes: list[str]) -> tuple[Strategy, list[dict]]:
    """The target utilisation that meets the SLO (within max_slo_minutes) with the fewest replica-hours, else the
    one with the fewest minutes over it; and every target's row."""
    rows = []
    best = None
    for t in TARGETS:
        top = min(cfg.max_replicas, max(fixed_n, hpa_mod.needed(peak, thr, t)))
        r = hpa_mod.replay(load, thr, hpa_mod.HPA(target=t, scaling=cfg, max_replicas=top), floor=floor)
        summary = r.summary()
        rows.append({"target_utilization": t, **summary})
        over = summary["slo_minutes"] > cfg.max_slo_minutes
        key = (over, summary["slo_minutes"] if over else summary["replica_hours"], -t)
        if best is None or key < best[0]:
            best = (key, Strategy(name, t, r, top, floor))
    if best[0][0]:
        notes.append(f"{name}: no target utilisation in {TARGETS[0]}..{TARGETS[-1]} meets the SLO within "
                     f"{cfg.max_slo_minutes} minutes over it; the fewest ({best[1].replay.summary()['slo_minutes']}) "
                     f"is at {best[1].target}" + (": the forecast's schedule can raise the minimum ahead of "
                                                  "surges" if name == "reactive" else ""))
    return best[1], rows


def _choose(strategies: dict[str, Strategy | None], cfg: CapacityConfig) -> str:
    """The forecast's schedule when it replays better (fewer minutes over the allowance, then replica-hours)."""
    f, r = strategies.get("forecast"), strategies["reactive"]

    def rank(st: Strategy) -> tuple:
        m = st.replay.summary()
        return max(0, m["slo_minutes"] - cfg.max_slo_minutes), m["replica_hours"]
    return "forecast" if f is not None and rank(f) < rank(r) else "reactive"
