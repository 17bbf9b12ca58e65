"""One figure whichever door a user takes: a command, its --print-recipe through `optkit run`, and the Python
API (`optkit.run`, `optkit.run_pass`) give the same verdicts and figures, and every speedup against the input
comes from one paired, call-by-call timing with its 95% interval ("same" inside the noise)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT


def _digits_job(samples: Path) -> dict:
    """The main job on the sample digits CNN (the quickstart before it took a model of milliseconds): simplify, then
    static int8, measured as the quickstart measures."""
    return {"version": 1, "name": "quickstart", "model": {"path": str(samples / "torch_cnn.onnx")},
            "data": {"calibration": {"path": str(samples / "digits_calib_nchw.npz")},
                     "eval": {"path": str(samples / "digits_eval_nchw.npz"), "metric": "top1"}},
            "stages": [{"pass": "simplify.onnx", "name": "simplify"},
                       {"pass": "quantize.onnx-static", "name": "int8",
                        "config": {"calibration_method": "minmax", "allow_slower": True}}],
            "measure": {"provider": "cpu", "threads": 1, "batch": 1, "warmup": 10, "runs": 50, "trials": 5,
                        "normalize": True},
            "gates": ["size_ratio <= 0.35", "accuracy_drop <= 0.01"]}


def _change(stage: dict) -> dict:
    return stage["measurements"]["latency_change"]


def _overlap(a: dict, b: dict) -> bool:
    """Two paired ratios agree: their 95% intervals overlap once each is widened by the ±3% that reads "same"
    (measure.paired.MIN_CHANGE: two sessions of one file differ by that much for their whole life, which no
    interval of one run sees)."""
    from optkit.measure.paired import MIN_CHANGE

    (lo1, hi1), (lo2, hi2) = a["ratio_ci95"], b["ratio_ci95"]
    return lo1 * (1 - MIN_CHANGE) <= hi2 * (1 + MIN_CHANGE) and lo2 * (1 - MIN_CHANGE) <= hi1 * (1 + MIN_CHANGE)


def _api(code: str, cwd: Path) -> dict:
    """Run `code` (which sets `report`) in a fresh interpreter with the optkit under test; the report as JSON."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, "-c", "import optkit\n" + code + "\nprint(report.to_json())"],
                       capture_output=True, text=True, cwd=cwd, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def assert_one_story(report_json: Path) -> None:
    """A report tells one latency story per stage, whatever the machine's speed or load: its p50, speedup and
    samples/s cells agree in direction with each other and with the stage's paired note (all read "same" when the
    paired interval holds 1.0), and a pass's own race figure is labelled as the search's."""
    from optkit.report.schema import Report
    from optkit.report.table import stage_rows

    report = Report.load(report_json)
    rows = stage_rows(report)
    base = rows[0]
    for stage, row in zip(report.stages[1:], rows[1:]):
        cells = (row["p50 ms"], row["speedup"], row["samples/s"])
        change = stage.measurements.get("latency_change")
        paired = [n for n in stage.notes if n.endswith("(against the input, timed call by call: the figure the "
                                                        "tables use)")]
        assert change is not None and len(paired) == 1, (stage.name, stage.notes)
        if not change["significant"]:
            assert cells == ("same", "same", "same"), (stage.name, row)
            assert "no significant change" in paired[0], paired
        else:
            slower = change["ratio"] > 1
            p50, speedup = float(row["p50 ms"]), float(row["speedup"].rstrip("x"))
            tput = float(row["samples/s"].replace(",", ""))
            base_p50, base_tput = float(base["p50 ms"].split()[0]), float(base["samples/s"].replace(",", ""))
            assert (p50 > base_p50, speedup < 1, tput < base_tput) == (slower,) * 3, (stage.name, row, base)
            assert ("slower" if slower else "faster") in paired[0], (paired, row)
        race = [n for n in stage.notes if "the parent's latency" in n and "search race" not in n]
        assert race == [], race


FIXED_INT8 = {"format": "qoperator", "activation_type": "uint8", "per_channel": False, "reduce_range": False,
              "latency_search": False}


