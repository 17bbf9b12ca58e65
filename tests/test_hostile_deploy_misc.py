"""Hostile input, round 4 (issue 29), the smaller parts of the deploy surface: a percentile gate judged on its
own band (never the p50's), a tune stage's study kept in the run folder (never the user's cache), the API's
errors and exported names, a Loop's time consistent with the whole call in `optkit profile`, and an HTML report
that embeds no control byte from a model's or a stage's name.

Each case runs the real CLI (or the real library) and checks the exit code, the one error line and the files
afterwards.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto as T
from onnx import helper as h

from optkit.core.errors import UsageError
from optkit.pipeline.gates import NO_BAND, evaluate, parse_gates
from optkit.report.schema import ArtifactRef, GateResult, Report, Stage

from conftest import one_error_line, run_cli

# issue 29: every command here leaves HOME and TMPDIR as it found them
pytestmark = pytest.mark.usefixtures("fresh_home_and_tmp")


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` with its sha256: what a command may not change."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- 9. a percentile is judged on its own band

@pytest.fixture(scope="module")
def bench_report(sample_bench_report) -> dict:
    return sample_bench_report


def tune_stage_report(bench: dict, folder: Path) -> Path:
    """The reproducer: a tune stage's report, latency over 5 trials (their p50s ±11.8%), p99 35.70 ms with the
    runs' band [30.77, null]."""
    d = json.loads(json.dumps(bench))
    stage = d["stages"][-1]
    stage["name"], stage["pass"] = "tune", "tune.onnx"
    lat = stage["measurements"]["latency"]
    lat.update(p99_ms=35.70, trials=5, ci95_pct=11.8)
    lat["ci95"]["p99_ms"] = [30.77, None]
    path = folder / "report.json"
    path.write_text(json.dumps(d))
    return path


def test_a_p99_gate_is_not_judged_with_the_p50_noise(cli, tmp_path, bench_report):
    path = tune_stage_report(bench_report, tmp_path)
    before = snapshot(tmp_path)
    r = cli("gate", path, "latency_p99_ms <= 40")
    assert r.rc == 1, (r.out, r.err)
    line = one_error_line(r)
    assert "latency_p99_ms <= 40 (cannot judge: the 95% band has no upper end" in line, line
    assert "100 runs do not bound the 99th percentile from above; time at least 368 runs" in line, line
    assert "over 5 trials" not in line.split("(cannot judge")[1].split(";")[0]   # not the p50's ±11.8%
    assert snapshot(tmp_path) == before                                        # the gate wrote nothing
    # the p50 keeps the trials' band; the p90 and the throughput are judged on their own (bounded) bands
    r = cli("gate", path, "latency_p50_ms <= 40", "latency_p90_ms <= 40", "throughput >= 1", "--json")
    assert r.rc == 0, r.err
    p50, p90, tput = json.loads(r.out)
    assert p50["detail"].startswith("±11.8% over 5 trials")
    assert p90["detail"].startswith("95% band") and "(100 runs), p50 ±11.8% over 5 trials" in p90["detail"]
    assert tput["verdict"] == "pass" and snapshot(tmp_path) == before


def test_a_p99_gate_over_the_threshold_on_the_open_side_cannot_be_judged_either(cli, tmp_path, bench_report):
    """`p99 >= 30` with the band [30.77, null]: the lower end is over 30 and the value with it: a plain pass.
    `p99 >= 40`: the figure is under 40 but the band reaches over it without end: cannot judge, never a fail
    on the point and never a pass."""
    path = tune_stage_report(bench_report, tmp_path)
    r = cli("gate", path, "latency_p99_ms >= 30", "--json")
    assert r.rc == 0, r.err
    r = cli("gate", path, "latency_p99_ms >= 40")
    assert r.rc == 1 and "latency_p99_ms >= 40 (cannot judge" in one_error_line(r)


def _stage(lat: dict) -> Report:
    return Report(command="t", stages=[Stage(name="m", output=ArtifactRef(path="m.onnx", format="onnx", sha256="m"),
                                             measurements={"latency": lat})])


