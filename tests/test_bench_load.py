"""Serving figures: bench --concurrency (throughput and latency under load), memory on every measurement, the
onnxruntime session options a recipe can set, and gates on throughput and memory."""
from __future__ import annotations

import json

import pytest
import yaml

from conftest import no_result_files, one_error_line


@pytest.mark.parametrize("sessions, expected", [("shared", 1), ("per-thread", 3)])
def test_bench_concurrency_and_memory(cli, samples, sessions, expected):
    r = cli("bench", samples / "torch_cnn.onnx", "--concurrency", "3", "--sessions", sessions, "--runs", "40",
            "--json")
    assert r.rc == 0, r.err
    m = json.loads(r.out)["stages"][0]["measurements"]
    load = m["concurrency"]
    assert load["concurrency"] == 3 and load["sessions"] == expected and load["calls"] == 3 * 40
    assert load["throughput_per_s"] > 0 and load["p50_ms"] <= load["p99_ms"]
    assert m["memory"]["peak_mb"] >= m["memory"]["load_mb"] > 0


def test_bench_console_shows_load_and_memory(cli, samples):
    r = cli("bench", samples / "torch_cnn.onnx", "--concurrency", "2", "--runs", "20")
    assert r.rc == 0, r.err
    assert "under load: 2 requests in flight over 1 session" in r.out and "memory:" in r.out


@pytest.mark.parametrize("args, words", [
    (["--concurrency", "0"], "--concurrency 0 is out of range"),
    (["--concurrency", "2", "--sessions", "many"], "--sessions 'many'"),
    (["--sessions", "per-thread"], "give --concurrency N as well"),
    (["--value", "x=nan"], "finite number"),
    (["--shape", "input=99999999999x1x8x8"], "at most 16 dims"),
])
def test_bad_load_flags(cli, samples, tmp_path, args, words):
    r = cli("bench", samples / "torch_cnn.onnx", *args, "--report", tmp_path / "r.json")
    assert r.rc == 2
    assert words in one_error_line(r)
    assert no_result_files(tmp_path) == []


def _recipe(tmp_path, samples, measure: dict, gates: list[str]):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "name": "serve",
                                    "model": {"path": str(samples / "torch_cnn.onnx")},
                                    "stages": [{"pass": "simplify.onnx"}],
                                    "measure": {"runs": 20, "trials": 2, "normalize": False, **measure},
                                    "gates": gates}))
    return path


def test_recipe_session_options_concurrency_and_gates(cli, samples, tmp_path):
    # 2,000 calls a thread: 20 take about a millisecond, and one stall of a loaded runner then leaves the ten
    # spans of the throughput's band empty but one, which bounds nothing (the gate rightly cannot judge)
    measure = {"concurrency": 2, "sessions": "per-thread", "threads": 1, "runs": 2000,
               "session": {"graph_optimization": "basic", "execution_mode": "sequential", "cpu_mem_arena": False}}
    r = cli("run", _recipe(tmp_path, samples, measure, ["throughput >= 1", "memory_mb <= 100000"]),
            "--workspace", tmp_path / "ws", "--json")
    assert r.rc == 0, r.err
    rep = json.loads(r.out)
    for stage in rep["stages"]:
        assert stage["measurements"]["concurrency"]["sessions"] == 2
        assert stage["measurements"]["memory"]["peak_mb"] > 0
    assert [g["passed"] for g in rep["gates"]] == [True, True]
    r = cli("run", _recipe(tmp_path, samples, measure, ["memory_mb <= 0.001"]), "--workspace", tmp_path / "ws2")
    assert r.rc == 1  # the gate failed


@pytest.mark.parametrize("measure, words", [
    ({"concurrency": 0}, "concurrency"),
    ({"session": {"graph_optimisation": "all"}}, "graph_optimisation"),
    ({"session": {"execution_mode": "fast"}}, "execution_mode"),
    ({"sessions": "some"}, "sessions"),
])
def test_recipe_measure_typos(cli, samples, tmp_path, measure, words):
    r = cli("run", _recipe(tmp_path, samples, measure, []), "--workspace", tmp_path / "ws")
    assert r.rc == 2
    assert words in one_error_line(r)


def test_throughput_gate_needs_a_measurement(cli, samples, tmp_path):
    r = cli("run", _recipe(tmp_path, samples, {"latency": False}, ["throughput >= 1"]),
            "--workspace", tmp_path / "ws")
    assert r.rc == 2 and "throughput is not measured" in one_error_line(r)


def test_a_tflite_interpreter_is_not_shared_between_threads(cli, realcases):
    model = realcases / "trained_lstm.tflite"
    r = cli("bench", model, "--runs", "5", "--concurrency", "2")
    assert r.rc == 2 and "--sessions per-thread" in one_error_line(r)
    r = cli("bench", model, "--runs", "5", "--concurrency", "2", "--sessions", "per-thread", "--json")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["stages"][0]["measurements"]["concurrency"]["sessions"] == 2


def test_console_states_a_band_open_above():
    from types import SimpleNamespace

    from optkit.report.render import _load_line

    f = SimpleNamespace(connections=None, sessions=1, concurrency=2, load_throughput_per_s=900.0, load_p50_ms=1.0,
                        load_p99_ms=2.0, load_ci95={"throughput_per_s": [400.0, None]})
    assert "(95% band from 400.0, too noisy to bound above)" in _load_line(f)
    f.load_ci95 = {"throughput_per_s": [800.0, 1000.0]}
    assert "(95% band 800.0-1,000.0)" in _load_line(f)