def test_quickstart_speedups_are_paired_and_agree_with_the_command(cli, tmp_path, samples):
    """Three runs of the main job: the simplify stage (the same 11 ops) reads "same" every time, and the int8
    stage's interval overlaps `optkit quantize`'s on the same model and data (the simplified model, whose speed
    is the input's). The int8 choice is fixed here: the search picks among candidates of equal speed by timing,
    so two runs may keep two different models."""
    rec = _digits_job(samples)
    rec["stages"][1]["config"].update(FIXED_INT8)
    recipe = tmp_path / "quickstart.yaml"
    recipe.write_text(yaml.safe_dump(rec))
    int8 = []
    for i in range(3):
        r = cli("run", recipe, "--no-cache", "--workspace", tmp_path / "runs", "--json")
        assert r.rc == 0, r.err
        stages = {s["name"]: s for s in json.loads(r.out)["stages"]}
        simplify = _change(stages["simplify"])
        assert not simplify["significant"], simplify
        assert "| same |" in (tmp_path / "runs" / "quickstart" / "latest" / "report.md").read_text() or i
        assert_one_story(tmp_path / "runs" / "quickstart" / "latest" / "report.json")
        int8.append(stages["int8"])
        simplified = stages["simplify"]["output"]["path"]
    q = cli("quantize", simplified, "-o", tmp_path / "q.onnx", "--calibration-data",
            samples / "digits_calib_nchw.npz", "--eval-data", samples / "digits_eval_nchw.npz", "--metric", "top1",
            "--calibration-method", "minmax", "--format", "qoperator", "--activation-type", "uint8", "--per-tensor",
            "--no-reduce-range", "--no-latency-search", "--allow-slower", "--json")
    assert q.rc == 0, q.err
    command = json.loads(q.out)["stages"][-1]
    assert all(run["output"]["sha256"] == command["output"]["sha256"] for run in int8)
    assert any(_overlap(_change(command), _change(run)) for run in int8), (_change(command), [_change(r) for r in int8])


def test_quickstart_report_tells_one_latency_story(cli, tmp_path, samples):
    """The quickstart as a user runs it (the int8 search included): every stage's p50, speedup and samples/s agree
    with each other and with its notes, and the console and Markdown print the same cells as report.json's rows."""
    rec = _digits_job(samples)
    recipe = tmp_path / "quickstart.yaml"
    recipe.write_text(yaml.safe_dump(rec))
    r = cli("run", recipe, "--no-cache", "--workspace", tmp_path / "runs")
    assert r.rc == 0, r.err
    latest = tmp_path / "runs" / "quickstart" / "latest"
    assert_one_story(latest / "report.json")
    from optkit.report.schema import Report
    from optkit.report.table import LEGEND, stage_rows

    markdown = (latest / "report.md").read_text()
    for row in stage_rows(Report.load(latest / "report.json")):
        assert f"| {row['p50 ms']} |" in markdown and f"| {row['speedup']} |" in markdown, row
    assert "the first stage's figures times the paired ratio" in LEGEND and "paired ratio" in markdown
    assert "paired ratio" in " ".join(r.out.split())


def test_command_recipe_and_python_api_give_the_same_figures(cli, tmp_path, samples):
    model, evald = samples / "torch_cnn.onnx", samples / "digits_eval_nchw.npz"
    # dynamic INT8 without the latency search: the same model whichever door (the search picks by timing)
    # --allow-slower: dynamic INT8 of this 18 us CNN sits at 1.01-1.05x its parent, at the refusal line
    args = ["quantize", model, "-o", tmp_path / "cmd.onnx", "--mode", "dynamic", "--no-latency-search",
            "--allow-slower", "--eval-data", evald, "--metric", "top1"]
    printed = cli(*args, "--print-recipe")
    assert printed.rc == 0, printed.err
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(printed.out)
    command = cli(*args, "--json")
    assert command.rc == 0, command.err
    via_recipe = cli("run", recipe, "--workspace", tmp_path / "runs", "--no-cache", "--json")
    assert via_recipe.rc == 0, via_recipe.err
    via_run = _api(f"report = optkit.run({str(recipe)!r}, workspace={str(tmp_path / 'api-runs')!r}, cache=False)",
                   tmp_path)
    via_pass = _api(f"report = optkit.run_pass('quantize.onnx-dynamic', {str(model)!r}, "
                    f"{str(tmp_path / 'api.onnx')!r}, eval={str(evald)!r}, metric='top1', latency_search=False, allow_slower=True)",
                    tmp_path)
    reports = {"command": json.loads(command.out), "recipe": json.loads(via_recipe.out), "optkit.run": via_run,
               "optkit.run_pass": via_pass}
    first = reports["command"]["stages"][-1]
    for door, rep in reports.items():
        stage = rep["stages"][-1]
        m, m0 = stage["measurements"], first["measurements"]
        assert stage["output"]["sha256"] == first["output"]["sha256"], door
        assert m["size"]["bytes"] == m0["size"]["bytes"], door
        assert m["accuracy"]["top1"] == m0["accuracy"]["top1"], door
        assert m["fidelity"]["cosine"] == pytest.approx(m0["fidelity"]["cosine"]), door
        assert "latency_change" in m, door
        assert _overlap(m["latency_change"], m0["latency_change"]), (door, m["latency_change"], m0["latency_change"])
    assert (tmp_path / "api.onnx").read_bytes() == (tmp_path / "cmd.onnx").read_bytes()
    assert not list(tmp_path.glob("optkit-run-pass-*"))