def verdict(rep: Report, gate: str) -> GateResult:
    (r,) = evaluate(rep, parse_gates([gate]))
    return r


def test_a_percentile_without_a_band_of_its_own_is_not_judged_on_the_p50s():
    """A report with the trials' p50 band only (no runs' band for the p99): the p99 carries no band, so it is
    not judged as exact, whatever the margin; the p50 is judged on the trials' band as before."""
    rep = _stage({"p50_ms": 10.0, "p90_ms": 12.0, "p99_ms": 15.0, "trials": 5, "ci95_pct": 1.0,
                  "throughput_per_s": 100.0})
    for gate in ("latency_p99_ms <= 1000", "latency_p90_ms <= 1000", "throughput >= 1"):
        r = verdict(rep, gate)
        assert r.verdict == "cannot judge" and r.detail.startswith(f"cannot judge: {NO_BAND}"), r.detail
        assert "is the p50's band, not this figure's" in r.detail
    assert verdict(rep, "latency_p50_ms <= 10.5").verdict == "pass"


def test_a_percentile_band_is_widened_by_a_drifting_machine_never_narrowed():
    """With trials, a percentile's band is its runs' band or the trials' relative spread, whichever is wider."""
    lat = {"p50_ms": 10.0, "p90_ms": 12.0, "p99_ms": 15.0, "trials": 5, "ci95_pct": 20.0, "runs": 2000,
           "ci95": {"p99_ms": [14.8, 15.2], "p90_ms": [11.9, 12.1]}}
    rep = _stage(lat)
    assert verdict(rep, "latency_p99_ms <= 15.5").verdict == "cannot judge"    # 15 * 1.2 = 18 reaches over it
    assert verdict(rep, "latency_p99_ms <= 18.5").verdict == "pass"
    lat.update(ci95_pct=0.1)
    assert verdict(_stage(lat), "latency_p99_ms <= 15.5").verdict == "pass"    # the runs' band alone
    assert verdict(_stage(lat), "latency_p99_ms <= 15.1").verdict == "cannot judge"


# ---------------------------------------------------------------- 15. a recipe's tune study stays in its run

def test_a_recipe_tune_stage_keeps_its_study_in_the_run_folder(tmp_path, samples, monkeypatch):
    pytest.importorskip("optuna")
    home, xdg, cache = tmp_path / "home", tmp_path / "xdg", tmp_path / "optkit-cache"
    for d in (home, xdg):
        d.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    monkeypatch.setenv("OPTKIT_CACHE_DIR", str(cache))
    recipe = tmp_path / "tune.yaml"
    recipe.write_text(yaml.safe_dump({
        "version": 1, "name": "tune", "model": {"path": str(samples / "torch_cnn.onnx")},
        "stages": [{"pass": "tune.onnx", "config": {"trials": 2, "trial_seconds": 0.15, "confirm": 0,
                                                     "space": {"batch": [1], "concurrency": [1],
                                                               "sessions": ["shared"], "threads": [1]}}}],
        "measure": {"runs": 10, "trials": 1, "normalize": False, "latency": False}}))
    r = run_cli("run", recipe, "--workspace", tmp_path / "ws", "--json")
    assert r.rc == 0, r.err
    # nothing of the tune under the user's caches (other caches may live there; the study may not)
    for base in (home, xdg, cache):
        assert not [p for p in base.rglob("*") if p.suffix == ".db" or p.name == "tune"], list(base.rglob("*"))
    (run,) = [p for p in (tmp_path / "ws" / "tune").iterdir() if p.is_dir() and not p.is_symlink()]
    (study,) = run.glob("*.optkit-study.db")
    assert study.name == "01-tune.onnx.optkit-study.db" or study.name.startswith("01-"), study.name
    assert study.read_bytes().startswith(b"SQLite format 3\x00")
    assert not list(tmp_path.glob("*.db"))


