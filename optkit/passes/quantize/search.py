"""The quantize search: prepare the float model, try settings (engine.py's strategy for the mode), check each
candidate against the parent, keep sensitive nodes in float when none meets the budget, and keep the fastest
candidate that meets every budget, as measured on this machine (budget.py's Budget judges and picks).

The phases, each a unit of its own: prepare.py (checks up front, the prepared model, the Reference the
candidates are checked against), build.py (a candidate's file; which settings are worth building; the node
fallback's ranking), score.py (screening on a subset, scoring on the whole check set), timing.py (the survivors
against the FP32 parent through measure.paired), choose.py (the fastest within every budget; a slower INT8
result refused), messages.py (what the user is told). The Quantizer here runs them in order.

Cheap first: candidates are screened on a subset of the check data and only plausible ones are scored on the
whole set; only those that meet every budget are timed, against the FP32 parent in one child process
(measure.paired.paired_latencies: call by call, clearly slower candidates dropped early, TIMING_LIMIT_S in all);
costlier calibrations are tried only when the cheap ones miss. `max_candidates` and `time_budget` bound the
search. The phases' times (build, score, time) are reported as `phases_s` and logged at -v.
"""
from __future__ import annotations

import contextlib
import logging
import math
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from optkit.core import phases as wall  # the command's wall-time laps (-v), not self.phases
from optkit.core.artifact import Artifact
from optkit.core.batching import first_call
from optkit.core.errors import UsageError
from optkit.core.registry import PassContext, require_extra
from optkit.measure.profile_ov import kernel_counts
from optkit.onnx import graph
from optkit.onnx import io as onnx_io
from optkit.onnx import session as onnx_session
from optkit.passes.quantize import fusion, kernels, skip
from optkit.passes.quantize.budget import Budget
from optkit.passes.quantize.build import Builder, rank, schedule, small_channel_convs, twin_missed
from optkit.passes.quantize.candidates import Candidate, Settings
from optkit.passes.quantize.choose import Chooser
from optkit.passes.quantize.config import QuantizeConfig
from optkit.passes.quantize.engine import calibration_reader, strategy_for
from optkit.passes.quantize.messages import Teller
from optkit.passes.quantize.prepare import (
    SCORE_THREADS,
    Reference,
    check_flags,
    check_quantizable,
    load_reference,
    prepare,
)
from optkit.passes.quantize.score import CLEARLY_SLOWER, Scorer
from optkit.passes.quantize.timing import race_result, runoff, time_candidates

__all__ = ["Quantizer", "CLEARLY_SLOWER"]  # CLEARLY_SLOWER lives in score.py; imported from here by tests

log = logging.getLogger(__name__)