def test_run_pass_refuses_what_the_command_refuses(tmp_path, samples):
    shutil.copy(samples / "torch_cnn.onnx", tmp_path / "m.onnx")
    code = ("from optkit.core.errors import UsageError\n"
            "try:\n    optkit.run_pass('simplify.onnx', 'm.onnx', 'm.onnx')\n"
            "except UsageError as e:\n    print('refused:', e.message)\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, "-c", "import optkit\n" + code], capture_output=True, text=True, cwd=tmp_path,
                       env=env, timeout=300)
    assert "refused:" in r.stdout and "also an input" in r.stdout, r.stdout + r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_speedup_gate_reads_the_paired_interval(tmp_path):
    from optkit.pipeline.gates import evaluate, parse_gates
    from optkit.report.schema import ArtifactRef, Report, Stage

    ref = ArtifactRef(path="m.onnx", format="onnx", sha256="0")
    lat = {"p50_ms": 1.0, "trials": 1}
    stages = [Stage(name="input", output=ref, measurements={"latency": lat}),
              Stage(name="fast", output=ref, measurements={"latency": {"p50_ms": 2.0, "trials": 1},  # apart: slower
                                                           "latency_change": {"ratio": 0.5, "ratio_ci95": [0.45, 0.55],
                                                                              "significant": True, "trials": 5}})]
    (g,) = evaluate(Report(stages=stages), parse_gates(["speedup@fast >= 1.5"]), None)
    assert g.passed and g.value == pytest.approx(2.0) and "call by call" in g.detail
    (g,) = evaluate(Report(stages=stages), parse_gates(["speedup@fast >= 2.0"]), None)
    assert g.verdict == "cannot judge"  # 1.82-2.22x straddles 2.0


def test_printed_recipe_measures_like_the_command(cli, samples, tmp_path):
    r = cli("simplify", samples / "torch_cnn.onnx", "-o", tmp_path / "s.onnx", "--print-recipe")
    measure = yaml.safe_load(r.out)["measure"]
    assert measure["trials"] == 1 and measure["normalize"] is False
    assert measure["threads"] is None and measure["runs"] == 100  # the command's defaults, not a recipe's


