"""The quantize search's Budget: one object answers whether a candidate meets the budget, by what margin, how
candidates rank, when a subset shows one hopeless, and how noisy a subset's verdict is."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from optkit.passes.quantize.budget import Budget
from optkit.passes.quantize.candidates import Candidate, Settings
from optkit.passes.quantize.config import TOLERANCE, QuantizeConfig


def _cand(*, drop=None, loss=None, error=None, n=100) -> Candidate:
    c = Candidate(index=0, settings=Settings(), path=Path("c.onnx"), accuracy_drop=drop, checked_on=n, error=error)
    c.fidelity = None if loss is None else {"loss": loss}
    return c


def test_accuracy_budget():
    b = Budget.of(QuantizeConfig(mode="static", metric="top1", max_accuracy_drop=0.01))
    assert (b.kind, b.value, b.on_accuracy, b.explicit) == ("top1 drop", 0.01, True, True)
    assert b.meets(_cand(drop=0.01)) and not b.meets(_cand(drop=0.011))
    assert b.margin(_cand(drop=0.004)) == pytest.approx(0.006)
    assert b.score(_cand(drop=0.002)) > b.score(_cand(drop=0.004)) > b.score(_cand(error="does not run"))
    assert not b.meets(_cand(error="does not run"))
    # 50 samples: a 0.05 drop is inside what sampling could explain (0.01 + 3 * 0.0707), 0.3 is not
    assert not b.hopeless(_cand(drop=0.05, n=50)) and b.hopeless(_cand(drop=0.3, n=50))
    assert b.noise(500, 0.97) == pytest.approx(1.96 * math.sqrt(0.97 * 0.03 * 2 / 500))
    assert str(b) == "top1 drop <= 0.01"


def test_fidelity_budgets():
    explicit = Budget.of(QuantizeConfig(mode="dynamic", max_fidelity_loss=0.02))
    assert (explicit.kind, explicit.value, explicit.on_accuracy, explicit.explicit) == ("fidelity loss", 0.02, False, True)
    assert explicit.meets(_cand(loss=0.02)) and not explicit.meets(_cand(loss=float("nan")))
    assert explicit.hopeless(_cand(loss=0.05)) and not explicit.hopeless(_cand(loss=0.03))
    assert explicit.noise(100, 0.9) == 0.0
    default = Budget.of(QuantizeConfig(mode="static"))
    assert default.value == TOLERANCE["static"] and not default.explicit
