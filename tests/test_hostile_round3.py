"""Hostile input, round 3: files optkit writes without being asked by name, the network, memory figures, data
layouts and the smaller leaks (names reaching the terminal, guessed scalars, late refusals). Each case asserts
the exit code, the one-line message and the file system afterwards. (Tune, profile and gates have their own
modules: test_hostile_tune.py, test_hostile_profile.py, test_hostile_gates.py.)
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from test_hostile import CALIB, CNN, refused

from conftest import ROOT, one_error_line


@pytest.fixture
def work(tmp_path, samples):
    """Copies of the sample CNN and its calibration data, so nothing under test can touch the samples."""
    for name in (CNN, CALIB):
        (tmp_path / name).write_bytes((samples / name).read_bytes())
    return tmp_path


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
        keep_rejected(cand, tmp_path / "q.REJECTED.onnx", "missed the budget")
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


# ------------------------------------------------------------------ 12. NaN from the data is a data problem

@pytest.mark.parametrize("command", [["simplify"], ["quantize", "--mode", "dynamic", "--no-latency-search"]])
def test_data_on_which_the_model_gives_nan_is_exit_2_naming_the_input(cli, tmp_path, command):
    from test_fidelity_padding import _pooling_encoder

    model = _pooling_encoder(tmp_path / "enc.onnx")
    mask = np.ones((8, 8), np.int64)
    mask[3] = 0  # one sample all padding: its pooled row is 0/0
    np.savez(tmp_path / "d.npz", input_ids=np.ones((8, 8), np.int64), attention_mask=mask)
    out = tmp_path / "out"
    out.mkdir()
    flag = "--data" if command[0] == "simplify" else "--eval-data"
    r = cli(*command, model, "-o", out / "m.onnx", flag, tmp_path / "d.npz")
    line = one_error_line(r)
    assert r.rc == 2, r.err
    assert "input 'attention_mask' masks every position in 1 of 8 samples" in line, line
    assert list(out.iterdir()) == []


# ------------------------------------------------------------------ 11. a state whose batch axis is not the first

def _state_model(path: Path) -> Path:
    """x [batch,4] -> x+1, and a state [2,batch,8] -> state*2 (a voice model's layout)."""
    g = h.make_graph([h.make_node("Mul", ["state", "two"], ["s2"]), h.make_node("Add", ["x", "one"], ["y"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, ["batch", 4]),
                      h.make_tensor_value_info("state", T.FLOAT, [2, "batch", 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["batch", 4]),
                      h.make_tensor_value_info("s2", T.FLOAT, [2, "batch", 8])],
                     [nh.from_array(np.array(2, np.float32), "two"), nh.from_array(np.array(1, np.float32), "one")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)
    return path


# without its batch axis, whole, and (the size-1 rule) with dims of size 1 added or left out
@pytest.mark.parametrize("state_shape", [(6, 2, 8), (6, 2, 1, 8), (6, 1, 2, 8), (6, 2, 8, 1), (6, 2, 1, 1, 8)])
def test_a_state_sample_takes_its_batch_axis_where_the_model_declares_it(cli, tmp_path, state_shape):
    model = _state_model(tmp_path / "state.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.random((6, 4), np.float32), state=rng.random(state_shape, np.float32))
    r = cli("eval", model, "--data", tmp_path / "d.npz", "--reference", model, "--no-metric", "--json")
    assert r.rc == 0, r.err
    fidelity = json.loads(r.out)["stages"][0]["measurements"]["fidelity"]
    assert fidelity["outputs"]["s2"]["cosine"] == pytest.approx(1.0)


def test_a_state_that_fits_no_layout_lists_what_each_would_take(cli, tmp_path):
    model = _state_model(tmp_path / "state.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.random((6, 4), np.float32), state=rng.random((6, 3, 8), np.float32))
    r = cli("bench", model, "--data", tmp_path / "d.npz", "--runs", "2")
    line = one_error_line(r)
    assert r.rc == 2
    assert "per-sample shape [3,8]" in line and "[2,8] (the input without its batch axis" in line
    assert "[2,?,8] (the input whole" in line or "[2,batch,8] (the input whole" in line, line


# ------------------------------------------------------------------ 12. scalars optkit cannot guess

def _threshold_model(path: Path, dtype=T.FLOAT) -> Path:
    """y = x > thr: a scalar threshold, which changes what the model computes."""
    g = h.make_graph([h.make_node("Cast", ["thr"], ["t"], to=T.FLOAT), h.make_node("Greater", ["x", "t"], ["y"])],
                     "g", [h.make_tensor_value_info("x", T.FLOAT, ["batch", 4]),
                           h.make_tensor_value_info("thr", dtype, [])],
                     [h.make_tensor_value_info("y", T.BOOL, ["batch", 4])])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.mark.parametrize("dtype", [T.FLOAT, T.INT64])
def test_a_scalar_that_cannot_be_guessed_is_named(cli, tmp_path, dtype):
    model = _threshold_model(tmp_path / "thr.onnx", dtype)
    r = cli("bench", model, "--runs", "2")
    assert r.rc == 2
    assert "input 'thr' is a" in one_error_line(r) and "--value thr=V" in one_error_line(r)
    assert cli("bench", model, "--runs", "2", "--value", "thr=0.5").rc == 0


def test_value_for_a_tensor_input_is_refused(cli, tmp_path):
    model = _threshold_model(tmp_path / "thr.onnx")
    r = cli("bench", model, "--runs", "2", "--value", "thr=0.5", "--value", "x=1")
    assert r.rc == 2
    assert "input 'x' is not a scalar" in one_error_line(r)


# ------------------------------------------------------------------ 12. names that reach a terminal or a PR comment

EVIL = "x\x1b]0;pwned\x07\x1b[31m<img src=http://evil.example/p.png>\u202e"


def _evil_model(folder: Path) -> Path:
    g = h.make_graph([h.make_node("Relu", [EVIL], ["y"], name="n\x1b[2J")], "g",
                     [h.make_tensor_value_info(EVIL, T.FLOAT, ["batch", 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["batch", 4])])
    path = folder / "evil\x1b[5m.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_control_characters_and_html_in_names_are_escaped(cli, tmp_path):
    model = _evil_model(tmp_path)
    r = cli("inspect", model)
    assert r.rc == 0, r.err
    assert "\x1b" not in r.out + r.err and "\u202e" not in r.out
    assert "\\x1b]0;pwned\\x07" in r.out  # shown, escaped
    r = cli("bench", model, "--shape", "x=1x2", "--runs", "2")  # an error naming the inputs
    assert r.rc == 2 and "\x1b" not in r.err and "\\x1b" in one_error_line(r)
    r = cli("simplify", model, "-o", tmp_path / "s.onnx", "--report", tmp_path / "r.json")  # notes name the input
    assert r.rc == 0, r.err
    assert "\x1b" not in r.out + r.err and "pwned" in r.out
    md = cli("report", "render", tmp_path / "r.json", "--format", "md")
    assert md.rc == 0, md.err
    assert "\x1b" not in md.out and "<img" not in md.out and "&lt;img" in md.out
    assert "![" not in md.out


# ------------------------------------------------------------------ 12. refused before any work

def test_repeated_shape_or_value_is_refused(cli, samples):
    r = cli("bench", samples / CNN, "--shape", "input=1x1x8x8", "--shape", "input=2x1x8x8")
    assert r.rc == 2 and "a second time" in one_error_line(r)
    r = cli("bench", samples / CNN, "--value", "sr=1", "--value", "sr=2")
    assert r.rc == 2 and "a second time" in one_error_line(r)


def test_tflite_shared_under_load_is_refused_before_measuring(cli, samples):
    import time

    start = time.perf_counter()
    r = cli("bench", samples / "keras_cnn.tflite", "--concurrency", "4")
    assert r.rc == 2 and "--sessions per-thread" in one_error_line(r)
    assert time.perf_counter() - start < 5  # no benchmark ran first (it took 7 s)


def test_a_recipe_stage_named_input_is_refused(cli, tmp_path, samples):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {{path: {samples / CNN}}}\nstages:\n  - pass: simplify.onnx\n    name: input\n")
    r = cli("run", recipe, "--dry-run")
    assert r.rc == 2 and "'input' names the recipe's model" in one_error_line(r)


def test_a_recipe_sharing_a_tflite_session_is_refused_before_any_stage(cli, tmp_path, samples):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {{path: {samples / 'keras_cnn.keras'}}}\nmeasure: {{concurrency: 2}}\n"
                      "stages:\n  - pass: tflite.export\n")
    r = cli("run", recipe, "--dry-run")
    assert r.rc == 2, r.err
    assert "measure" in one_error_line(r) and "--sessions per-thread" in one_error_line(r)


@pytest.mark.parametrize("model, extra", [("torch_cnn.pt2", []), ("torch_cnn.ts.pt", ["--shape", "input=1x1x8x8"])])
def test_torch_program_memory_is_the_model_not_torch(cli, samples, model, extra):
    pytest.importorskip("torch")
    r = cli("bench", str(samples / model), "--runs", "20", "--json", *extra)
    assert r.rc == 0, r.err
    memory = json.loads(r.out)["stages"][0]["measurements"]["memory"]
    assert memory["load_mb"] < 40, memory  # torch.export.load's first imports (~100 MiB) come before the baseline


def test_a_recipe_keeps_a_refused_result_where_it_says(cli, tmp_path, samples):
    recipe = tmp_path / "rq.yaml"
    recipe.write_text(f"model: {{path: {samples / CNN}}}\ndata: {{calibration: {{path: {samples / CALIB}}}}}\n"
                      "stages:\n  - pass: quantize.onnx-static\n    name: int8\n"
                      "    config: {max_latency_ratio: 0.01, latency_search: false}\n")
    r = cli("run", recipe, "--workspace", tmp_path / "runs")
    line = one_error_line(r)
    assert r.rc == 3
    kept = re.search(r"kept as (\S+\.REJECTED\.onnx)", line)[1]
    assert Path(kept).is_file() and Path(kept).parent.parent.name == "rq", line  # in the run folder, which stays
    assert "SLOWER" in line or "the same within the noise" in line or "as fast" in line


def test_rejected_check_leaves_a_missing_input_to_its_own_error(cli, work):
    r = cli("quantize", "zz.REJECTED.onnx", "-o", "zz.onnx", "--mode", "dynamic", cwd=work)
    assert r.rc == 2 and "not found" in one_error_line(r) and "also an input" not in one_error_line(r)


def test_eval_on_data_where_the_model_gives_nan_is_exit_2(cli, tmp_path):
    """A masked mean: a sample whose mask hides every position divides 0 by 0."""
    axis = nh.from_array(np.array([1], np.int64), "ax")
    g = h.make_graph([h.make_node("Cast", ["attention_mask"], ["m"], to=T.FLOAT), h.make_node("Mul", ["x", "m"], ["xm"]),
                      h.make_node("ReduceSum", ["xm", "ax"], ["s"], keepdims=1),
                      h.make_node("ReduceSum", ["m", "ax"], ["c"], keepdims=1), h.make_node("Div", ["s", "c"], ["y"])],
                     "g", [h.make_tensor_value_info("x", T.FLOAT, ["batch", 4]),
                           h.make_tensor_value_info("attention_mask", T.INT64, ["batch", 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["batch", 1])], [axis])
    model = tmp_path / "mean.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8), model)
    mask = np.ones((8, 4), np.int64)
    mask[5] = 0
    np.savez(tmp_path / "d.npz", x=np.ones((8, 4), np.float32), attention_mask=mask,
             labels=np.ones((8, 1), np.float32))
    r = cli("eval", model, "--data", tmp_path / "d.npz", "--metric", "mse")
    assert r.rc == 2, r.err
    assert "input 'attention_mask' masks every position in 1 of 8 samples" in one_error_line(r)
