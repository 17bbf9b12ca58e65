"""Paired latency: an unchanged model is "no significant change", never a speed-up or slow-down from noise."""
from __future__ import annotations

import shutil

from optkit.core.artifact import Artifact
from optkit.measure.model import MeasureSettings
from optkit.measure.paired import describe, paired_latency


def test_an_unchanged_model_is_no_significant_change(samples, tmp_path):
    copy = tmp_path / "copy.onnx"
    shutil.copy(samples / "torch_cnn.onnx", copy)
    result = paired_latency(Artifact.load(str(samples / "torch_cnn.onnx")), Artifact.load(str(copy)),
                            MeasureSettings(runs=100, threads=1), trials=5)
    assert 0.9 < result["ratio"] < 1.1 and not result["significant"], result
    assert describe(result).startswith("no significant change")
    assert result["before"]["p50_ms"] > 0 and result["after"]["p50_ms"] > 0 and len(result["trial_ratios"]) == 5
