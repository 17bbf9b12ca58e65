"""Choosing: of the candidates that meet every budget, the fastest where they were timed (Budget.pick: ties
within the noise go to the most accurate, then the smallest), checked head to head against the fastest when it
tied only within the race's noise (the run-off); a static or dynamic INT8 result slower than
max_latency_ratio beyond the timing noise is refused (exit 3, kept aside as REJECTED) unless allow_slower.
Works on the candidates' figures alone, whoever measured them."""
from __future__ import annotations

import logging
from collections.abc import Callable

from optkit.core.errors import ValidationError
from optkit.core.registry import PassContext
from optkit.measure.paired import MIN_CHANGE
from optkit.passes.quantize.budget import SAME_SPEED, Budget
from optkit.passes.quantize.candidates import Candidate, aside_path, keep_rejected
from optkit.passes.quantize.config import QuantizeConfig

log = logging.getLogger("optkit.passes.quantize.search")
RUNOFFS = 2   # head-to-head timings of the candidate to keep against the fastest (pick_after_runoffs)

# why a result is slower and what to do instead, for the refusal's message
Hint = Callable[[Candidate], tuple[str, str]]
# (the chosen candidate's latency over the fastest's, timed head to head, and its 95% interval), None: not timed
Race = Callable[[Candidate, Candidate], "tuple[float, float, float] | None"]


class Chooser:
    """`candidates`: every candidate of the search (the refusals' details list them all)."""

    def __init__(self, cfg: QuantizeConfig, budget: Budget, ctx: PassContext, candidates: list[Candidate]):
        self.cfg, self.budget, self.ctx, self.candidates = cfg, budget, ctx, candidates

    def fitting(self, pool: list[Candidate]) -> list[Candidate]:
        """The candidates that meet every budget but latency (the size ratio included); none: the smallest is
        kept aside and the search is refused (ValidationError)."""
        fits = [c for c in pool if self.budget.fits(c)]
        if not fits:
            best = min(pool, key=lambda c: c.bytes)
            dest = keep_rejected(best, aside_path(self.ctx), "missed the size budget")
            raise ValidationError(
                f"no {self.cfg.mode} candidate met the size budget ({best.ratio:.3f}x of the parent at best, budget "
                f"{self.budget.max_size_ratio:g}x); the smallest was kept as {dest}",
                details={"candidates": [c.public() for c in self.candidates]})
        return fits

    def pick(self, fits: list[Candidate]) -> Candidate:
        """The fastest of `fits` (Budget.pick), marked chosen."""
        chosen = self.budget.pick(fits)
        chosen.chosen = True
        return chosen

    def pick_after_runoffs(self, fits: list[Candidate], race: Race, settings: dict) -> Candidate:
        """pick's candidate, unless it ties for fastest only within the race's noise and, timed head to head
        against the fastest (`race`), is slower beyond its interval and SAME_SPEED: then it leaves the pool and the
        pick is made again (at most RUNOFFS times). Each run-off is recorded in settings["runoffs"]."""
        pool = list(fits)
        chosen = self.pick(pool)
        for _ in range(RUNOFFS):
            timed = [c for c in pool if c.latency_ratio is not None]
            if chosen.latency_ratio is None or len(timed) < 2:
                break
            fastest = min(timed, key=lambda c: c.latency_ratio)
            if fastest is chosen:
                break
            r = race(fastest, chosen)
            if r is None:
                break
            ratio, lo, hi = r
            slower = lo > 1 and ratio > 1 + SAME_SPEED
            settings.setdefault("runoffs", []).append(
                {"chosen": chosen.settings.label(), "fastest": fastest.settings.label(), "ratio": ratio,
                 "ratio_ci95": [lo, hi], "slower": slower})
            log.info("run-off: %s takes %.3fx the time of %s (95%% CI %.3f-%.3f)%s", chosen.settings.label(), ratio,
                     fastest.settings.label(), lo, hi, "; dropped" if slower else "")
            if not slower:
                break
            pool.remove(chosen)
            chosen.chosen = False
            self.ctx.note(f"run-off: {chosen.settings.label()} ran {ratio:.2f}x the time of "
                          f"{fastest.settings.label()} head to head (95% CI {lo:.2f}-{hi:.2f}x), so it was not kept")
            chosen = self.pick(pool)
        return chosen

    def check_speed(self, chosen: Candidate, pool: list[Candidate], settings: dict, hint: Hint) -> None:
        """Refused only when slower than max_latency_ratio beyond the timing noise (Budget.too_slow): a
        ValidationError (the result kept aside), or a warning with allow_slower; else a note with its figures.
        Untimed: nothing judged. Reads settings["parent_p50_ms"] (timing.time_candidates) and records the
        verdict as settings["speed"] before any refusal, so the report has it either way."""
        cfg, ratio = self.cfg, chosen.latency_ratio
        if ratio is None:
            return
        lo, hi = chosen.latency_ratio_ci95
        slower = self.budget.too_slow(chosen)
        settings["speed"] = {"latency_ratio": ratio, "latency_ratio_ci95": [lo, hi],
                             "max_latency_ratio": cfg.max_latency_ratio, "slower": slower}
        how = settings.get("latency_settings", "batch 1, threads 1").split(", paired")[0]
        figures = (f"{ratio:.2f}x the parent's latency (95% CI {lo:.2f}-{hi:.2f}x) at {how}, "
                   f"p50 {chosen.p50_ms:.3f} ms vs {settings['parent_p50_ms']:.3f} ms")
        if not slower:
            inside = " - within the timing noise of the limit" if hi > cfg.max_latency_ratio else ""
            whose = ("timed as the run times the stage: this is its latency figure, not timed again"
                     if settings.get("latency_is_the_stages") and self.ctx.timed else
                     "not the stage's measured latency")
            self.ctx.note(f"search race (the candidates timed against the parent while choosing; {whose}): "
                          f"{figures}{inside}; the fastest of {len(pool)} candidates that meet the budgets (ties "
                          "within the noise: the most accurate, then the smallest)")
            return
        tried = "; ".join(f"{c.settings.label()}: {c.latency_ratio:.2f}x" for c in pool if c.latency_ratio)
        # how it compares with the parent, said as the tables say it: "same" when the interval holds 1.0 (±3%)
        if lo > 1 + MIN_CHANGE:
            verdict = "SLOWER than its FP32 parent"
        elif hi < 1 - MIN_CHANGE:
            verdict = f"faster than its FP32 parent, but not {cfg.max_latency_ratio:g}x as fast"
        else:
            verdict = "no faster than its FP32 parent (the same within the noise)"
        why, instead = hint(chosen)
        msg = (f"{cfg.mode} INT8 is {verdict} on this CPU: {figures} (limit {cfg.max_latency_ratio:g}x; candidates: "
               f"{tried}); {why}")
        if cfg.allow_slower:
            self.ctx.warn(msg + "; written anyway (allow_slower / --allow-slower)")
            return
        dest = keep_rejected(chosen, aside_path(self.ctx), "slower than its parent")
        raise ValidationError(msg + f"; kept as {dest}. Set allow_slower (--allow-slower) to accept it (e.g. for size), "
                              f"{instead}", details={"candidates": [c.public() for c in self.candidates],
                                                     "rejected": str(dest)})
