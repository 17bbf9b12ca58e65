"""The quantize search's Budget: one object answers whether a candidate meets the budget, by what margin, how
candidates rank, when a subset shows one hopeless, and how noisy a subset's verdict is."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from optkit.onnx import session as onnx_session
from optkit.passes.quantize.budget import Budget
from optkit.passes.quantize.candidates import Candidate, Settings
from optkit.passes.quantize.config import TOLERANCE, QuantizeConfig
from optkit.passes.quantize.prepare import Reference
from optkit.passes.quantize.score import Scorer
from optkit.passes.quantize.search import CLEARLY_SLOWER


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
    assert str(b) == "top1 drop (its one-sided 95% upper bound) <= 0.01"
    # judged by the bound where the scoring gave one: within the budget by its point only is not enough
    held = _cand(drop=0.004)
    held.drop_bound = 0.012
    assert not b.meets(held) and b.margin(held) == pytest.approx(-0.002)


def test_fidelity_budgets():
    explicit = Budget.of(QuantizeConfig(mode="dynamic", max_fidelity_loss=0.02))
    assert (explicit.kind, explicit.value, explicit.on_accuracy, explicit.explicit) == ("fidelity loss", 0.02, False, True)
    assert explicit.meets(_cand(loss=0.02)) and not explicit.meets(_cand(loss=float("nan")))
    assert explicit.hopeless(_cand(loss=0.05)) and not explicit.hopeless(_cand(loss=0.03))
    assert explicit.noise(100, 0.9) == 0.0
    default = Budget.of(QuantizeConfig(mode="static"))
    assert default.value == TOLERANCE["static"] and not default.explicit


def _timed(index, *, ratio, ci, drop=None, loss=0.001, size=1000, per_sample=None) -> Candidate:
    c = Candidate(index=index, settings=Settings(), path=Path(f"c{index}.onnx"), bytes=size, accuracy_drop=drop,
                  latency_ratio=ratio, latency_ratio_ci95=list(ci), passed=True)
    c.fidelity = {"loss": loss}
    c.sample_loss = None if per_sample is None else np.asarray(per_sample, dtype=float)
    return c


def _wrong(n_wrong: int, n: int = 200, offset: int = 0) -> np.ndarray:
    """Per-sample top-1 loss (-1 right, 0 wrong) with n_wrong wrong answers from `offset` on."""
    loss = -np.ones(n)
    loss[offset:offset + n_wrong] = 0
    return loss


def test_pick_order_speed_then_size_then_accuracy_beyond_its_noise():
    """Faster beyond the noise first; then a file smaller by more than 10%; then more accurate beyond the
    paired noise of the same samples; then smaller. A difference inside its noise never buys a larger file."""
    b = Budget.of(QuantizeConfig(mode="static", metric="top1", max_accuracy_drop=0.01))
    tie = {"ratio": 0.50, "ci": (0.47, 0.53)}
    # the transformer case: the same speed, a cosine gain of 0.0002 for a file 2.5x larger - the small file wins
    f = Budget.of(QuantizeConfig(mode="dynamic"))
    rng = np.random.default_rng(0)
    base = rng.uniform(0.006, 0.010, 39)
    tables_int8 = _timed(0, **tie, loss=0.00831, size=251, per_sample=base + rng.normal(0, 0.002, 39))
    tables_float = _timed(1, **tie, loss=0.00807, size=647, per_sample=base + rng.normal(0, 0.002, 39) - 0.0002)
    assert f.pick([tables_float, tables_int8]) is tables_int8
    # a clearly faster candidate wins whatever its size and accuracy (it met the budget)
    clearly_faster = _timed(2, ratio=0.40, ci=(0.38, 0.42), loss=0.009, size=900)
    assert f.pick([tables_float, tables_int8, clearly_faster]) is clearly_faster
    # within 10% of the size: more accurate beyond the paired noise wins (8 more wrong of 200, all one way)
    lossy = _timed(0, **tie, drop=0.0044, size=1000, per_sample=_wrong(10))
    exact = _timed(1, **tie, drop=0.0, size=1050, per_sample=_wrong(2))
    assert b.pick([lossy, exact]) is exact
    # ... but 1 answer of 200 is inside the noise: the smaller file
    near = _timed(2, **tie, drop=0.0, size=1080, per_sample=_wrong(9))
    assert b.pick([lossy, near]) is lossy
    # as many wrong, on different samples: a wash
    swapped = _timed(3, **tie, drop=0.0, size=1020, per_sample=_wrong(10, offset=100))
    assert b.pick([swapped, lossy]) is lossy
    # more than 10% larger: size first, even for a real accuracy gain inside the budget
    exact_big = _timed(4, **tie, drop=0.0, size=1200, per_sample=_wrong(2))
    assert b.pick([lossy, exact_big]) is lossy
    # onnxruntime's fused ops only where they are faster: a tie goes to standard ONNX ops, even a bit larger
    fused = _timed(5, **tie, drop=0.0, size=990, per_sample=_wrong(10))
    fused.settings = Settings(fused=True)
    assert b.pick([fused, lossy]) is lossy
    # untimed (no latency search): the same order without the speed step - the smallest file here
    untimed = [Candidate(index=i, settings=Settings(), path=Path("c.onnx"), bytes=n) for i, n in ((0, 30), (1, 20))]
    for c in untimed:
        c.fidelity = {"loss": 0.001}
    assert b.pick(untimed).index == 1


def test_more_accurate_is_a_paired_test():
    b = Budget.of(QuantizeConfig(mode="dynamic"))
    a = _timed(0, ratio=1, ci=(1, 1), per_sample=[0.001] * 50)
    c = _timed(1, ratio=1, ci=(1, 1), per_sample=[0.002] * 50)
    assert b.more_accurate(a, c) and not b.more_accurate(c, a)   # every sample better: no noise to doubt it
    assert not b.more_accurate(a, a)
    nan = _timed(2, ratio=1, ci=(1, 1), per_sample=[0.001] * 49 + [float("nan")])
    assert b.more_accurate(a, nan) and not b.more_accurate(nan, a)
    # no per-sample figures (a metric of the user's own): the figures as they are
    assert b.more_accurate(_timed(3, ratio=1, ci=(1, 1), loss=1e-4), _timed(4, ratio=1, ci=(1, 1), loss=1e-3))


def test_size_and_latency_budgets_are_judged_in_one_place():
    b = Budget.of(QuantizeConfig(mode="static", max_size_ratio=0.3, max_latency_ratio=1.05))
    fits = _timed(0, ratio=1.0, ci=(0.95, 1.08), size=10)
    fits.ratio = 0.29
    big = _timed(1, ratio=0.5, ci=(0.45, 0.55))
    big.ratio = 0.31
    assert b.fits(fits) and not b.fits(big) and not b.too_slow(fits)
    assert b.too_slow(_timed(2, ratio=1.2, ci=(1.1, 1.3)))
    assert not b.fallback and Budget.of(QuantizeConfig(mode="static", max_fidelity_loss=0.1)).fallback


def _matmuls(path: Path, k: int) -> Path:
    """x[n,64] -> k chained 64x64 MatMuls -> y: the cost grows with k."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.eye(64, dtype=np.float32), "w")
    names = ["x"] + [f"h{i}" for i in range(k - 1)] + ["y"]
    nodes = [helper.make_node("MatMul", [names[i], "w"], [names[i + 1]]) for i in range(k)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_clearly_slower_candidate_is_not_scored_further(tmp_path):
    """Screening: once a candidate met every budget, one whose screening run was CLEARLY_SLOWER times slower,
    confirmed by interleaved repeats, cannot be chosen; one of about the same speed is scored on."""
    import numpy as np

    fast, slow = _matmuls(tmp_path / "fast.onnx", 2), _matmuls(tmp_path / "slow.onnx", 400)
    cfg = QuantizeConfig(mode="static")
    ref = Reference.of(fast, {"x": np.ones((256, 64), np.float32)})
    scorer = Scorer(ref, Budget.of(cfg), cfg, speed_matters=True)
    winner = Candidate(index=0, settings=Settings(), path=fast, passed=True, screen_s=0.001)
    done = [winner]
    slower = Candidate(index=1, settings=Settings(), path=slow, screen_s=0.001 * CLEARLY_SLOWER * 10)
    assert scorer.clearly_faster_winner(slower, onnx_session.session(slow), done) is winner
    # the screening run looked slow, but the repeats show the same speed: scored on
    twin = Candidate(index=2, settings=Settings(), path=fast, screen_s=0.001 * CLEARLY_SLOWER * 10)
    assert scorer.clearly_faster_winner(twin, onnx_session.session(fast), done) is None
    # nothing met the budgets yet: no verdict on speed
    winner.passed = False
    assert scorer.clearly_faster_winner(slower, onnx_session.session(slow), done) is None


def test_a_runoff_times_the_pick_against_the_fastest_head_to_head(tmp_path):
    """Two candidates a few % apart often share an interval in the race against the parent; timed against each
    other the difference shows (timing.runoff): a model with 8x the MatMuls is slower beyond its interval, a
    copy of the same model is not."""
    import numpy as np

    from optkit.passes.quantize.timing import runoff

    fast, slow = _matmuls(tmp_path / "fast.onnx", 4), _matmuls(tmp_path / "slow.onnx", 32)
    specs = Reference.of(fast, {"x": np.ones((1, 64), np.float32)}).specs
    feeds = {"x": np.ones((4, 64), np.float32)}
    notes: list[str] = []
    a = Candidate(index=0, settings=Settings(), path=fast)
    ratio, lo, hi = runoff(a, Candidate(index=1, settings=Settings(), path=slow), specs, feeds, notes.append)
    assert lo > 1.5 and lo <= ratio <= hi, (ratio, lo, hi)
    ratio, lo, hi = runoff(a, Candidate(index=2, settings=Settings(), path=fast), specs, feeds, notes.append)
    assert lo < 1.2 and hi > 0.8 and not notes, (ratio, lo, hi, notes)


def test_the_runoff_drops_a_pick_slower_head_to_head_and_picks_again():
    """Chooser.pick_after_runoffs: the pick (the smaller file, tied with the fastest inside the race's noise) is
    timed head to head against the fastest; slower beyond its interval and SAME_SPEED, it leaves the pool (a note
    and settings["runoffs"] say so); inside the noise, or with the race untimed, the pick stands."""
    from optkit.core.registry import PassContext
    from optkit.passes.quantize.choose import Chooser

    cfg = QuantizeConfig(mode="dynamic")

    def pool():
        small = _timed(0, ratio=0.52, ci=(0.47, 0.57), size=500)   # smaller by > 10%: Budget.pick keeps it
        fast = _timed(1, ratio=0.50, ci=(0.46, 0.54), size=1000)
        return small, fast

    for race, kept in (((1.07, 1.05, 1.09), 1), ((1.02, 0.99, 1.05), 0), (None, 0), ((1.02, 1.01, 1.03), 0)):
        small, fast = pool()
        ctx, settings, raced = PassContext(output=Path("o.onnx")), {}, []
        chooser = Chooser(cfg, Budget.of(cfg), ctx, [small, fast])

        def timed(a, b, race=race):
            raced.append((a.index, b.index))
            return race

        chosen = chooser.pick_after_runoffs([small, fast], timed, settings)
        assert chosen.index == kept and chosen.chosen and raced == [(1, 0)]
        assert ("runoffs" in settings) == (race is not None)
        if kept == 1:
            assert not small.chosen and settings["runoffs"][0]["slower"]
            assert any("run-off" in n and "1.07x" in n for n in ctx.notes)
        else:
            assert not any("run-off" in n for n in ctx.notes)
