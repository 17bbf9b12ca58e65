"""The budget a quantize candidate is judged against, built once: an accuracy drop (with a metric) or a
fidelity loss (an explicit budget, or the mode's tolerance). The search asks it whether a candidate meets it,
by what margin, how it ranks, whether a subset already shows it hopeless, and how noisy a subset's verdict is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from optkit.passes.quantize.candidates import Candidate
from optkit.passes.quantize.config import TOLERANCE, QuantizeConfig

SCREEN_MARGIN = 2.0  # a candidate whose subset loss is over this many budgets is not scored on the full set


@dataclass(frozen=True)
class Budget:
    kind: str                       # "top1 drop", "fidelity loss"
    value: float
    on_accuracy: bool               # judged on the metric's drop, else on the fidelity loss
    explicit: bool                  # the user asked for it (a budget turns the float-node fallback on)

    @classmethod
    def of(cls, cfg: QuantizeConfig) -> Budget:
        if cfg.max_accuracy_drop is not None:
            return cls(f"{cfg.metric} drop", cfg.max_accuracy_drop, True, True)
        if cfg.max_fidelity_loss is not None:
            return cls("fidelity loss", cfg.max_fidelity_loss, False, True)
        return cls("fidelity loss", cfg.tolerance if cfg.tolerance is not None else TOLERANCE[cfg.mode], False, False)

    def loss(self, cand: Candidate) -> float:
        """What the budget bounds, for this candidate (inf when it could not be scored)."""
        if cand.error:
            return math.inf
        return cand.accuracy_drop if self.on_accuracy else cand.fidelity["loss"]

    def meets(self, cand: Candidate) -> bool:
        loss = self.loss(cand)
        return bool(np.isfinite(loss)) and loss <= self.value + 1e-12

    def margin(self, cand: Candidate) -> float:
        """How far inside the budget (negative: past it)."""
        return self.value - self.loss(cand)

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
        return f"{self.kind} <= {self.value:g}"