def test_a_command_runs_the_recipe_it_prints(cli, tmp_path, samples):
    """A single-stage command is a recipe builder: its report carries the recipe that ran, which is exactly
    what --print-recipe prints, and it is timed as that recipe says (paired, each model once)."""
    args = ["simplify", samples / "torch_cnn.onnx", "-o", tmp_path / "s.onnx", "--data",
            samples / "digits_eval_nchw.npz", "--threads", "1"]
    printed = cli(*args, "--print-recipe")
    assert printed.rc == 0, printed.err
    recipe = yaml.safe_load(printed.out)
    assert recipe["measure"]["latency"] == "paired"
    assert not (tmp_path / "s.onnx").exists()
    r = cli(*args, "--json")
    assert r.rc == 0, r.err
    report = json.loads(r.out)
    assert report["recipe"] == recipe
    assert report["run"] is None  # the scratch workspace is gone; the result is where -o says
    first, last = report["stages"]
    assert last["output"]["path"] == str(tmp_path / "s.onnx") and (tmp_path / "s.onnx").exists()
    assert first["measurements"]["latency"]["p50_ms"] > 0 and last["measurements"]["latency"]["p50_ms"] > 0
    assert "ratio_ci95" in last["measurements"]["latency_change"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.onnx"]


# one setting of every dimension: the search has one setting to choose, so every door chooses the same
ONE_SETTING = ["--space", "threads=1", "--space", "batch=1", "--space", "concurrency=1", "--space",
               "execution_mode=sequential", "--space", "graph_optimization=all", "--space", "sessions=shared",
               "--space", "cpu_mem_arena=true", "--space", "mem_pattern=true", "--space", "provider=cpu"]


def test_tune_command_recipe_and_run_pass_report_the_same_figures(cli, tmp_path, samples):
    """`optkit tune`, its --print-recipe through `optkit run`, and `optkit.run_pass('tune.onnx', ...)` run one
    recipe: the same stages, the same setting chosen (a one-setting space, seed 0), and what the command prints
    and writes to best.json is the report's measurements.tune, measured once per run."""
    model = samples / "torch_cnn.onnx"
    args = ["tune", model, *ONE_SETTING, "--trials", "1", "--trial-seconds", "0.2", "--confirm", "0", "--seed", "0",
            "-o", tmp_path / "best.json"]
    printed = cli(*args, "--print-recipe")
    assert printed.rc == 0, printed.err
    assert not (tmp_path / "best.json").exists()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(printed.out)
    command = cli(*args, "--json", "--report", tmp_path / "report.json")
    assert command.rc == 0, command.err
    via_recipe = cli("run", recipe, "--workspace", tmp_path / "runs", "--no-cache", "--json")
    assert via_recipe.rc == 0, via_recipe.err
    space = {k.split("=")[0]: [k.split("=")[1]] for k in ONE_SETTING[1::2]}
    via_pass = _api(f"report = optkit.run_pass('tune.onnx', {str(model)!r}, {str(tmp_path / 'api.onnx')!r}, "
                    f"space={space!r}, trials=1, trial_seconds=0.2, confirm=0, seed=0)", tmp_path)
    reports = {"command": json.loads(command.out), "recipe": json.loads(via_recipe.out), "run_pass": via_pass}
    assert reports["command"]["recipe"] == yaml.safe_load(printed.out)  # the command ran the recipe it prints
    first = reports["command"]["stages"][-1]["measurements"]["tune"]
    for door, rep in reports.items():
        assert [s.get("pass") for s in rep["stages"]] == [None, "tune.onnx"], door
        tune = rep["stages"][-1]["measurements"]["tune"]
        assert tune["best"]["setting"] == first["best"]["setting"] and tune["space"] == first["space"], door
        assert tune["study"]["trials"] == 1 and tune["best"]["figures"]["throughput_per_s"] > 0, door
    # the command's figures: best.json and the saved report are the printed report's measurements.tune
    best = json.loads((tmp_path / "best.json").read_text())
    assert best == {"model": str(model), "model_sha256": reports["command"]["stages"][0]["output"]["sha256"],
                    **{k: v for k, v in first.items() if k != "trials"}}
    assert json.loads((tmp_path / "report.json").read_text())["stages"][-1]["measurements"]["tune"] == first
    # and the human output prints those same figures (the run's own)
    human = cli(*args, "--report", tmp_path / "human.json")
    assert human.rc == 0, human.err
    tune = json.loads((tmp_path / "human.json").read_text())["stages"][-1]["measurements"]["tune"]
    f = tune["trials"][0]["figures"]
    assert f"{f['throughput_per_s']:,.0f}" in human.out and f"{f['p50_ms']:.3f}" in human.out, human.out
    assert f"best: {tune['best']['label']}" in human.out


def test_profile_command_recipe_and_run_pass_report_the_same_figures(cli, tmp_path, samples):
    """`optkit profile`, its --print-recipe through `optkit run`, and `optkit.run_pass('profile.onnx', ...)` run
    one recipe: the same stages and the same profiled graph (its op types and nodes); the command's JSON and
    table are the figures of its report's measurements.profile."""
    model = samples / "torch_cnn.onnx"
    args = ["profile", model, "--runs", "5", "--threads", "1", "--top", "3"]
    printed = cli(*args, "--print-recipe")
    assert printed.rc == 0, printed.err
    rec = yaml.safe_load(printed.out)
    assert rec["stages"] == [{"pass": "profile.onnx", "config": {"top": 3, "runs": 5, "threads": 1, "trace": False}}]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(printed.out)
    command = cli(*args, "--json")
    assert command.rc == 0, command.err
    via_recipe = cli("run", recipe, "--workspace", tmp_path / "runs", "--no-cache", "--json")
    assert via_recipe.rc == 0, via_recipe.err
    via_pass = _api(f"report = optkit.run_pass('profile.onnx', {str(model)!r}, {str(tmp_path / 'api.onnx')!r}, "
                    "runs=5, threads=1, top=3, trace=False)", tmp_path)
    shown = json.loads(command.out)
    for door, rep in {"recipe": json.loads(via_recipe.out), "run_pass": via_pass}.items():
        assert [s.get("pass") for s in rep["stages"]] == [None, "profile.onnx"], door
        p = rep["stages"][-1]["measurements"]["profile"]
        assert p["runs"] == shown["runs"] == 5 and p["threads"] == shown["threads"] == 1, door
        assert p["node_count"] == shown["node_count"], door
        assert len(p["ops"]) == len(shown["ops"]) == 3, door
        assert set(p) >= set(shown) - {"model"}, door  # the command shows the stage's figures, nothing else
    # the command's table prints its report's figures: one run, read once, shown both ways
    human = cli(*args)
    assert human.rc == 0, human.err
    assert "time per op type (top 3)" in human.out and "p50 latency" in human.out
