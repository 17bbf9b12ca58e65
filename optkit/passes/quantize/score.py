"""Screening and scoring a built candidate against the parent (prepare.Reference), judged by the Budget.

Cheap first (with the latency search): a candidate is screened on a subset of the check data; one whose loss
there is past what sampling noise could explain is screened out, and one that runs CLEARLY_SLOWER times slower
than a candidate that already met every budget cannot be chosen, so neither is scored further. The others are
scored on the whole check set, which decides whether they meet the budget.
"""
from __future__ import annotations

import time

import numpy as np

from optkit.core.artifact import Artifact
from optkit.core.batching import first_call, fixed_batch
from optkit.core.errors import PassError, UsageError
from optkit.core.text import first_line
from optkit.measure.accuracy import metric_rows, per_sample
from optkit.onnx import session as onnx_session
from optkit.passes.quantize import ops as qops
from optkit.passes.quantize.budget import Budget
from optkit.passes.quantize.candidates import Candidate
from optkit.passes.quantize.config import LOWER_IS_BETTER, QuantizeConfig
from optkit.passes.quantize.prepare import SCORE_THREADS, Reference
from optkit.runtimes.base import Session
from optkit.runtimes.openvino import OpenVINOSession

CLEARLY_SLOWER = 1.5      # screening: this much slower than a candidate that met the budgets cannot be chosen
CONFIRM_CALLS = 3         # interleaved calls of each model that confirm a clearly slower screening run


