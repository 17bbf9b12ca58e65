"""The budgets a quantize candidate is judged against, built once: an accuracy drop (with a metric) or a
fidelity loss (an explicit budget, or the mode's tolerance), the size ratio, and the latency ratio a static INT8
result may not exceed. The search asks it whether a candidate meets them, by what margin, how it ranks,
whether a subset already shows it hopeless, how noisy a subset's verdict is, and which candidate to keep.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from optkit.core.errors import UsageError
from optkit.measure.accuracy import CLASS_METRICS
from optkit.measure.textmetrics import paired_bootstrap
from optkit.passes.quantize.candidates import Candidate
from optkit.passes.quantize.config import TOLERANCE, QuantizeConfig

SCREEN_MARGIN = 2.0  # a candidate whose subset loss is over this many budgets is not scored on the full set
SAME_SPEED = 0.03    # latency ratios this close read "same" even when their intervals do not overlap
SMALLER = 0.10       # a file smaller by more than this share wins among latency ties (pick)
# a bound from resampling the rows (spearman, pearson, f1) needs rows enough for resamples to differ: on 2 or 3 a
# rank correlation takes 2-4 values, every resample of a candidate that kept the ranks gives the parent's, and the
# "95% bound" read 0.0000
MIN_BOOTSTRAP_ROWS = 20


@dataclass(frozen=True)
class Budget:
    kind: str                       # "top1 drop", "fidelity loss"
    value: float
    on_accuracy: bool               # judged on the metric's drop, else on the fidelity loss
    explicit: bool                  # the user asked for it (a budget turns the float-node fallback on)
    max_size_ratio: float | None = None
    max_latency_ratio: float | None = None
    fallback: bool = False          # keep sensitive nodes float when no candidate meets the budget
    confidence: float = 0.5         # an accuracy drop is judged by its one-sided upper bound at this confidence

    @classmethod
    def of(cls, cfg: QuantizeConfig) -> Budget:
        sizes = {"max_size_ratio": cfg.max_size_ratio, "max_latency_ratio": cfg.max_latency_ratio}
        if cfg.max_accuracy_drop is not None:
            return cls(f"{cfg.metric} drop", cfg.max_accuracy_drop, True, True, **sizes, fallback=True,
                       confidence=cfg.budget_confidence)
        if cfg.max_fidelity_loss is not None:
            return cls("fidelity loss", cfg.max_fidelity_loss, False, True, **sizes, fallback=True)
        return cls("fidelity loss", cfg.tolerance if cfg.tolerance is not None else TOLERANCE[cfg.mode], False, False,
                   **sizes, fallback=cfg.fallback)

    @staticmethod
    def check_flags(cfg: QuantizeConfig, data: dict) -> None:
        """The budget flags make sense together and with the data given (else a UsageError, exit 2)."""
        if cfg.max_accuracy_drop is not None:
            if not cfg.metric:
                raise UsageError("max_accuracy_drop (--max-accuracy-drop) needs a metric (metric / --metric, e.g. top1)")
            if data.get("eval") is None:
                raise UsageError("max_accuracy_drop (--max-accuracy-drop) needs labelled eval data "
                                 "(data.eval / --eval-data)")
        if cfg.max_accuracy_drop == 0 and cfg.budget_confidence > 0.5 and cfg.metric in CLASS_METRICS:
            # a right-or-wrong metric's bound is above 0 on any number of samples (drop_bound): the search could
            # only end in a refusal
            raise UsageError(f"max_accuracy_drop (--max-accuracy-drop) 0 cannot be held at budget_confidence "
                             f"(--budget-confidence) {cfg.budget_confidence:g}: no number of {cfg.metric} samples "
                             "bounds a drop at 0; give a budget above 0, or budget_confidence 0.5 to judge the "
                             "measured drop")
        if cfg.max_accuracy_drop is None and "budget_confidence" in cfg.model_fields_set:
            raise UsageError("budget_confidence (--budget-confidence) applies to max_accuracy_drop "
                             "(--max-accuracy-drop) only; give that budget or remove it")
        if cfg.max_accuracy_drop is not None and cfg.max_fidelity_loss is not None:
            raise UsageError("give one budget: max_accuracy_drop (--max-accuracy-drop) or max_fidelity_loss "
                             "(--max-fidelity-loss)")

    def check_rows(self, parent_rows, metric: str) -> None:
        """A bound from resampling the eval rows needs MIN_BOOTSTRAP_ROWS of them (else a UsageError, exit 2)."""
        if self.on_accuracy and self.confidence > 0.5 and parent_rows is not None and \
                parent_rows.n < MIN_BOOTSTRAP_ROWS:
            raise UsageError(f"max_accuracy_drop (--max-accuracy-drop) at budget_confidence (--budget-confidence) "
                             f"{self.confidence:g} bounds the {metric} drop by resampling the eval rows, which needs "
                             f"at least {MIN_BOOTSTRAP_ROWS} (the eval data has {parent_rows.n}): give more eval data, "
                             "or budget_confidence 0.5 to judge the measured drop")

    def loss(self, cand: Candidate) -> float:
        """What the budget bounds, for this candidate (inf when it could not be scored)."""
        if cand.error:
            return math.inf
        return cand.accuracy_drop if self.on_accuracy else cand.fidelity["loss"]

    def judged(self, cand: Candidate) -> float:
        """What meets() holds against the budget: an accuracy drop's upper confidence bound where the scoring
        gave one (Candidate.drop_bound), else the loss itself."""
        loss = self.loss(cand)
        if self.on_accuracy and cand.drop_bound is not None and np.isfinite(loss):
            return max(loss, cand.drop_bound)
        return loss

    def meets(self, cand: Candidate) -> bool:
        loss = self.judged(cand)
        return bool(np.isfinite(loss)) and loss <= self.value + 1e-12

    def drop_bound(self, parent_rows, rows, parent_sample, sample, lower_is_better: bool) -> float | None:
        """The one-sided upper bound, at self.confidence, of the metric's drop from the parent to a candidate on
        fresh rows of the same distribution: paired on the same rows, from the bootstrap of the two figures
        (a metric with no per-sample loss: spearman, pearson, f1; measure.textmetrics), else from the per-sample
        differences (mean + z * their standard error). None where neither is known (a metric of the user's own)
        or at confidence 0.5 (the measured drop is judged)."""
        if not self.on_accuracy or self.confidence <= 0.5:
            return None
        sign = -1.0 if lower_is_better else 1.0
        if parent_rows is not None and rows is not None and parent_rows.n == rows.n > 1:
            d = sign * (parent_rows.resampled() - rows.resampled())
            d = d[np.isfinite(d)]
            return float(np.percentile(d, 100 * self.confidence)) if len(d) else None
        if parent_sample is not None and sample is not None and len(parent_sample) == len(sample) > 0:
            a, b = np.asarray(parent_sample, np.float64), np.asarray(sample, np.float64)
            d = sign * (a - b)
            if not np.all(np.isfinite(d)):
                return None
            n = len(d)
            var = d.var(ddof=1) if n > 1 else 0.0
            if np.isin(np.abs(a), (0, 1)).all() and np.isin(np.abs(b), (0, 1)).all():
                # a right-or-wrong metric (top-1): no disagreement seen on n samples is no proof of none on fresh
                # data (the normal bound would be 0 on any n, even 1): the variance is at least that of one
                # disagreement in n + 1 samples
                var = max(var, n / (n + 1) ** 2)
            z = NormalDist().inv_cdf(self.confidence)
            return float(d.mean() + z * math.sqrt(var / n))
        return None

    def fits_size(self, cand: Candidate) -> bool:
        return self.max_size_ratio is None or cand.ratio <= self.max_size_ratio + 1e-12

    def fits(self, cand: Candidate) -> bool:
        """Every budget but latency (which is only known once the candidates that fit are timed)."""
        return cand.passed and self.fits_size(cand)

    def too_slow(self, cand: Candidate) -> bool:
        """Slower than max_latency_ratio beyond the timing noise: the whole 95% interval lies above it (a fixed
        cut inside the noise would flip between runs). Untimed: not judged."""
        if cand.latency_ratio is None or self.max_latency_ratio is None:
            return False
        return cand.latency_ratio_ci95[0] > self.max_latency_ratio

    def pick(self, pool: list[Candidate]) -> Candidate:
        """The candidate to keep, of those that meet every budget, in this order of what counts:
        1. faster beyond the noise: those no other candidate beats (no other's 95% interval of the latency ratio
           lies wholly below theirs, by more than SAME_SPEED) tie for fastest (untimed: all tie);
        2. a file smaller by more than SMALLER: of those, the ones within that margin of the smallest;
        3. more accurate beyond the accuracy figure's own noise (`more_accurate`, a paired test on the same check
           samples): of those, the ones no other beats;
        4. then standard ONNX ops over onnxruntime's fused contrib ops (a file more runtimes run: a fused candidate
           is kept only where it is faster), then the smallest file (then the first built).
        A cosine or top-1 difference inside its noise never buys a larger file."""
        timed = [c for c in pool if c.latency_ratio is not None]

        def interval(c: Candidate) -> tuple[float, float]:
            return tuple(c.latency_ratio_ci95) if c.latency_ratio_ci95 else (c.latency_ratio, c.latency_ratio)

        def beats(d: Candidate, c: Candidate) -> bool:
            return interval(d)[1] < interval(c)[0] and d.latency_ratio * (1 + SAME_SPEED) < c.latency_ratio

        fastest = [c for c in timed if not any(beats(d, c) for d in timed)] if timed else list(pool)
        smallest = min(c.bytes for c in fastest)
        small = [c for c in fastest if c.bytes * (1 - SMALLER) <= smallest]
        accurate = [c for c in small if not any(self.more_accurate(d, c) for d in small)]
        return min(accurate, key=lambda c: (bool(c.settings.fused), c.bytes, c.index))

    def more_accurate(self, a: Candidate, b: Candidate) -> bool:
        """`a` is more accurate than `b` beyond the noise of the figure the budget bounds: on the same check
        samples, the mean per-sample difference of their losses (Candidate.sample_loss: the metric per sample,
        or 1 - the sample's cosine to the parent) lies below zero by more than its 95% interval (a paired test;
        for top-1 this is McNemar's on the samples where they disagree). A metric with no per-sample loss (f1,
        spearman, pearson: measure.textmetrics): the 95% interval of the difference of their figures from a paired
        bootstrap over the check rows (fixed seed) lies above zero. Without either (a metric of the user's own):
        the figures themselves, compared as they are."""
        if self.on_accuracy and a.rows is not None and b.rows is not None and a.rows.n == b.rows.n > 1:
            lo, _ = paired_bootstrap(a.rows, b.rows)
            return bool(lo > 0)
        la, lb = a.sample_loss, b.sample_loss
        if la is not None and lb is not None and len(la) == len(lb) and len(la) > 1:
            d = np.asarray(la, dtype=np.float64) - np.asarray(lb, dtype=np.float64)
            if not np.all(np.isfinite(d)):
                return bool(np.all(np.isfinite(la)) and not np.all(np.isfinite(lb)))
            return float(d.mean()) < -1.96 * float(d.std(ddof=1)) / math.sqrt(len(d))
        fa, fb = self.loss(a), self.loss(b)
        return fa is not None and fb is not None and fa < fb - 1e-12

    def margin(self, cand: Candidate) -> float:
        """How far inside the budget (negative: past it), as meets() judges it."""
        return self.value - self.judged(cand)

    def score(self, cand: Candidate) -> float:
        """Higher is better: the candidate closest to the parent."""
        loss = self.loss(cand)
        return -loss if np.isfinite(loss) else -np.inf

    def hopeless(self, cand: Candidate) -> bool:
        """Screened on a subset: past the budget by more than sampling noise could explain."""
        loss = self.loss(cand)
        if not np.isfinite(loss):
            return True
        if self.on_accuracy:
            return loss > self.value + 3 * math.sqrt(0.25 / max(cand.checked_on, 1))
        return loss > SCREEN_MARGIN * self.value

    def noise(self, n: int, parent_accuracy: float | None) -> float:
        """The 95% sampling noise of an accuracy drop judged on n samples (0 for a fidelity loss)."""
        if not self.on_accuracy or parent_accuracy is None:
            return 0.0
        p = min(max(parent_accuracy, 0.0), 1.0)
        return 1.96 * math.sqrt(max(p * (1 - p), 1e-4) * 2 / n)   # a difference of two proportions

    def __str__(self) -> str:
        bound = (f" (its one-sided {self.confidence:.0%} upper bound)" if self.on_accuracy and self.confidence > 0.5
                 else "")
        return f"{self.kind}{bound} <= {self.value:g}"
