"""The result of a tune: the best settings measured again in interleaved rounds (`Confirmation`: the winner by
its mean, ties by overlapping 95% intervals, done once and shared when several workers ran the study), and the
result dict (`summarize`) that the report keeps as `measurements.tune` and best.json holds."""
from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from typing import Any

import numpy as np

from optkit.core import interrupts, strictjson
from optkit.core.isolate import TimedOut
from optkit.core.text import first_line
from optkit.measure.serving import Setting
from optkit.measure.trials import ratio_ci95
from optkit.passes.tune import study as studies
from optkit.passes.tune import workers
from optkit.passes.tune.config import Goal, TuneConfig
from optkit.passes.tune.trial import Measurer

log = logging.getLogger(__name__)

ROUNDS = 3  # confirmation rounds of the best settings


class Confirmation:
    """The best settings measured again, ROUNDS interleaved rounds, so that a win is told from noise."""

    def __init__(self, measurer: Measurer, goal: Goal, notes: list[str], worker: dict[str, Any], stale: list[int]):
        self.measurer, self.goal, self.notes, self.worker, self.stale = measurer, goal, notes, worker, stale

    def confirm(self, top: list[dict]) -> list[dict]:
        """The best settings measured again, interleaved over ROUNDS rounds (each sees the machine the others
        see); the winner has the best mean; a setting whose 95% interval overlaps the winner's is a tie. With a
        time budget: as many settings as its rest fits, only whole rounds count, and at least two of them."""
        figure, m = self.goal.figure, self.measurer
        if math.isfinite(m.deadline):
            per = m.seconds_needed()
            fits = int(m.left() // (ROUNDS * per))
            if fits < 1:
                self.notes.append(f"the best setting was not measured again: {max(0.0, m.left()):.1f} s of the "
                                  f"time budget left, {ROUNDS} rounds take about {ROUNDS * per:.1f} s")
                return []
            if fits < len(top):
                self.notes.append(f"measured again: the best {fits} of {len(top)} settings (the time budget's "
                                  "rest fits no more)")
                top = top[:fits]
        runs: dict[int, list[dict]] = {r["number"]: [] for r in top}
        rounds = 0
        try:
            for _ in range(ROUNDS):
                for r in top:
                    runs[r["number"]].append(m.measure(Setting(**r["setting"]), m.deadline))
                rounds += 1
        except TimedOut as e:
            why = "the time budget ran out" if math.isfinite(m.deadline) else first_line(e)
            if rounds < 2:
                self.notes.append(f"the best setting was not measured again: {why}")
                return []
            self.notes.append(f"measured again over {rounds} rounds ({why})")
        runs = {k: v[:rounds] for k, v in runs.items()}
        out = [_confirmed(r, runs[r["number"]], figure) for r in top]
        sign = -1 if self.goal.maximize else 1
        out.sort(key=lambda c: sign * c["confirmed"]["mean"])
        lo, hi = out[0]["confirmed"]["ci95"]
        for c in out:
            c_lo, c_hi = c["confirmed"]["ci95"]
            c["tie"] = c_lo <= hi and c_hi >= lo
        return out

    def shared(self, study, top: list[dict]) -> list[dict]:
        """The confirmation of a study several workers ran, done once and shared, so that every worker names the
        same best: each asks a bookkeeping trial (skipped: never counted) marked with the settings to confirm;
        the worker whose trial came first measures them again and keeps the outcome in its trial; the others
        wait for it (a worker that dies is found by its heartbeat, and the next in line measures)."""
        import optuna

        S = optuna.trial.TrialState
        key = hashlib.sha256(strictjson.dumps([r["number"] for r in top]).encode()).hexdigest()[:16]
        with interrupts.deferred():
            trial = study.ask()
            trial.set_user_attr("worker", self.worker)
            trial.set_user_attr("skipped", True)
            trial.set_user_attr("confirm", key)
        told = False
        try:
            with workers.Heartbeat(study._storage, trial._trial_id):
                while True:
                    with interrupts.deferred():
                        studies.fail_stale(study, self.stale)
                        marked = [t for t in study.get_trials(deepcopy=False)
                                  if t.user_attrs.get("confirm") == key and t._trial_id != trial._trial_id]
                    done = next((t for t in marked if t.state != S.RUNNING and "confirmed" in t.user_attrs), None)
                    if done is not None:
                        out = done.user_attrs["confirmed"]
                        self.notes.append(f"the best settings were measured again by "
                                          f"{workers.worker_label(done.user_attrs.get('worker'))} (trial {done.number})")
                        break
                    if not any(t.state == S.RUNNING and t._trial_id < trial._trial_id for t in marked):
                        out = self.confirm(top)
                        with interrupts.deferred():
                            trial.set_user_attr("confirmed", json.loads(strictjson.dumps(out)))
                        break
                    if self.measurer.left() <= studies.POLL_S:
                        self.notes.append("the best setting was not measured again: the time budget ran out while "
                                          "another worker measured it")
                        out = []
                        break
                    time.sleep(studies.POLL_S)
                with interrupts.deferred():
                    study.tell(trial, state=S.PRUNED, skip_if_finished=True)
                    told = True
        finally:
            if not told:
                with interrupts.deferred():
                    try:
                        study.tell(trial, state=S.FAIL)
                    except Exception as e:  # noqa: BLE001 - the storage itself failed: the first error goes on
                        log.debug("could not mark trial %d failed: %s", trial.number, first_line(e))
        return out


def _confirmed(row: dict, runs: list[dict], figure: str) -> dict:
    """A trial row with its rounds' figures (the median of each) and the objective figure's mean and 95% CI.
    Every objective figure is a positive quantity (a rate, a time, CPU seconds), so the interval is the t
    interval of the rounds' logs, widened to hold the mean: a noisy rate's band stays above 0 and widens by
    ratio (a normal interval of three rounds crossed 0 on a busy machine)."""
    values = [f[figure] for f in runs if f.get(figure) is not None]
    mean = float(np.mean(values))
    band = [mean, mean]
    if min(values) > 0:
        _, lo, hi = ratio_ci95(values)
        band = [min(lo, mean), max(hi, mean)]
    merged = {k: float(np.median([f[k] for f in runs if f.get(k) is not None]))
              for k in runs[0] if isinstance(runs[0][k], (int, float))}
    return {**row, "figures": merged,
            "confirmed": {"figure": figure, "mean": mean, "ci95": band, "rounds": len(values), "values": values}}


def with_each_runtime(top: list[dict], ranked: list[dict]) -> list[dict]:
    """The settings to confirm, with the best of each runtime the ranking holds, so the rounds compare runtimes."""
    have = {r["setting"].get("runtime", "onnxruntime") for r in top}
    for r in ranked:
        runtime = r["setting"].get("runtime", "onnxruntime")
        if runtime not in have:
            have.add(runtime)
            top = [*top, r]
    return top


def compare_runtimes(confirmed: list[dict], goal: Goal) -> dict[str, Any] | None:
    """Which runtime serves faster on this machine: the best confirmed setting of each, compared round by round
    (the rounds are interleaved, so each ratio sees one machine state): the winner's figure over the other's
    (better is above 1), with the 95% interval of those ratios; "same" when it holds 1.0."""
    best: dict[str, dict] = {}
    for c in confirmed:  # best first
        best.setdefault(c["setting"].get("runtime", "onnxruntime"), c)
    if len(best) < 2:
        return None
    (win, a), (lose, b) = list(best.items())[:2]
    va, vb = a["confirmed"]["values"], b["confirmed"]["values"]
    n = min(len(va), len(vb))
    if n < 2 or min(va[:n] + vb[:n]) <= 0:
        return None
    ratios = [x / y if goal.maximize else y / x for x, y in zip(va[:n], vb[:n])]
    centre, lo, hi = ratio_ci95(ratios)
    same = lo <= 1.0 <= hi
    how = (f"gives {centre:.2f}x the {goal.figure} of" if goal.maximize else
           f"is {centre:.2f}x faster ({goal.figure}) than")
    text = (f"runtimes: {win} and {lose} serve this model alike here ({goal.figure} ratio {centre:.2f}x, 95% CI "
            f"{lo:.2f}-{hi:.2f}x over {n} interleaved rounds)" if same else
            f"runtimes: {win} is faster here: its best setting ({a['label']}) {how} {lose}'s best "
            f"({b['label']}), 95% CI {lo:.2f}-{hi:.2f}x over {n} interleaved rounds")
    return {"faster": None if same else win, "compared": [win, lose], "figure": goal.figure, "ratio": centre,
            "ci95": [lo, hi], "rounds": n, "text": text}


def rows_of(trials: list, goal: Goal) -> list[dict]:
    """The finished trials as the result lists them."""
    return [{"number": t.number, "state": t.state.name.lower(), "setting": t.user_attrs["setting"],
             "label": Setting(**t.user_attrs["setting"]).label(), "figures": t.user_attrs["figures"],
             "feasible": all(v <= 0 for v in t.user_attrs.get("constraints", [])),
             **({"duplicate_of": t.user_attrs["duplicate_of"]} if "duplicate_of" in t.user_attrs else {})}
            for t in trials]


def summarize(trials: list, failed: list[dict], *, goal: Goal, cfg: TuneConfig, confirmation: Confirmation,
              study, space: dict, left_out: dict, storage: str, study_name: str, stale: int) -> dict[str, Any]:
    """The result: the best setting (confirmed), its ties, the session options and recipe lines that serve it,
    the study's counts and every trial (what measurements.tune and best.json hold)."""
    rows = rows_of(trials, goal)
    complete = [r for r in rows if r["state"] == "complete" and "duplicate_of" not in r]
    feasible = [r for r in complete if r["feasible"]]
    if not feasible:
        raise goal.missed(rows)
    ranked = sorted(feasible, key=goal.key)
    top = with_each_runtime(ranked[:cfg.confirm], ranked) if cfg.confirm >= 1 else []
    shared = study is not None and len(workers.workers_of(trials)) > 1
    confirmed = (confirmation.shared(study, top) if shared else confirmation.confirm(top)) if top else []
    best = confirmed[0] if confirmed else {**ranked[0], "confirmed": None}
    ties = [c for c in confirmed[1:] if c["tie"]]
    runtimes = compare_runtimes(confirmed, goal)
    if runtimes is not None:
        confirmation.notes.append(runtimes["text"])
    mark_pareto(rows)
    setting = Setting(**best["setting"])
    return {
        "objective": cfg.objective, "slo": cfg.slo, "max_memory_mb": cfg.max_memory_mb,
        "best": {"setting": best["setting"], "label": best["label"], "figures": best["figures"],
                 "trial": best["number"], "confirmed": best.get("confirmed")},
        "ties": [{"setting": t["setting"], "label": t["label"], "confirmed": t["confirmed"]} for t in ties],
        "runtimes": runtimes,
        "session_options": "" if setting.runtime == "openvino" else setting.session.snippet(setting.threads),
        "recipe": {"measure": setting.recipe_measure(), "gates": goal.gates(best["figures"])},
        "space": space, "left_out": left_out,
        "study": {"storage": storage, "name": study_name, "trials": len(rows),
                  "pruned": sum(r["state"] == "pruned" for r in rows),
                  "duplicates": sum("duplicate_of" in r for r in rows),
                  "failed": len(failed), "stale": stale,
                  "workers": workers.workers_of(trials), "machine": workers.machine_kind()},
        "objective_figure": goal.figure, "direction": goal.directions[0],
        "trials": rows,
        "failed_trials": failed,
    }


def mark_pareto(rows: list[dict]) -> None:
    """Mark the feasible trials no other beats on both p50 latency and throughput."""
    pts = [r for r in rows if r["state"] == "complete" and r["feasible"] and "duplicate_of" not in r]
    for r in rows:
        r["pareto"] = False
    for r in pts:
        f = r["figures"]
        r["pareto"] = not any(o is not r and o["figures"]["p50_ms"] <= f["p50_ms"]
                              and o["figures"]["throughput_per_s"] >= f["throughput_per_s"]
                              and (o["figures"]["p50_ms"] < f["p50_ms"]
                                   or o["figures"]["throughput_per_s"] > f["throughput_per_s"]) for o in pts)