class Scorer:
    """`check(cand, done)` is the whole of it: open the candidate, screen it (`screen`), score it (`score`).
    `speed_matters`: a clearly slower candidate may be dropped at screening (static/dynamic INT8 for the CPU,
    timed)."""

    def __init__(self, ref: Reference, budget: Budget, cfg: QuantizeConfig, speed_matters: bool = False):
        self.ref, self.budget, self.cfg, self.speed_matters = ref, budget, cfg, speed_matters

    def check(self, cand: Candidate, done: list[Candidate]) -> None:
        """The candidate's figures against the parent's outputs (a subset first in the latency search), and
        whether it meets the budget; `done`: the candidates so far (a clearly faster one that passed stops it)."""
        try:
            sess = open_candidate(cand.path, self.cfg.runtime)
        except UsageError as e:
            cand.error = e.message
            return
        if self.screen(cand, sess, done):
            self.score(cand, sess)

    def screen(self, cand: Candidate, sess, done: list[Candidate]) -> bool:
        """Screen on a subset (latency search only): False when the candidate is out (cand.screened_out: past
        its budget beyond the noise; cand.slower_than: clearly slower than one in `done` that passed), True
        when it goes on to be scored on the whole set."""
        screen = self.screen_size(self.ref.samples)
        if not (self.cfg.latency_search and screen):
            return True
        start = time.perf_counter()
        self.score_on(cand, sess, screen)
        cand.screen_s = time.perf_counter() - start
        if not cand.error and self.budget.hopeless(cand):
            cand.screened_out = True
            return False
        winner = None if cand.error else self.clearly_faster_winner(cand, sess, done)
        if winner is not None:
            cand.slower_than = winner.index
            return False
        return True

    def score(self, cand: Candidate, sess) -> None:
        """Score on the whole check set; cand.passed says whether it meets the budget."""
        self.score_on(cand, sess, self.ref.samples)
        cand.passed = self.budget.meets(cand)

    def screen_size(self, n: int) -> int:
        """How many of the n check samples a candidate is screened on first (0: none). A fidelity loss past
        twice its budget shows on a quarter of the set (8 samples at least: a conv-heavy model's dynamic INT8 on
        32 synthesized inputs is refused after 8 each); an accuracy drop's noise margin is only useful on
        screen_samples, on a set at least twice that."""
        quarter = n if self.budget.on_accuracy else max(8, n // 4)
        screen = min(self.cfg.screen_samples, quarter)
        return screen if 2 * screen <= n else 0

    def clearly_faster_winner(self, cand: Candidate, sess, done: list[Candidate]) -> Candidate | None:
        """A candidate of `done` that met every budget and runs the check data CLEARLY_SLOWER times faster than
        `cand`: then `cand` cannot be chosen and is not scored on the whole set (nor timed). Its screening run
        gives the first hint; interleaved repeats of one call of each confirm it (one run on a shared machine can
        be slow)."""
        if not self.speed_matters or cand.screen_s is None:
            return None
        passed = [c for c in done if c.passed and c.screen_s is not None and self.budget.fits(c)]
        if not passed:
            return None
        best = min(passed, key=lambda c: c.screen_s)
        if cand.screen_s < CLEARLY_SLOWER * best.screen_s:
            return None
        feeds = first_call(self.ref.specs, self.ref.check_feeds, fixed_batch(self.ref.specs) or 8)
        mine, theirs = [], []
        try:
            other = open_candidate(best.path, self.cfg.runtime)
            for _ in range(CONFIRM_CALLS):
                mine.append(_call_seconds(sess, feeds))
                theirs.append(_call_seconds(other, feeds))
        except Exception:  # noqa: BLE001 - no verdict on speed: it is scored like any other
            return None
        return best if min(mine) >= CLEARLY_SLOWER * min(theirs) else None

    def score_on(self, cand: Candidate, sess, n: int) -> None:
        """The candidate's fidelity (and accuracy, with a metric) on the first n check samples."""
        ref = self.ref  # the whole set as bound: text data is then batched by length (core.batching)
        feeds = ref.check_feeds if n == ref.samples else {k: v[:n] for k, v in ref.check_feeds.items()}
        try:
            out = ref.run(sess, feeds)
        except UsageError as e:
            cand.error = e.message
            return
        except Exception as e:  # noqa: BLE001 - a candidate onnxruntime loads but cannot run
            cand.error = f"the quantized model does not run: {first_line(e)[:160]}"
            return
        parent = [r[:n] if np.ndim(r) else r for r in ref.parent_outputs]
        bad = _new_nonfinite(out, parent)
        if bad:  # NaN where the parent has a number is a failure: this candidate is refused, the search goes on
            cand.error = (f"the quantized model gives {bad} non-finite values (NaN or Inf) on the check data where "
                          "the input model gives numbers")
            return
        mask = ref.mask.first(n) if ref.mask is not None else None
        cand.fidelity = qops.fidelity(parent, out, ref.out_names, mask=mask, only=ref.checked)
        cand.checked_on = n
        labels = ref.labels[:n] if ref.labels is not None else None
        if self.cfg.metric:
            try:
                cand.accuracy = ref.accuracy(out, labels)
            except PassError as e:  # a figure that is not a number (constant embeddings: no Spearman)
                cand.error = e.message
                return
            base = ref.parent_accuracy if n == ref.samples else ref.accuracy(parent, labels)
            cand.accuracy_drop = (cand.accuracy - base if self.cfg.metric in LOWER_IS_BETTER
                                  else base - cand.accuracy)
        cand.sample_loss = self.sample_loss(parent, out, labels, mask)
        cand.rows = metric_rows(self.cfg.metric, out, labels) if self.cfg.metric else None
        if self.cfg.metric and n == ref.samples:  # the budget holds on fresh data with the stated confidence
            lower = self.cfg.metric in LOWER_IS_BETTER
            mine = None if cand.sample_loss is None else (cand.sample_loss if lower else -cand.sample_loss)
            cand.drop_bound = self.budget.drop_bound(ref.parent_rows, cand.rows, ref.parent_sample, mine, lower)

    def sample_loss(self, parent: list, out: list, labels, mask) -> np.ndarray | None:
        """Per sample, what the budget bounds (lower is better): the metric of each sample, or one minus its
        cosine to the parent. For Budget.more_accurate's paired test."""
        if self.budget.on_accuracy:
            per = per_sample(self.cfg.metric, out, labels)
            return None if per is None else (per if self.cfg.metric in LOWER_IS_BETTER else -per)
        cos = qops.sample_cosines(parent, out, self.ref.out_names, mask, self.ref.checked)
        return None if cos is None else 1.0 - cos


def _new_nonfinite(out: list, parent: list) -> int:
    """How many values of the candidate's outputs are NaN or Inf where the parent's are finite (a parent's NaN
    is the data's: padding that hides a whole row is judged by the fidelity check, naming the data)."""
    bad = 0
    for o, p in zip(out, parent):
        if not (isinstance(o, np.ndarray) and o.dtype.kind in "fc"):
            continue
        wrong = ~np.isfinite(o)
        if isinstance(p, np.ndarray) and p.shape == o.shape and p.dtype.kind in "fc":
            wrong &= np.isfinite(p)
        bad += int(np.count_nonzero(wrong))
    return bad


def _call_seconds(sess, feeds: dict) -> float:
    """One call's seconds: the screening's in-process confirmation on two open sessions (not a latency figure;
    results are timed by measure.paired)."""
    start = time.perf_counter()
    sess.run(feeds) if isinstance(sess, Session) else sess.run(None, feeds)
    return time.perf_counter() - start


def open_candidate(path, runtime: str):
    """A candidate's session on the runtime it is judged on: onnxruntime's own, or an OpenVINO Session."""
    if runtime == "openvino":
        return OpenVINOSession(Artifact.load(str(path)), threads=SCORE_THREADS)
    return onnx_session.session(path, threads=SCORE_THREADS)
