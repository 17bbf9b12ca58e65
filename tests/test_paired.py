"""Paired latency: an unchanged model is "no significant change", never a speed-up or slow-down from noise."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from optkit.core.artifact import Artifact
from optkit.measure.model import MeasureSettings
from optkit.measure.paired import describe, paired_latency
from optkit.measure.trials import ratio_ci95


def test_an_unchanged_model_is_no_significant_change(samples, tmp_path):
    copy = tmp_path / "copy.onnx"
    shutil.copy(samples / "torch_cnn.onnx", copy)
    result = paired_latency(Artifact.load(str(samples / "torch_cnn.onnx")), Artifact.load(str(copy)),
                            MeasureSettings(runs=100, threads=1), trials=5)
    assert not result["significant"], result  # however busy the machine: its noise widens the interval
    assert describe(result).startswith("no significant change")
    assert result["before"]["p50_ms"] > 0 and result["after"]["p50_ms"] > 0 and len(result["trial_ratios"]) == 5


def test_ratio_interval_separates_noise_from_a_real_slowdown():
    """The quantize slower-check refuses only when the whole interval lies above its limit (1.05x)."""
    noisy = ratio_ci95([0.95, 1.20, 1.02, 1.15, 0.98])  # a tiny model timed at a few microseconds
    assert noisy[1] < 1.05 < noisy[2]
    slow = ratio_ci95([1.90, 2.05, 1.97, 2.01, 1.94])
    assert slow[1] > 1.05 and 1.9 < slow[0] < 2.05
    assert ratio_ci95([1.3]) == (1.3, 1.3, 1.3)


def _mlp(path, layers: int, width: int = 512):
    """x [1, width] -> `layers` x MatMul(width x width): the time a call takes grows with `layers`."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((width, width)) / width).astype(np.float32), f"w{i}")
             for i in range(layers)]
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i - 1}", f"w{i}"],
                              ["y" if i == layers - 1 else f"h{i}"]) for i in range(layers)]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return Artifact.load(str(path))


def test_paired_latencies_times_n_children_and_drops_a_clearly_slower_one(tmp_path):
    """One parent, three children in one process: the same model (same within the noise), a 4x lighter one
    (faster, kept to the end) and an 8x heavier one (dropped by the race once its interval clears the best's)."""
    from optkit.measure.paired import paired_latencies

    parent = _mlp(tmp_path / "parent.onnx", 4)
    same, fast, slow = (_mlp(tmp_path / f"{n}.onnx", k) for n, k in (("same", 4), ("fast", 1), ("slow", 32)))
    res = paired_latencies(parent, [same, fast, slow], MeasureSettings(runs=200, warmup=5, threads=1), trials=8,
                           limit_s=8)
    assert len(res) == 3
    r_same, r_fast, r_slow = res
    assert r_slow["dropped_after"] in (3, 5) and r_slow["trials"] == r_slow["dropped_after"], r_slow
    assert r_slow["ratio"] > 2 and r_slow["significant"]
    assert "dropped_after" not in r_fast and r_fast["trials"] == 8 and r_fast["ratio"] < 0.7 and r_fast["significant"]
    assert r_fast["ratio_ci95"][1] < r_slow["ratio_ci95"][0]
    assert 0.7 < r_same["ratio"] < 1.4
    for r in res:
        assert len(r["trial_ratios"]) == r["trials"] and r["before"]["p50_ms"] > 0 and r["after"]["p50_ms"] > 0
    # without the race every child is timed in every trial
    plain = paired_latencies(parent, [fast, slow], MeasureSettings(runs=50, warmup=2, threads=1), trials=4,
                             limit_s=4, race=False)
    assert [r["trials"] for r in plain] == [4, 4] and not any("dropped_after" in r for r in plain)


def test_throughput_is_the_models_not_a_scheduler_stall():
    """Five trials of 50 calls of a 15 us model; a 4 ms preemption lands in three of them (a busy 2-CPU machine):
    the all-calls mean triples, the throughput stays the model's, and the percentiles still show the stalls."""
    from optkit.measure.latency import summarize

    rng = np.random.default_rng(0)
    trials = [list(15e-6 * (1 + 0.05 * rng.random(50))) for _ in range(5)]
    quiet = summarize(trials)
    for t in trials[:3]:
        t[7] = 4e-3
    busy = summarize(trials)
    assert busy["mean_ms"] > 2 * quiet["mean_ms"]
    assert busy["throughput_per_s"] == pytest.approx(quiet["throughput_per_s"], rel=0.01)
    assert busy["max_ms"] == pytest.approx(4.0)
    lo, hi = busy["ci95"]["throughput_per_s"]
    assert lo <= busy["throughput_per_s"] and (hi is None or busy["throughput_per_s"] <= hi)
    one = summarize([trials[0]], batch=4)                      # one trial (bench): the same rule
    assert one["throughput_per_s"] == pytest.approx(4e3 / (np.mean(sorted(trials[0])[:-1]) * 1e3))


def test_a_rate_band_under_load_never_reaches_zero():
    """A stall that stops every request for most of a run (a busy CI machine) makes the throughput's band wide,
    never 0 or below: the band is the inverse of the time per sample's interval; its upper end is unbounded
    (None) when that interval reaches 0; steady calls give a tight band around the figure."""
    from optkit.measure.concurrency import throughput_band

    steady = np.arange(1, 101) * 1e-3
    lo, hi = throughput_band(steady, 0.1, 1)
    assert lo == pytest.approx(1000, rel=0.01) and hi == pytest.approx(1000, rel=0.01)
    stalled = np.concatenate([np.arange(1, 51) * 1e-3, 2.0 + np.arange(1, 51) * 1e-3])
    lo, hi = throughput_band(stalled, 2.05, 1)
    assert 0 < lo <= 100 / 2.05 and hi is None
    assert throughput_band(np.arange(1, 10) * 1e-3, 0.01, 1) == [None, None]       # under 10 calls
    lo, hi = throughput_band(stalled, 2.05, 4)                                       # batch scales the rate
    assert 0 < lo <= 400 / 2.05


def test_a_tune_confirmation_band_of_a_noisy_rate_stays_above_zero():
    from optkit.passes.tune.result import _confirmed

    runs = [{"throughput_per_s": v} for v in (30000.0, 10000.0, 50000.0)]      # three rounds on a busy machine
    c = _confirmed({"number": 0}, runs, "throughput_per_s")["confirmed"]
    lo, hi = c["ci95"]
    assert c["mean"] == pytest.approx(30000) and 0 < lo < 10000 and hi > 50000
    steady = _confirmed({"number": 0}, [{"p50_ms": v} for v in (1.0, 1.01, 0.99)], "p50_ms")["confirmed"]
    assert steady["ci95"][0] == pytest.approx(0.97, abs=0.01) and steady["ci95"][1] == pytest.approx(1.03, abs=0.01)
