"""Paired latency: an unchanged model is "no significant change", never a speed-up or slow-down from noise."""
from __future__ import annotations

import shutil

from optkit.core.artifact import Artifact
from optkit.measure.model import MeasureSettings
from optkit.measure.paired import describe, paired_latency
from optkit.measure.trials import ratio_ci95


def test_an_unchanged_model_is_no_significant_change(samples, tmp_path):
    copy = tmp_path / "copy.onnx"
    shutil.copy(samples / "torch_cnn.onnx", copy)
    result = paired_latency(Artifact.load(str(samples / "torch_cnn.onnx")), Artifact.load(str(copy)),
                            MeasureSettings(runs=100, threads=1), trials=5)
    assert 0.9 < result["ratio"] < 1.1 and not result["significant"], result
    assert describe(result).startswith("no significant change")
    assert result["before"]["p50_ms"] > 0 and result["after"]["p50_ms"] > 0 and len(result["trial_ratios"]) == 5


def test_ratio_interval_separates_noise_from_a_real_slowdown():
    """The quantize slower-check refuses only when the whole interval lies above its limit (1.05x)."""
    noisy = ratio_ci95([0.95, 1.20, 1.02, 1.15, 0.98])  # a tiny model timed at a few microseconds
    assert noisy[1] < 1.05 < noisy[2]
    slow = ratio_ci95([1.90, 2.05, 1.97, 2.01, 1.94])
    assert slow[1] > 1.05 and 1.9 < slow[0] < 2.05
    assert ratio_ci95([1.3]) == (1.3, 1.3, 1.3)
