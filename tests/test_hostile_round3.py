"""Hostile input, round 3: files optkit writes without being asked by name, the network, memory figures, data
layouts and the smaller leaks (names reaching the terminal, guessed scalars, late refusals). Each case asserts
the exit code, the one-line message and the file system afterwards. (Tune, profile and gates have their own
modules: test_hostile_tune.py, test_hostile_profile.py, test_hostile_gates.py.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, one_error_line
from test_hostile import CALIB, CNN, refused, snapshot, work  # noqa: F401 - `work` is a fixture

# a latency limit no int8 model can meet: the result is refused and kept aside as OUT.REJECTED.onnx
REFUSED = ["--mode", "static", "--calibration-data", CALIB, "--no-latency-search", "--max-latency-ratio", "0.01"]


# ------------------------------------------------------------------ 1. the kept-aside file is guarded too

def test_refused_quantize_never_overwrites_its_input(cli, work):
    (work / "m.REJECTED.onnx").write_bytes((work / CNN).read_bytes())
    refused(cli, work, "quantize", "m.REJECTED.onnx", "-o", "m.onnx", *REFUSED,
            message="m.REJECTED.onnx is also an input of this command")


def test_refused_quantize_never_replaces_a_file_optkit_did_not_write(cli, work):
    (work / "q.REJECTED.onnx").write_bytes(b"the user's own notes")
    refused(cli, work, "quantize", CNN, "-o", "q.onnx", *REFUSED,
            message="q.REJECTED.onnx, which exists and was not written by optkit")


def test_refused_quantize_replaces_only_its_own_kept_aside_model(cli, work):
    import onnx

    for _ in range(2):  # the second run may replace what the first kept aside: optkit marked it as its own
        r = cli("quantize", CNN, "-o", "q.onnx", *REFUSED, cwd=work)
        assert r.rc == 3, r.err
        assert "kept as q.REJECTED.onnx" in one_error_line(r)
    assert not (work / "q.onnx").exists()
    kept = onnx.load(str(work / "q.REJECTED.onnx"))
    assert any(p.key == "optkit.rejected" for p in kept.metadata_props)


def test_keep_rejected_checks_at_write_time(tmp_path, samples):
    """The budget and --fallback paths write through the same guard, even when the file appeared mid-run."""
    from optkit.core.errors import UsageError
    from optkit.passes.quantize.candidates import Candidate, Settings, keep_rejected

    foreign = tmp_path / "q.REJECTED.onnx"
    foreign.write_bytes(b"not ours")
    cand = Candidate(index=0, settings=Settings(), path=samples / CNN)
    with pytest.raises(UsageError, match="was not written by optkit"):
        keep_rejected(cand, tmp_path / "q.onnx", "missed the budget")
    assert foreign.read_bytes() == b"not ours"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.REJECTED.onnx"]


# ------------------------------------------------------------------ 10. nothing sent, nothing left in $TMPDIR

def _isolated_env(tmp_path: Path) -> dict:
    """A fresh TMPDIR and HOME, so anything a library drops there is seen."""
    env = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    (tmp_path / "tmp").mkdir()
    (tmp_path / "home").mkdir()
    return {**env, "TMPDIR": str(tmp_path / "tmp"), "HOME": str(tmp_path / "home"), "COLUMNS": "200"}


def test_onnxruntime_telemetry_is_off(tmp_path, samples):
    env = _isolated_env(tmp_path)
    r = subprocess.run([sys.executable, "-m", "optkit", "bench", str(samples / CNN), "--runs", "5"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert list((tmp_path / "tmp").iterdir()) == []  # onnxruntime's telemetry writes $TMPDIR/.ses
    assert not (tmp_path / "home" / ".cache" / "Microsoft").exists()  # ... and a device id here


def test_python_api_turns_telemetry_off_before_onnxruntime_loads(tmp_path):
    env = _isolated_env(tmp_path)
    code = "import optkit, os, onnxruntime; print(os.environ['ORT_DISABLE_TELEMETRY'])"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr
    assert list((tmp_path / "tmp").iterdir()) == []


# ------------------------------------------------------------------ 9. memory figures are the model's own

def test_tflite_memory_is_the_model_not_tensorflow(cli, samples):
    r = cli("bench", str(samples / "keras_cnn.tflite"), "--runs", "20", "--json")
    assert r.rc == 0, r.err
    memory = json.loads(r.out)["stages"][0]["measurements"]["memory"]
    # a 93 KB model: TensorFlow's import (hundreds of MiB) is taken before the baseline
    assert memory["load_mb"] < 50, memory
    assert memory["peak_mb"] < 100, memory
