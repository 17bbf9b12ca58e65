"""Recipes: strict loading with YAML line numbers, validation before work (exit 2), dry runs, the starter,
one-stage recipes, and the ready recipes in recipes/ (skipped while a pass they need is not registered)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import _testpasses
import pytest

from optkit.core.errors import UsageError
from optkit.passes import all_passes
from optkit.pipeline.recipe import from_dict, load_recipe, one_stage_recipe
from optkit.pipeline.validation import validate

from conftest import ROOT, SAMPLES, one_error_line

RECIPES = ROOT / "recipes"
GOOD = f"""\
version: 1
name: good
model:
  path: {SAMPLES}/torch_cnn.onnx
data:
  eval:
    path: {SAMPLES}/digits_eval_nchw.npz
    metric: top1
stages:
  - pass: test.copy
    name: copy
  - pass: test.scale
    config:
      factor: 2.0
measure:
  runs: 5
  trials: 2
gates:
  - size_ratio <= 1.01
  - accuracy_drop <= 0.01
"""


def variant(tmp_path: Path, old: str, new: str) -> Path:
    assert old in GOOD
    p = tmp_path / "r.yaml"
    p.write_text(GOOD.replace(old, new))
    return p


def test_good_recipe_loads_and_validates(tmp_path):
    loaded = load_recipe(variant(tmp_path, "", ""))
    assert loaded.stage_names() == ["copy", "test"]
    assert [c.name for c, _ in validate(loaded)] == ["test.copy", "test.scale"]


# (old text, new text, expected line, words in the error)
BAD = [
    ("name: good", "name: good\nmodle: x.onnx", 3, "modle: unknown key"),
    ("  runs: 5", "  runz: 5", 16, "measure.runz: unknown key"),
    ("  runs: 5", "  runs: many", 16, "measure.runs: input should be a valid integer"),
    ("      factor: 2.0", "      factor: big", 14, "stages[1].config.factor: input should be a valid number"),
    ("      factor: 2.0", "      factr: 2.0", 14, "stages[1].config.factr: unknown key (pass test.scale)"),
    ("  - pass: test.copy", "  - pass: test.copyy", 10, "unknown pass 'test.copyy'; did you mean 'test.copy'"),
    ("  - pass: test.copy", "  - pass: test.keras-only", 10, "test.keras-only accepts keras, but the model gives onnx"),
    ("torch_cnn.onnx", "nothere.onnx", 4, "model.path: model"),
    ("digits_eval_nchw.npz", "nothere.npz", 7, "data.eval.path: data"),
    ("  - accuracy_drop <= 0.01", "  - latency_regression_pct <= 10", 20, "baseline"),
    ("  - accuracy_drop <= 0.01", "  - accuracy_dorp <= 0.01", 20, "did you mean 'accuracy_drop'"),
    ("  - accuracy_drop <= 0.01", "  - size_mb@nope <= 1", 20, "no stage named 'nope'"),
    ("  trials: 2", "  trials: 2\n  latency: false\ngates_extra: 1", 19, "gates_extra: unknown key"),
    ("version: 1", "version: 7", 1, "recipe version 1, not 7"),
    ("    name: copy", "    name: copy\n    from: nope", 12, "no earlier stage named 'nope'"),
    ("name: good", "name: good\n  bad: [", 3, "not valid YAML"),
]


@pytest.mark.parametrize("old, new, line, words", BAD, ids=[b[3][:30] for b in BAD])
def test_bad_recipes_point_at_line_and_key(tmp_path, old, new, line, words):
    p = variant(tmp_path, old, new)
    with pytest.raises(UsageError) as e:
        validate(load_recipe(p))
    msg = e.value.message
    assert msg.startswith(f"{p}:{line}: ") and words in msg, msg


def test_gate_on_unmeasured_figure(tmp_path):
    p = variant(tmp_path, "  trials: 2", "  trials: 2\n  latency: false")
    (tmp_path / "x.yaml").write_text(p.read_text().replace("  - size_ratio <= 1.01", "  - speedup >= 1.2"))
    with pytest.raises(UsageError, match=r"x.yaml:20: gates\[0\]: gate 'speedup >= 1.2' cannot be checked: "
                                         r"latency is not measured"):
        validate(load_recipe(tmp_path / "x.yaml"))
    no_eval = tmp_path / "y.yaml"
    no_eval.write_text(GOOD.replace(f"  eval:\n    path: {SAMPLES}/digits_eval_nchw.npz\n    metric: top1\n",
                                    f"  calibration: {{path: {SAMPLES}/digits_calib_nchw.npz}}\n"))
    with pytest.raises(UsageError, match="accuracy is not measured"):
        validate(load_recipe(no_eval))


def test_cli_bad_input_exit_2_one_line_nothing_written(tmp_path):
    ws = tmp_path / "runs"
    for old, new, line, words in (BAD[1], BAD[6], BAD[8], BAD[9]):
        r = _testpasses.run_cli("run", variant(tmp_path, old, new), "--workspace", ws)
        assert r.rc == 2, r.err
        err = one_error_line(r)
        assert f"r.yaml:{line}:" in err and words in err, err
    assert not ws.exists()                          # caught before any work started
    r = _testpasses.run_cli("run", tmp_path / "missing.yaml")
    assert r.rc == 2 and "recipe" in one_error_line(r) and "not found" in one_error_line(r)


def test_dry_run_prints_plan_and_runs_nothing(tmp_path):
    p = variant(tmp_path, "", "")
    r = _testpasses.run_cli("run", p, "--dry-run", "--workspace", tmp_path / "runs")
    assert r.rc == 0, r.err
    for words in ("01-copy", "02-test", "test.scale", "factor=2.0", "size_ratio <= 1.01", "nothing run"):
        assert words in r.out, (words, r.out)
    j = _testpasses.run_cli("run", p, "--dry-run", "--json")
    plan = json.loads(j.out)
    assert [s["stage"] for s in plan["stages"]] == ["00-input", "01-copy", "02-test"] and plan["valid"]
    assert not (tmp_path / "runs").exists()


def test_recipe_new_writes_a_commented_starter(cli, tmp_path):
    p = tmp_path / "mine.yaml"
    r = cli("recipe", "new", p)
    assert r.rc == 0 and p.exists(), r.err
    text = p.read_text()
    assert text.count("#") > 15 and "gates:" in text
    loaded = load_recipe(p)                        # schema-valid as written
    assert loaded.name == "mine" and [s.pass_name for s in loaded.recipe.stages] == ["simplify.onnx",
                                                                                      "quantize.onnx-static"]
    again = cli("recipe", "new", p)
    assert again.rc == 2 and "exists" in one_error_line(again)


def test_one_stage_recipe_round_trips(tmp_path):
    from optkit.measure.model import DataSpec, MeasureSettings

    rec = one_stage_recipe("test.scale", str(SAMPLES / "torch_cnn.onnx"), {"factor": 3.0},
                           settings=MeasureSettings(threads=1), eval_data=DataSpec(path=str(SAMPLES / "digits_eval_nchw.npz")),
                           metric="top1")
    loaded = from_dict(rec)
    assert loaded.recipe.stages[0].config == {"factor": 3.0} and loaded.recipe.data.eval.metric == "top1"
    validate(loaded)


def test_print_recipe_helper(tmp_path, capsys):
    from optkit.cli.common import run_single_stage
    from optkit.measure.model import MeasureSettings

    run_single_stage("test.scale", str(SAMPLES / "torch_cnn.onnx"), str(tmp_path / "o.onnx"), {"factor": 2.0},
                     command="x", settings=MeasureSettings(), print_recipe=True)
    out = capsys.readouterr().out
    assert "pass: test.scale" in out and "factor: 2.0" in out and not (tmp_path / "o.onnx").exists()
    p = tmp_path / "printed.yaml"
    p.write_text(out)
    validate(load_recipe(p))


# ---------------------------------------------------------------- the ready recipes

def needs(*passes):
    have = all_passes()
    missing = [p for p in passes if p not in have]
    if missing:
        pytest.skip(f"pass {', '.join(missing)} is not registered yet")


def recipe_passes(path: Path) -> list[str]:
    import yaml

    return [s["pass"] for s in yaml.safe_load(path.read_text())["stages"]]


@pytest.mark.parametrize("name", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_ready_recipes_are_documented_and_dry_run(cli, name):
    path = RECIPES / name
    text = path.read_text()
    assert text.startswith("# ") and "optkit run recipes/" in text.split("version:")[0], "document it at the top"
    needs(*recipe_passes(path))
    r = cli("run", path, "--dry-run", "--json")
    assert r.rc == 0, r.err
    plan = json.loads(r.out)
    assert len(plan["stages"]) == len(recipe_passes(path)) + 1 and plan["gates"]


def test_quickstart_runs_in_under_a_minute(tmp_path):
    """The README's first command: its console (progress on stderr, the story on stdout) in at most 25 lines at 100
    columns, every gate passed (size, speed, accuracy), the reports written."""
    path = RECIPES / "quickstart.yaml"
    needs(*recipe_passes(path))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "optkit", "run", str(path), "--workspace", str(tmp_path / "runs")],
                       capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "COLUMNS": "100"}, timeout=600)
    took = time.perf_counter() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines() + r.stderr.splitlines()
    assert len(lines) <= 25, "\n".join(lines)
    run = tmp_path / "runs" / "quickstart" / "latest"
    rep = json.loads((run / "report.json").read_text())
    assert [s["name"] for s in rep["stages"]] == ["input", "int8"]
    assert all(g["passed"] for g in rep["gates"]) and len(rep["gates"]) == 3
    assert took < 60, took
    for f in ("report.json", "report.md", "report.html", "junit.xml", "01-int8/model.onnx"):
        assert (run / f).exists(), f


def test_torch_prune_recipe_chains_prune_convert_and_int8(cli, tmp_path):
    path = RECIPES / "torch-prune-int8.yaml"
    needs(*recipe_passes(path))
    r = cli("run", path, "--workspace", tmp_path / "runs", "--json")
    assert r.rc == 0, r.err
    rep = json.loads(r.out)
    stages = {s["name"]: s for s in rep["stages"]}
    assert [s["name"] for s in rep["stages"]] == ["input", "pruned", "onnx", "int8"]
    assert stages["pruned"]["measurements"]["pruning"]["parameter_ratio"] < 0.3
    assert all(g["passed"] for g in rep["gates"]) and len(rep["gates"]) == 3
    assert (tmp_path / "runs" / "torch-prune-int8" / "latest" / "03-int8" / "model.onnx").exists()
