"""-v and --debug turn on optkit's logging (also in measurement children); without them stderr stays empty."""
from __future__ import annotations


def test_quiet_by_default(cli, samples, tmp_path):
    r = cli("simplify", samples / "torch_cnn.onnx", "-o", tmp_path / "s.onnx")
    assert r.rc == 0, r.err
    assert "optkit:" not in r.err


def test_verbose_logs_passes_and_measurements(cli, samples, tmp_path):
    r = cli("simplify", samples / "torch_cnn.onnx", "-o", tmp_path / "s.onnx", "-v")
    assert r.rc == 0, r.err
    assert "INFO optkit.pipeline.stage: pass simplify.onnx" in r.err
    assert "INFO optkit.measure.model: measuring" in r.err
    assert "DEBUG" not in r.err


def test_debug_logs_from_the_measurement_child(cli, samples):
    r = cli("--debug", "bench", samples / "torch_cnn.onnx", "--runs", "5")
    assert r.rc == 0, r.err
    assert "DEBUG optkit.runtimes.base: opening" in r.err  # logged inside the isolated child