class Quantizer:
    def __init__(self, artifact: Artifact, cfg: QuantizeConfig, ctx: PassContext):
        self.artifact, self.cfg, self.ctx = artifact, cfg, ctx
        self.mode = cfg.mode
        self.work = Path(tempfile.mkdtemp(prefix="optkit-quant-"))  # removed by __exit__ on every path
        self.strategy = strategy_for(cfg, self.work)
        self.candidates: list[Candidate] = []
        self.settings: dict[str, Any] = {}
        self.deadline = time.monotonic() + cfg.time_budget if cfg.time_budget else math.inf
        self.prepared = self.work / "prepared.onnx"
        self.float_model = None
        self.quantizable: list[str] = []  # "Conv x12": the ops of the mode the model holds
        self.budget = Budget.of(cfg)
        self.phases = {"build": 0.0, "score": 0.0, "time": 0.0}  # seconds spent in each phase of the search
        self.kernel_table: kernels.Table | None = None  # this CPU's int8 kernels against float (_prune)
        self.nothing_faster: str | None = None  # dynamic: the one line saying no op here gets faster
        self.chooser = Chooser(cfg, self.budget, ctx, self.candidates)
        # set once the model is prepared and the check data loaded (_execute)
        self.ref: Reference | None = None
        self.builder: Builder | None = None
        self.scorer: Scorer | None = None
        self.tell: Teller | None = None

    def __enter__(self) -> Quantizer:
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.work, ignore_errors=True)

    # ------------------------------------------------------------ orchestration
    def execute(self) -> Path:
        try:
            return self._execute()
        finally:
            phases = {k: round(v, 3) for k, v in self.phases.items()}
            log.info("quantize search: %s", self._where_the_time_went())
            wall.detail(self._phase_times())
            self.ctx.measurements["quantize"] = {"mode": self.mode, "settings": self.settings,
                                                 "candidates": [c.public() for c in self.candidates],
                                                 "phases_s": phases}

    @contextlib.contextmanager
    def _phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] += time.perf_counter() - start

    def _execute(self) -> Path:
        if self.mode == "fp16":
            require_extra("quantize", "quantize mode fp16")
        check_flags(self.cfg, self.ctx.data)
        model = onnx_io.load(self.artifact.path)
        already = graph.is_quantized(model)
        if already:
            raise UsageError(f"{self.artifact.path} is already quantized (it holds {', '.join(already)}); "
                             "quantize the float model instead")
        self.quantizable = check_quantizable(model, self.cfg, self.artifact.path)
        self.float_model, self.nothing_faster = prepare(model, self.cfg, self.ctx, self.strategy, self.work,
                                                        self.prepared)
        self._start(load_reference(self.artifact.path, self.cfg, self.ctx, self.settings))
        self.settings.update(budget=self.budget.kind, budget_value=self.budget.value)
        space, held = self._prune(self.strategy.space())
        tried = self._try_all(space) if self.cfg.latency_search else self._first_that_builds(space)
        held = skip.worth_retrying(held, tried) if not any(c.passed for c in tried) else []
        if held:  # the kernel table's skips that might meet the budgets where the others missed them
            self.settings["skipped_tried"] = len(held)
            tried += self._try_all(held)
        if not any(c.passed for c in tried):
            first_tier = list(tried)
            best = self._best_settings(tried, 2)
            slower = self._try_all(self.strategy.slower_tier(best) if self.cfg.latency_search else [])
            tried += slower
            if self.budget.fallback and (self.mode == "dynamic" or not any(c.passed for c in slower)):
                # dynamic: the slower tier keeps the embedding tables float (far larger); a few sensitive nodes
                # float in the fully quantized model may meet the budget too, and Budget.pick weighs the sizes
                tried += self._fallback(max(first_tier or tried, key=self.budget.score), keep=slower)
        passing = [c for c in tried if c.passed]
        if not passing:
            raise self.tell.refusal(tried)
        return self._finish(passing)

    def _start(self, ref: Reference) -> None:
        """The phases' units, once the model is prepared and the reference loaded."""
        self.ref = ref
        fused = getattr(self.strategy, "fused", None)
        if fused is not None and not self._computes_the_same(fused):
            self.strategy.fused = None
            self.ctx.note("dynamic: the transformer-fused model does not compute what its parent does; not used")
        self.builder = Builder(self.artifact, self.cfg, self.strategy, self.prepared, self.float_model,
                               reader=lambda: calibration_reader(ref.specs, ref.calib_feeds),
                               quantizable=self.quantizable)
        self.scorer = Scorer(ref, self.budget, self.cfg, speed_matters=self._speed_matters())
        self.tell = Teller(self.cfg, self.budget, ref, self.ctx, self.settings, self.candidates, self.strategy,
                           self.nothing_faster)

    def _computes_the_same(self, path: Path) -> bool:
        """The float model at `path` gives the parent's outputs on the first check samples (fusion.same_outputs)."""
        n = min(self.ref.samples, 8)
        feeds = {k: v[:n] for k, v in self.ref.check_feeds.items()}
        try:
            out = self.ref.run(onnx_session.session(path, threads=SCORE_THREADS), feeds)
        except Exception:  # noqa: BLE001 - a fused model onnxruntime cannot run is not used
            return False
        return fusion.same_outputs([r[:n] if np.ndim(r) else r for r in self.ref.parent_outputs], out)

    def _try_all(self, space: list[Settings]) -> list[Candidate]:
        out = []
        for settings in space:
            if len(self.candidates) >= self.cfg.max_candidates or (self.candidates and time.monotonic() > self.deadline):
                if not self.settings.get("stopped"):
                    self.settings["stopped"] = (f"after {len(self.candidates)} candidates"
                                                + (" (time budget)" if time.monotonic() > self.deadline else ""))
                break
            twin = twin_missed(settings, self.candidates)
            if twin is not None:
                self.settings.setdefault("skipped", []).append(
                    {"variant": settings.label(), "why": f"the same arithmetic as candidate {twin.index} "
                                                        f"({twin.settings.label()}), which missed the budget"})
                log.info("skipped %s: its QDQ twin missed the budget", settings.label())
                continue
            out.append(self._candidate(settings))
        return out

    # ------------------------------------------------------------ the kernel table's skips (skip.py)
    def _prune(self, space: list[Settings]) -> tuple[list[Settings], list[Settings]]:
        """(the settings to build, those this CPU's kernel table says cannot win: built only when none of the
        others meets the budgets). Only where speed decides the search (static or dynamic INT8 for the CPU,
        timed, searched) and full_search is off."""
        if self.cfg.full_search or not (self._speed_matters() and self.cfg.latency_search) or len(space) < 2 \
                or self.cfg.runtime != "onnxruntime":  # the table is onnxruntime's kernels
            return space, []
        self.phases["kernels"] = 0.0
        with self._phase("kernels"):
            split = skip.split_space(self.mode, space, self.float_model, self.settings)
        self.kernel_table = split.table
        return split.build, split.held

    def _where_the_time_went(self) -> str:
        p, cands = self.phases, self.candidates
        table = self.kernel_table
        head = (f"kernel table {p.get('kernels', 0.0):.1f} s ({'cached' if table.cached else 'measured'}), "
                if table is not None else "")
        skipped = len(self.settings.get("skipped", []))
        built = sum(1 for c in cands if c.bytes)
        scored = sum(1 for c in cands if c.fidelity is not None)
        timed = sum(1 for c in cands if c.latency_ratio is not None)
        return (f"{head}{len(cands)} candidates ({skipped} skipped); build {p['build']:.1f} s ({built}), "
                f"score {p['score']:.1f} s ({scored}), timing {p['time']:.1f} s ({timed})")

    def _phase_times(self) -> str:
        p = self.phases
        return ", ".join(f"{k} {p[k]:.1f} s" for k in ("kernels", "build", "score", "time") if k in p)

    def _first_that_builds(self, space: list[Settings]) -> list[Candidate]:
        """Without the search: the first setting, or the next when onnxruntime cannot build it."""
        tried = []
        for settings in space[:4]:
            tried.append(self._candidate(settings))
            if not tried[-1].error:
                break
        return tried

    def _best_settings(self, tried: list[Candidate], n: int) -> list[Settings]:
        ok = [c for c in tried if not c.error]
        return [c.settings for c in sorted(ok, key=self.budget.score, reverse=True)[:n]]

    def _candidate(self, settings: Settings) -> Candidate:
        """Build one candidate, then screen and score it (build.Builder, score.Scorer)."""
        cand = Candidate(index=len(self.candidates), settings=settings, path=self.work / f"cand{len(self.candidates)}.onnx")
        self.candidates.append(cand)
        with self._phase("build"):
            if not self.builder.build(cand, self._raw(cand)):
                return cand
        with self._phase("score"):
            self.scorer.check(cand, self.candidates)
        return cand

    def _raw(self, cand: Candidate) -> Path:
        return self.work / f"cand{cand.index}.raw.onnx"

    def _fallback(self, first: Candidate, keep: list[Candidate] = ()) -> list[Candidate]:
        """Keep the nodes that add the most error float, 1, 2, 4, ... of them, until the budget holds (from the
        unfused model: node names are the parent's). Where `keep` (the slower tier) already tried the embedding
        tables float, the tables are not ranked: this fallback keeps them quantized (a quarter of their size)."""
        if first.settings.fused:
            first = next((c for c in self.candidates if c.settings == replace(first.settings, fused=None)), first)
            if first.settings.fused:
                return []
        tables = [n.name for n in self.float_model.graph.node
                  if n.op_type == "Gather" and any("Gather" in c.settings.float_ops for c in keep)]
        ranked = rank(self.float_model, self._raw(first), self.ref.check_feeds, [*self.cfg.nodes_exclude, *tables],
                      self.work)
        if self._raw(first).exists():
            self.settings["sensitivity"] = [{"node": n, "added_error": round(s, 6)} for n, s in ranked[:20]]
        tried = []
        for k in schedule(len(ranked), self.cfg.max_candidates - len(self.candidates)):
            cand = self._candidate(first.settings.with_float(name for name, _ in ranked[:k]))
            tried.append(cand)
            if cand.passed:
                break
        return tried

    # ------------------------------------------------------------ choosing: size, speed
    def _finish(self, passing: list[Candidate]) -> Path:
        """Keep the fastest candidate that meets every budget (size included; Budget.pick breaks ties in the
        noise for accuracy, then size); refuse (exit 3) a static or dynamic INT8 result slower than its parent
        unless allowed."""
        pool = list(passing)
        if self._speed_matters() and self.mode == "static":
            pool += self._slow_conv_variant(min(passing, key=lambda c: c.bytes))
        fits = self.chooser.fitting(pool)
        if self.cfg.measure_candidates and (len(fits) > 1 or self._speed_matters()):
            with self._phase("time"):
                self.settings.update(time_candidates(self.artifact, fits, self.ref.specs, self.ref.check_feeds,
                                                     self.ctx.note, self.ctx.timing, self._runtime()))
        if self._runtime():
            self.ctx.note(f"candidates built in the form {self._runtime()} runs as int8 (QDQ), scored and timed on "
                          f"{self._runtime()}")
        chosen = self.chooser.pick_after_runoffs(fits, self._race, self.settings)
        if self.settings.get("latency_is_the_stages"):  # the race timed the chosen file as the run times a stage
            self.ctx.timed = race_result(self.artifact, chosen)
        self.settings.update(chosen.settings.to_dict())
        if self._runtime() == "openvino":
            self._say_int8_kernels(chosen)
        self.tell.say_chosen(chosen)
        if self._speed_matters():
            self.chooser.check_speed(chosen, fits, self.settings, self.tell.slower_hint)
        return chosen.path

    def _race(self, fastest: Candidate, chosen: Candidate) -> tuple[float, float, float] | None:
        with self._phase("time"):
            return runoff(fastest, chosen, self.ref.specs, self.ref.check_feeds, self.ctx.note, self._runtime())

    def _say_int8_kernels(self, chosen: Candidate) -> None:
        """OpenVINO's per-layer counters on one call: how many layers of the chosen file ran int8 kernels (a QDQ
        pattern OpenVINO does not fold runs in float, which only its execution graph shows)."""
        counts = kernel_counts(Artifact.load(str(chosen.path)), first_call(self.ref.specs, self.ref.check_feeds, 1))
        self.settings["openvino_kernels"] = counts
        self.ctx.note(f"OpenVINO ran {counts['int8']} of {counts['layers']} layers of the chosen file with int8 "
                      "kernels (its per-layer counters, one call)")

    def _runtime(self) -> str | None:
        return None if self.cfg.runtime == "onnxruntime" else self.cfg.runtime

    def _speed_matters(self) -> bool:
        return self.mode in ("static", "dynamic") and self.cfg.target == "cpu" and self.cfg.measure_candidates

    def _slow_conv_variant(self, cand: Candidate) -> list[Candidate]:
        """Conv nodes with <= 4 input channels per group (the first conv of an image model, depthwise convs)
        often run slower in int8 than in float; the variant that keeps them float is timed like the others."""
        slow = small_channel_convs(self.float_model, [*self.cfg.nodes_exclude, *cand.float_nodes])
        if not slow or not self.cfg.latency_search or len(self.candidates) >= self.cfg.max_candidates:
            return []
        lose = (skip.slow_convs_lose(self.float_model, slow, cand.settings, self.kernel_table.ratios)
                if self.kernel_table is not None else None)
        if lose:
            self.settings.setdefault("skipped", []).append(
                {"variant": cand.settings.with_float([*cand.float_nodes, *slow]).label() + " small convs float",
                 "why": lose, "rule": "kernels"})
            log.info("skipped the small-channel-conv variant: %s", lose)
            return []
        self.settings["int8_slow_nodes"] = slow
        variant = self._candidate(cand.settings.with_float([*cand.float_nodes, *slow]))
        return [variant] if variant.passed else []