def test_stage_study_path_follows_the_runner_aside(tmp_path):
    from optkit.core.registry import PassContext
    from optkit.passes.tune import stage_study_path

    run = tmp_path / "runs" / "r" / "20250101-000000"
    ctx = PassContext(output=run / ".01-tune.partial" / "model.onnx", aside=run / "01-tune.REJECTED.onnx")
    assert stage_study_path(ctx) == run / "01-tune.optkit-study.db"                # a recipe: its run folder
    ctx = PassContext(output=tmp_path / "scratch" / "model.onnx", aside=tmp_path / "best.REJECTED.onnx")
    assert stage_study_path(ctx) == tmp_path / "best.optkit-study.db"              # run_pass: beside its output
    assert stage_study_path(PassContext(output=tmp_path / "m.onnx")) == tmp_path / "m.optkit-study.db"


# ---------------------------------------------------------------- 16. the API: its names and its errors

def test_the_errors_the_readme_names_are_exported():
    import optkit
    from optkit.core import errors

    for name in ("OptkitError", "UsageError", "PassError", "ValidationError", "DependencyError", "GateFailed"):
        assert getattr(optkit, name) is getattr(errors, name) and name in optkit.__all__
    from optkit import UsageError as exported

    assert exported is UsageError


RECIPE = {"version": 1, "name": "api", "model": {"path": None}, "stages": [{"pass": "simplify.onnx"}],
          "measure": {"latency": False}}


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text and "Traceback" not in text, text
    return text


@pytest.mark.parametrize("kwargs, words", [
    ({"workspace": "model.onnx"}, "workspace model.onnx is not a folder"),
    ({"workspace": "model.onnx/runs"}, "workspace model.onnx/runs: /"),
    ({"workspace": None}, "workspace: give a path (a str or pathlib.Path), not None"),
    ({"cache": "yes"}, "cache: give True or False, not str 'yes'"),
    ({"baseline": 3}, "baseline: give a path"),
])
def test_run_refuses_a_bad_argument_with_one_line(tmp_path, samples, monkeypatch, kwargs, words):
    import optkit

    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.onnx").write_bytes((samples / "torch_cnn.onnx").read_bytes())
    before = snapshot(tmp_path)
    recipe = {**RECIPE, "model": {"path": str(tmp_path / "model.onnx")}}
    with pytest.raises(UsageError) as e:
        optkit.run(recipe, **kwargs)
    assert words in _one_line(e)
    assert snapshot(tmp_path) == before and not (tmp_path / "runs").exists()


def test_run_refuses_a_recipe_that_is_no_recipe(tmp_path, monkeypatch):
    import optkit

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as e:
        optkit.run(None)
    assert "recipe: give a path" in _one_line(e)
    with pytest.raises(UsageError) as e:
        optkit.run({**RECIPE, "model": {"path": "m.onnx"}, "stagse": []})
    assert "stagse" in _one_line(e)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, kwargs, words", [
    (("simplify.onnx", None, "out.onnx"), {}, "model: give a path (a str or pathlib.Path), not None"),
    (("simplify.onnx", "model.onnx", None), {}, "output: give a path (a str or pathlib.Path), not None"),
    ((None, "model.onnx", "out.onnx"), {}, "pass_name: give a pass's name"),
    (("simplify.onnx", "model.onnx", "out.onnx"), {"measure": "runs=5"}, "measure: give the recipe's measure"),
    (("simplify.onnx", "model.onnx", "out.onnx"), {"calibration": 5}, "calibration: give a path"),
    (("simplify.onnx", ".", "out.onnx"), {}, "is a folder"),
    (("simplify.onnx", "model.onnx", "out.onnx"), {"tolerance_typo": 1}, "tolerance_typo: unknown key"),
])
def test_run_pass_refuses_a_bad_argument_with_one_line(tmp_path, samples, monkeypatch, args, kwargs, words):
    import optkit

    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.onnx").write_bytes((samples / "torch_cnn.onnx").read_bytes())
    before = snapshot(tmp_path)
    with pytest.raises(UsageError) as e:
        optkit.run_pass(*args, **kwargs)
    assert words in _one_line(e)
    assert snapshot(tmp_path) == before


