"""The Kubernetes HorizontalPodAutoscaler (autoscaling/v2) replayed minute by minute on a traffic history.

What is modelled, and how (the controller's own rule, pkg/controller/podautoscaler):
- the metric is the utilisation of the READY pods: load / (ready x per-replica throughput);
- desired = ceil(current x metric / target) (with every pod ready; the controller multiplies by the ready pods,
  which the metric is of), skipped when |metric/target - 1| <= tolerance (0.1); on a scale-up with pods not yet
  ready, those count as 0% used and the ratio is taken again over all pods (no action if that reverses the
  direction or falls within the tolerance);
- a schedule (KEDA cron triggers) is one more metric: the HPA takes the larger desired count;
- stabilisation: the recommendation is held between the MIN of the desired counts over the scale-up window and
  the MAX over the scale-down window (default 0 s and 300 s), the current count in between;
- scale-up policies: default max(+100%, +4 pods) per 15 s. The replay steps a minute, so one step allows four
  15 s periods composed: at most f(f(f(f(current)))) with f(n) = max(2n, n + 4); scale-down is unlimited (100%
  per 15 s, the default); then min/max replicas;
- the controller acts at the end of each minute on that minute's mean load; a pod it adds serves from the first
  whole minute after its start-up time (--startup); a scale-down removes pods not yet ready first.
A minute is over the SLO when its load exceeds ready x throughput at the SLO.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import numpy as np

from optkit.capacity.config import Scaling

SYNC_S = 15


UP_WINDOW_S = 0      # the scale-up stabilisation window: the HPA's default, which optkit does not change


@dataclass
class HPA:
    """The rule at one target utilisation: `scaling` holds the settings (config.Scaling, declared once there),
    `max_replicas` this replay's own cap where it is lower."""
    target: float                      # utilisation of a replica's throughput at the SLO, 0..1
    scaling: Scaling = field(default_factory=Scaling)
    max_replicas: int | None = None
    up_percent: float = 100.0
    up_pods: int = 4
    step_s: int = 60

    def __post_init__(self) -> None:
        if self.max_replicas is None:
            self.max_replicas = self.scaling.max_replicas

    def up_limit(self, current: int) -> int:
        n = current
        for _ in range(max(1, self.step_s // SYNC_S)):
            n = max(math.floor(n * (1 + self.up_percent / 100)), n + self.up_pods)
        return n


@dataclass
class Replay:
    replicas: np.ndarray       # pods (ready or starting) each minute: what is paid for
    ready: np.ndarray
    utilisation: np.ndarray
    over: np.ndarray           # bool: load > ready x throughput

    def summary(self) -> dict:
        return {"slo_minutes": int(self.over.sum()), "replica_hours": round(float(self.replicas.sum()) / 60, 2),
                "peak_replicas": int(self.replicas.max()) if len(self.replicas) else 0}


def needed(load: float, throughput: float, target: float) -> int:
    return max(1, math.ceil(load / (throughput * target) - 1e-9))


def replay(load: np.ndarray, throughput: float, hpa: HPA, floor: np.ndarray | None = None,
           initial: int | None = None) -> Replay:
    """The HPA over `load` (requests per second, one per step); `floor` (per step) is a schedule's desired count."""
    n = len(load)
    rule = hpa.scaling
    startup_steps = math.ceil(rule.startup_s / hpa.step_s)
    start = initial if initial is not None else needed(float(load[0]) if n else 0.0, throughput, hpa.target)
    start = min(max(start, rule.min_replicas), hpa.max_replicas)
    pods: list[int] = [-1] * start             # the step from which each pod serves
    history: list[tuple[int, int]] = []         # (step, desired before stabilisation)
    up_steps = UP_WINDOW_S // hpa.step_s
    down_steps = rule.down_window_s // hpa.step_s
    replicas = np.zeros(n, dtype=np.int64)
    ready_n = np.zeros(n, dtype=np.int64)
    util = np.zeros(n)
    over = np.zeros(n, dtype=bool)
    for m in range(n):
        x = float(load[m])
        ready = bisect.bisect_right(pods, m)       # pods stay sorted: each new one serves last
        current = len(pods)
        replicas[m], ready_n[m] = current, ready
        capacity = ready * throughput
        util[m] = x / capacity if capacity > 0 else math.inf
        over[m] = x > capacity * (1 + 1e-12)
        desired = _desired(x, ready, current, throughput, hpa)
        if floor is not None and floor[m] > desired:
            desired = int(floor[m])
        # stabilisation over the windows (the current desired counts; older entries strictly inside the window)
        up_rec = min([desired] + [d for s, d in history if s > m - up_steps]) if up_steps else desired
        down_rec = max([desired] + [d for s, d in history if s > m - down_steps]) if down_steps else desired
        history.append((m, desired))
        if len(history) > max(up_steps, down_steps) + 1:
            history.pop(0)
        rec = current
        if rec < up_rec:
            rec = up_rec
        if rec > down_rec:
            rec = down_rec
        if rec > current:
            rec = min(rec, hpa.up_limit(current))
        rec = min(max(rec, rule.min_replicas), hpa.max_replicas)
        if rec > current:
            pods.extend([m + 1 + startup_steps] * (rec - current))
        elif rec < current:
            del pods[rec:]                        # the pods not yet ready (latest start) go first
    return Replay(replicas=replicas, ready=ready_n, utilisation=util, over=over)


def _desired(load: float, ready: int, current: int, throughput: float, hpa: HPA) -> int:
    """The controller's desired count from the utilisation metric, before stabilisation and limits
    (replica_calculator.go GetResourceReplicas: the ratio of the ready pods' usage; with pods not yet ready on a
    scale-up, those at 0% and the ratio taken again)."""
    if ready == 0:  # no pod reports the metric: the controller cannot compute one and leaves the count
        return current
    ratio = load / (ready * throughput) / hpa.target
    if not (ready < current and ratio > 1):
        if abs(1 - ratio) <= hpa.scaling.tolerance:
            return current
        return math.ceil(ratio * ready - 1e-9)
    again = load / (current * throughput) / hpa.target
    if abs(1 - again) <= hpa.scaling.tolerance or again < 1:
        return current
    return max(current, math.ceil(again * current - 1e-9))


def fixed(load: np.ndarray, throughput: float, replicas: int) -> Replay:
    """A fixed fleet: `replicas` pods, all ready, all the time."""
    n = len(load)
    cap = replicas * throughput
    return Replay(replicas=np.full(n, replicas, dtype=np.int64), ready=np.full(n, replicas, dtype=np.int64),
                  utilisation=np.asarray(load, float) / cap, over=np.asarray(load) > cap * (1 + 1e-12))
