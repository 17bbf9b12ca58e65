"""optkit tune: the Bayesian search over serving settings, its study storage (resume, shared workers), its
outputs (best settings, SessionOptions snippet, recipe lines, Pareto plot) and its bad inputs."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
import yaml

from optkit.onnx.session import OrtSettings
from optkit.passes.tune import Slo, TuneConfig, default_space, grid
from optkit.pipeline.recipe import MeasureSection

from conftest import no_result_files, one_error_line

pytest.importorskip("optuna")

FAST = ["--trial-seconds", "0.15", "--confirm", "0"]
SMALL = ["--space", "threads=1,2", "--space", "batch=1,8", "--space", "graph_optimization=basic,all",
         "--space", "cpu_mem_arena=true", "--space", "mem_pattern=true", "--space", "runtime=onnxruntime"]


def _trials(storage: str, study: str):
    import optuna

    s = optuna.load_study(study_name=study, storage=storage)
    return [t for t in s.get_trials() if not t.user_attrs.get("skipped")]


def test_tune_writes_settings_snippet_recipe_and_pareto(cli, samples, tmp_path):
    out, rep = tmp_path / "best.json", tmp_path / "r.json"
    r = cli("tune", samples / "torch_cnn.onnx", "--trials", "8", *FAST, *SMALL, "--slo", "p99<=200ms",
            "-o", out, "--report", rep)
    assert r.rc == 0, r.err
    best = json.loads(out.read_text())
    assert best["study"]["trials"] == 8 and best["objective"] == ["throughput"]
    setting = best["best"]["setting"]
    assert setting["threads"] in (1, 2) and setting["batch"] in (1, 8)
    assert best["best"]["figures"]["throughput_per_s"] > 0 and best["best"]["figures"]["p99_ms"] <= 200
    # the snippet builds the same SessionOptions, and the recipe lines are a valid measure section
    scope: dict = {}
    exec(best["session_options"], scope)  # noqa: S102 - our own generated code
    so = scope["so"]
    assert so.intra_op_num_threads == setting["threads"]
    assert so.graph_optimization_level.name.endswith(setting["session"]["graph_optimization"].upper())
    ort.InferenceSession(str(samples / "torch_cnn.onnx"), sess_options=so, providers=["CPUExecutionProvider"])
    section = MeasureSection(**best["recipe"]["measure"])
    assert section.batch == setting["batch"]
    assert "latency_p99_ms <= 200" in best["recipe"]["gates"]
    assert any(g.startswith("throughput >= ") for g in best["recipe"]["gates"])
    # the report: the trials with a Pareto front, plotted in the HTML
    stage = json.loads(rep.read_text())["stages"][-1]
    trials = stage["measurements"]["tune"]["trials"]
    assert len(trials) == 8 and any(t["pareto"] for t in trials)
    assert stage["measurements"]["concurrency"]["throughput_per_s"] > 0
    assert stage["measurements"]["memory"]["peak_mb"] > 0
    html = cli("report", "render", rep, "--format", "html")
    assert html.rc == 0 and "Pareto front" in html.out and html.out.count("<circle") >= 3
    assert "best:" in r.out and "so.intra_op_num_threads" in r.out


def test_an_interrupted_tune_resumes_its_study(cli, samples, tmp_path):
    out = tmp_path / "best.json"
    args = ["tune", samples / "torch_cnn.onnx", *FAST, *SMALL, "-o", out]
    assert cli(*args, "--trials", "3").rc == 0
    db = tmp_path / "best.optkit-study.db"
    assert db.exists()  # the default storage: an SQLite file of optkit's own beside -o
    out.unlink()
    r = cli(*args, "--trials", "5", "--json")
    assert r.rc == 0, r.err
    notes = " ".join(json.loads(r.out)["stages"][-1]["notes"])
    assert "3 trials already done (resumed)" in notes
    assert json.loads(out.read_text())["study"]["trials"] == 5


def test_two_workers_share_one_study_without_repeating_trials(samples, tmp_path):
    """Two processes run the same command on one storage: together they run the study's trials once."""
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    cmd = [sys.executable, "-m", "optkit", "tune", str(samples / "torch_cnn.onnx"), "--trials", "10", *FAST,
           *SMALL, "--storage", storage, "--study", "shared"]
    procs = [subprocess.Popen([*cmd, "-o", str(tmp_path / f"w{i}.json")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    trials = _trials(storage, "shared")
    finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(finished) == 10
    measured = [json.dumps(t.user_attrs["setting"], sort_keys=True) for t in finished
                if "duplicate_of" not in t.user_attrs]
    assert len(measured) == len(set(measured))  # a setting already measured is reused, not measured again
    assert len({t.number for t in finished}) == 10


def test_a_study_made_for_another_search_is_refused(cli, samples, tmp_path):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    base = ["tune", samples / "torch_cnn.onnx", *FAST, "--trials", "2", "--storage", storage, "--study", "x"]
    assert cli(*base, *SMALL, "-o", tmp_path / "a.json").rc == 0
    r = cli(*base, "--space", "threads=1", "-o", tmp_path / "b.json")
    assert r.rc == 2
    line = one_error_line(r)
    assert "study 'x'" in line and "different search" in line and "space" in line
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("storage, codes", [
    ("sqlite:////no/such/folder/t.db", (2,)),
    ("postgresql://nobody@127.0.0.1:1/none", (2, 4)),  # exit 4 when its driver is not installed; 2 after --storage-wait
    ("journal:/no/such/folder/t.log", (2,)),
    ("not-a-url", (2,)),
])
def test_unreachable_storage_is_one_line(cli, samples, tmp_path, storage, codes):
    r = cli("tune", samples / "torch_cnn.onnx", *FAST, "--trials", "2", "--storage", storage, "--storage-wait", "1",
            "-o", tmp_path / "b.json")
    assert r.rc in codes, r.err
    line = one_error_line(r)
    assert "storage" in line
    assert no_result_files(tmp_path) == []


def test_an_slo_no_setting_meets_is_exit_3_naming_the_closest(cli, samples, tmp_path):
    r = cli("tune", samples / "torch_cnn.onnx", *FAST, *SMALL, "--trials", "4", "--slo", "p99<=0.00001ms",
            "-o", tmp_path / "b.json")
    assert r.rc == 3, r.err
    line = one_error_line(r)
    assert "no setting met p99<=0.00001ms" in line and "the closest:" in line and "samples/s" in line
    assert not (tmp_path / "b.json").exists()


def test_a_model_that_cannot_batch_leaves_batch_out(cli, realcases, tmp_path):
    out = tmp_path / "b.json"
    r = cli("tune", realcases / "mnist.onnx", *FAST, "--trials", "3", "--space", "threads=1", "-o", out,
            "--json")
    assert r.rc == 0, r.err
    notes = " ".join(json.loads(r.out)["stages"][-1]["notes"])
    assert "batch size left out of the search" in notes and "Input3" in notes
    best = json.loads(out.read_text())
    assert best["best"]["setting"]["batch"] == 1 and best["space"]["batch"] == [1] and "batch" in best["left_out"]
    r = cli("tune", realcases / "mnist.onnx", *FAST, "--trials", "2", "--space", "batch=1,8",
            "-o", tmp_path / "c.json")
    assert r.rc == 2 and "cannot batch" in one_error_line(r)


@pytest.mark.parametrize("args, words", [
    (["--objective", "speed"], "objective"),
    (["--slo", "p99 about 20ms"], "cannot read SLO"),
    (["--slo", "throughput<=5"], "less throughput"),
    (["--max-memory", "lots"], "--max-memory"),
    (["--time-budget", "soon"], "--time-budget"),
    (["--space", "thread=1,2"], "did you mean 'threads'"),
    (["--space", "batch=0,8"], "not a count"),
    (["--space", "threads"], "NAME=V1,V2"),
    (["--trials", "0"], "trials"),
    (["--max-memory", "1.2.3GB"], "--max-memory"),
    (["--time-budget", "."], "--time-budget"),
    (["--slo", "p99<=20/s"], "p99 is in ms"),
    (["--slo", "throughput>=2s"], "throughput is in samples/s"),
    (["--space", "batch=99999999999999999999"], "from 1 to 65536"),
    (["--storage", "sqlite:///STUDY.json"], "is also"),
])
def test_bad_tune_flags(cli, samples, tmp_path, args, words):
    args = [str(a).replace("STUDY.json", str(tmp_path / "b.json")) for a in args]  # the study file is -o
    r = cli("tune", samples / "torch_cnn.onnx", *args, "-o", tmp_path / "b.json")
    assert r.rc == 2, r.err
    assert words in one_error_line(r)
    assert no_result_files(tmp_path) == []


def test_sizes_and_durations_are_the_configs_own_on_every_entry_point(cli, samples, tmp_path):
    """"2GB" and "10m" are read by TuneConfig itself: a recipe's tune stage and optkit.run_pass take what the
    command takes, and a bad one is exit 2 naming the key (the recipe's line, the flag) with nothing written."""
    import yaml

    import optkit
    from optkit.core.errors import UsageError
    from optkit.core.registry import build_config
    from optkit.passes import get_pass

    cfg = build_config(get_pass("tune.onnx"), {"max_memory_mb": "2GB", "time_budget": "10m"})
    assert cfg.max_memory_mb == pytest.approx(2e9 / 2 ** 20) and cfg.time_budget == 600.0
    assert build_config(get_pass("tune.onnx"), {"max_memory_mb": 512, "time_budget": 90}).time_budget == 90
    model = str(samples / "torch_cnn.onnx")
    recipe = tmp_path / "r.yaml"
    for config, ok in (({"max_memory_mb": "512MiB", "time_budget": "1h"}, True),
                       ({"max_memory_mb": "lots"}, False), ({"time_budget": "soon"}, False)):
        recipe.write_text(yaml.safe_dump({"version": 1, "model": {"path": model},
                                          "stages": [{"pass": "tune.onnx", "config": config}]}))
        r = cli("run", recipe, "--dry-run")
        assert (r.rc == 0) == ok, r.err
        if not ok:
            key = next(iter(config))
            assert r.rc == 2 and f"stages[0].config.{key}" in one_error_line(r) and "is not a" in r.err
    for key, bad in (("max_memory_mb", "lots"), ("time_budget", "soon")):
        with pytest.raises(UsageError, match=f"{key}: .* is not a"):
            optkit.run_pass("tune.onnx", model, tmp_path / "t.onnx", **{key: bad})
    assert no_result_files(tmp_path) == ["r.yaml"]


def test_the_study_identity_includes_the_input_values(cli, realcases, tmp_path):
    """Another --value is another search: its figures are never taken from a study measured on other inputs."""
    args = ["tune", realcases / "silero_vad.onnx", *FAST, "--trials", "2", "--space", "threads=1",
            "--space", "concurrency=1", "-o", tmp_path / "b.json", "--json"]
    assert cli(*args, "--value", "sr=16000").rc == 0
    r = cli(*args, "--value", "sr=8000")
    assert r.rc == 0, r.err
    assert "resumed" not in " ".join(json.loads(r.out)["stages"][-1]["notes"])


def test_tune_refuses_a_model_that_is_not_onnx(cli, samples, tmp_path):
    keras = next(samples.glob("*.keras"), None)
    if keras is None:
        pytest.skip("no Keras sample model")
    r = cli("tune", keras, "-o", tmp_path / "b.json")
    assert r.rc == 2 and "convert it to ONNX first" in one_error_line(r)


def test_recipe_tune_stage_is_measured_served_as_tuned_and_gated(cli, samples, tmp_path):
    recipe = tmp_path / "tune.yaml"
    recipe.write_text(yaml.safe_dump({
        "version": 1, "name": "tune", "model": {"path": str(samples / "torch_cnn.onnx")},
        "stages": [{"pass": "tune.onnx", "config": {"trials": 4, "trial_seconds": 0.15, "confirm": 0,
                                                     "space": {"batch": [8], "concurrency": [2],
                                                               "sessions": ["per-thread"], "threads": [1]}}}],
        # 2,000 calls: a throughput band from 20 under load is a stall away from bounding nothing (tests/test_bench_load)
        "measure": {"runs": 2000, "trials": 2, "normalize": False},
        "gates": ["throughput >= 1", "memory_mb <= 100000"]}))
    r = cli("run", recipe, "--workspace", tmp_path / "ws", "--json")
    assert r.rc == 0, r.err
    stage = json.loads(r.out)["stages"][1]
    assert stage["measurements"]["tune"]["best"]["setting"]["batch"] == 8
    # measured by the recipe the way tune serves it: batch 8, two requests in flight over two sessions
    assert stage["measurements"]["latency"]["batch"] == 8
    assert stage["measurements"]["concurrency"]["concurrency"] == 2
    assert stage["measurements"]["concurrency"]["sessions"] == 2
    r = cli("run", recipe, "--workspace", tmp_path / "ws", "--json")
    assert r.rc == 0 and json.loads(r.out)["stages"][1]["cached"] is True
    bad = tmp_path / "bad.yaml"
    bad.write_text(recipe.read_text().replace("throughput >= 1", "throughput >= 1e12"))
    assert cli("run", bad, "--workspace", tmp_path / "ws").rc == 1


# ----------------------------------------------------------------------------- the parts, without measuring

def test_slo_parsing_and_judging():
    s = Slo("p99 <= 20ms")
    assert s.figure == "p99_ms" and s.limit == 20 and s.upper
    assert s.violation({"p99_ms": 10}) < 0 < s.violation({"p99_ms": 30})
    assert Slo("p50<=0.5s").limit == 500
    assert s.hopeless({"p50_ms": 45}) and not s.hopeless({"p50_ms": 25})
    t = Slo("throughput>=200")
    assert t.violation({"throughput_per_s": 250}) < 0 and t.hopeless({"throughput_per_s": 90})
    assert Slo("p99<=20ms").violation({"p99_ms": float("nan")}) == float("inf")


def test_space_conditions_and_grid():
    cfg = TuneConfig(space={"threads": [1, 2], "execution_mode": ["sequential", "parallel"],
                            "inter_op_threads": [1, 2], "graph_optimization": ["all"], "batch": [1],
                            "concurrency": [1, 2], "sessions": ["shared", "per-thread"],
                            "cpu_mem_arena": [True], "mem_pattern": [True]})
    space = default_space(cfg, batchable=True, providers=["cpu"])
    settings = grid(space)
    # threads 2 x (sequential + parallel x 2 inter-op) x (1 in flight + 2 in flight x 2 sessions kinds)
    assert len(settings) == 2 * 3 * 3
    assert all(s.session.inter_op_threads is None for s in settings if s.session.execution_mode == "sequential")
    assert all(s.sessions == "shared" for s in settings if s.concurrency == 1)
    latency_only = default_space(TuneConfig(objective=["latency"]), batchable=True, providers=["cpu"])
    assert latency_only["batch"] == [1] and latency_only["concurrency"] == [1]


def test_session_settings_snippet_matches_session_options():
    from optkit.onnx.session import session_options

    o = OrtSettings(inter_op_threads=2, execution_mode="parallel", graph_optimization="extended",
                    cpu_mem_arena=False, mem_pattern=False)
    scope: dict = {}
    exec(o.snippet(3), scope)  # noqa: S102 - our own generated code
    a, b = scope["so"], session_options(3, ort_settings=o)
    for attr in ("intra_op_num_threads", "inter_op_num_threads", "execution_mode", "graph_optimization_level",
                 "enable_cpu_mem_arena", "enable_mem_pattern"):
        assert getattr(a, attr) == getattr(b, attr), attr
    assert np.isfinite(b.intra_op_num_threads)