def test_cli_run_with_a_file_as_workspace_is_exit_2(cli, tmp_path, samples):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "model": {"path": str(samples / "torch_cnn.onnx")}}))
    (tmp_path / "ws").write_text("notes")
    before = snapshot(tmp_path)
    r = cli("run", recipe, "--workspace", tmp_path / "ws")
    assert r.rc == 2
    assert "workspace" in one_error_line(r) and "is not a folder" in one_error_line(r)
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------- 17. a Loop's time agrees with the call's

def loop_model(path: Path) -> Path:
    """A Loop running M iterations (M a scalar input) of Identity, Add and Relu on a [1, 16] tensor."""
    body = h.make_graph(
        [h.make_node("Identity", ["cond_in"], ["cond_out"]), h.make_node("Add", ["x_in", "one"], ["y"]),
         h.make_node("Relu", ["y"], ["x_out"])], "body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
         h.make_tensor_value_info("x_in", T.FLOAT, [1, 16])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("x_out", T.FLOAT, [1, 16])],
        [h.make_tensor("one", T.FLOAT, [1], [1.0])])
    graph = h.make_graph(
        [h.make_node("Constant", [], ["c"], value=h.make_tensor("cv", T.BOOL, [], [True])),
         h.make_node("Loop", ["M", "c", "x"], ["out"], body=body, name="loop")],
        "loop", [h.make_tensor_value_info("M", T.INT64, []), h.make_tensor_value_info("x", T.FLOAT, [1, 16])],
        [h.make_tensor_value_info("out", T.FLOAT, [1, 16])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def test_profile_of_a_loop_is_consistent_with_the_whole_call(cli, tmp_path):
    """Before: the Loop read 0.596 ms in a call whose p50 was 0.081 ms (the per-op total 8.87x the p50); on a
    quiet machine it is now within about 10%. The profiled calls last ~20x the plain ones, so on a machine
    loaded by other work the OS preempts many of them: the timing verdict is the best of three profiles."""
    model = loop_model(tmp_path / "loop.onnx")
    before = snapshot(tmp_path)
    ratios = []
    for _ in range(3):
        r = cli("profile", model, "--value", "M=100", "--runs", "50", "--json")
        assert r.rc == 0, r.err
        p = json.loads(r.out)
        loop = next(n for n in p["nodes"] if n["op"] == "Loop")
        # the profiler's gaps between the 300 kernel runs inside (a few us each) are taken off the Loop
        assert loop["raw_ms"] - loop["ms"] >= 300 * 1e-3, loop
        ratios.append(p["total_vs_p50"])
        if ratios[-1] < 2.5 and loop["ms"] < 2 * p["p50_ms"]:
            break
    if os.getloadavg()[0] <= (os.cpu_count() or 1):  # a timing verdict only where the CPUs are not oversubscribed
        assert min(ratios) < 2.5, (ratios, p["nodes"], p["p50_ms"])
    assert snapshot(tmp_path) == before


def test_self_times_take_the_profiler_gaps_off_a_control_flow_node():
    """A Loop span of 1003 us holding 100 kernel runs of 5 us, 5 us apart: its own time is what is left after the
    kernels (500 us) and the profiler's gaps (100 x the median gap, 500 us): 3 us, never 503 us."""
    from optkit.measure.profile import self_times

    loop = {"name": "loop_kernel_time", "ts": 0, "dur": 1003, "pid": 1, "tid": 1}
    inner = [{"name": f"k{i}_kernel_time", "ts": 2 + 10 * i, "dur": 5, "pid": 1, "tid": 1} for i in range(100)]
    times = {e["name"]: (own, gaps) for e, own, gaps in self_times([loop, *inner])}
    assert times["loop_kernel_time"] == (503.0, 500.0)
    assert all(times[e["name"]] == (5.0, 0.0) for e in inner)
    # one kernel run inside (an If's branch): the calibrated gap is taken off
    (_, own, gaps), _ = self_times([{**loop, "dur": 20}, inner[0]], gap_us=4.0)
    assert (own, gaps) == (15.0, 4.0)


# ---------------------------------------------------------------- 18. no control byte in report.html

HOSTILE = "evil\x1b[31m\x01name\u202e"


def hostile_report() -> Report:
    lat = {"p50_ms": 1.0, "p90_ms": 1.2, "p99_ms": 1.5, "runs": 100, "trials": 1,
           "ci95": {"p50_ms": [0.9, 1.1], "p90_ms": [1.1, 1.3], "p99_ms": [1.4, None]}}
    tune = {"best": {"trial": 0},
            "trials": [{"number": 0, "label": f"threads 1 {HOSTILE}", "state": "complete", "feasible": True,
                        "pareto": True, "figures": {"p50_ms": 1.0, "throughput_per_s": 900.0}}]}
    stages = [Stage(name=f"input{HOSTILE}", pass_name=None, notes=[f"note {HOSTILE}"], warnings=[f"warn {HOSTILE}"],
                    output=ArtifactRef(path=f"/m/{HOSTILE}.onnx", format="onnx", sha256="a" * 64),
                    measurements={"size": {"bytes": 1000}, "latency": lat, "accuracy": {"metric": "top1", "top1": 0.9}}),
              Stage(name=f"tune{HOSTILE}", pass_name=f"tune.onnx{HOSTILE}",
                    output=ArtifactRef(path=f"/m/{HOSTILE}.tuned.onnx", format="onnx", sha256="b" * 64),
                    measurements={"size": {"bytes": 900}, "latency": lat, "accuracy": {"metric": "top1", "top1": 0.9},
                                  "tune": tune})]
    rep = Report(command=f"optkit run {HOSTILE}.yaml", run={"run_id": HOSTILE}, stages=stages)
    rep.gates = evaluate(rep, parse_gates(["size_mb <= 1", "latency_p99_ms <= 2"]))
    rep.machine.update(processor=HOSTILE, system=HOSTILE, cpu_count=HOSTILE)
    rep.versions[HOSTILE] = HOSTILE
    return rep


def _control_bytes(data: bytes) -> list[int]:
    return sorted({b for b in data if b < 0x20 and b not in b"\n\t\r"} | ({0x7f} if b"\x7f" in data else set()))


def test_report_html_embeds_no_control_byte(cli, tmp_path):
    from optkit.report.html import to_html

    rep = hostile_report()
    html = to_html(rep)
    assert _control_bytes(html.encode()) == [], _control_bytes(html.encode())
    assert "\u202e" not in html                                   # nor a bidi override that reverses the text
    assert "evil\\x1b[31m\\x01name" in html                       # shown as the console shows it
    assert "<svg" in html and "cannot judge" in html
    # through the CLI too: report render of the report file, which stays byte-identical
    path = tmp_path / "report.json"
    rep.save(path)
    before = path.read_bytes()
    r = cli("report", "render", path, "--format", "html", "-o", tmp_path / "r.html")
    assert r.rc == 0, r.err
    data = (tmp_path / "r.html").read_bytes()
    assert _control_bytes(data) == [] and "evil\\x1b[31m\\x01name" in data.decode()
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "report.json"]


def test_report_html_escapes_markup_in_names():
    from optkit.report.html import to_html

    rep = hostile_report()
    rep.stages[0].name = '<img src=x onerror="alert(1)">'
    html = to_html(rep)
    assert "<img" not in html and "&lt;img src=x" in html
    assert not re.search(r"<script", html, re.I) and np.isfinite(len(html))


@pytest.mark.parametrize("raw", ["[" * 100_000, '{"cluster": {}, "task": {"type": "worker", "index": "x"}}', "[1]"])
def test_a_damaged_tf_config_is_one_usage_error(monkeypatch, raw):
    from optkit.core.errors import UsageError
    from optkit.passes.training.distributed import tf_config

    monkeypatch.setenv("TF_CONFIG", raw)
    with pytest.raises(UsageError, match="TF_CONFIG is not valid JSON"):
        tf_config()
