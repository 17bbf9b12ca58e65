"""The pipeline over tiny test passes: workspace layout, cache, resume, branches, gates, nothing half-written."""
from __future__ import annotations

import json
from pathlib import Path

import _testpasses
import pytest
import yaml

from optkit.core.artifact import Artifact
from optkit.core.errors import PassError
from optkit.pipeline.recipe import load_recipe
from optkit.pipeline.runner import RunOptions, execute
from optkit.pipeline.stage import run_pass

from conftest import SAMPLES, one_error_line

FAST = {"runs": 5, "warmup": 1, "trials": 2, "threads": 1}


def write_recipe(folder: Path, stages, gates=(), name="t", **extra) -> Path:
    rec = {"version": 1, "name": name, "model": {"path": str(SAMPLES / "torch_cnn.onnx")},
           "data": {"calibration": {"path": str(SAMPLES / "digits_calib_nchw.npz")},
                    "eval": {"path": str(SAMPLES / "digits_eval_nchw.npz"), "metric": "top1",
                             "max_samples": 100}},
           "stages": stages, "measure": dict(FAST), "gates": list(gates), **extra}
    p = folder / f"{name}.yaml"
    p.write_text(yaml.safe_dump(rec, sort_keys=False))
    return p


def ran(marker: Path) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def test_run_pass_keeps_its_contract(tmp_path):
    src = Artifact.load(SAMPLES / "torch_cnn.onnx")
    res = run_pass(src, "test.scale", {"factor": 2.0}, tmp_path / "out.onnx")
    assert res.output.parent == src.sha256 and Path(res.output.path).exists() and res.pass_name == "test.scale"


def test_layout_cache_and_reports(tmp_path):
    m1, m2 = tmp_path / "m1", tmp_path / "m2"
    recipe = write_recipe(tmp_path, [{"pass": "test.copy", "name": "copy", "config": {"marker": str(m1)}},
                                     {"pass": "test.scale", "name": "scaled", "config": {"marker": str(m2)}}],
                          gates=["size_ratio <= 1.01", "accuracy_drop <= 0.0"])
    ws = tmp_path / "runs"
    out = execute(load_recipe(recipe), RunOptions(workspace=ws))
    run = out.run_dir
    assert run.parent == ws / "t" and (ws / "t" / "latest").resolve() == run.resolve()
    assert sorted(p.name for p in run.iterdir()) == ["00-input", "01-copy", "02-scaled", "junit.xml", "report.html",
                                                    "report.json", "report.md", "run.json"]
    for d in ("00-input", "01-copy", "02-scaled"):
        assert (run / d / "report.json").is_file()
    assert (run / "01-copy" / "model.onnx").is_file()
    assert json.loads((run / "run.json").read_text())["status"] == "complete"
    rep = json.loads((run / "report.json").read_text())
    assert [s["name"] for s in rep["stages"]] == ["input", "copy", "scaled"]
    assert rep["stages"][2]["input"]["sha256"] == rep["stages"][1]["output"]["sha256"]
    assert rep["stages"][2]["measurements"]["test_calibration_samples"] == 100   # data reached the pass
    lat = rep["stages"][1]["measurements"]["latency"]
    assert lat["trials"] == 2 and len(lat["trial_p50_ms"]) == 2 and lat["normalized"] > 0
    assert rep["stages"][1]["measurements"]["fidelity"]["cosine"] > 0.9999
    assert all(g["passed"] for g in rep["gates"]) and len(rep["gates"]) == 2
    assert (ran(m1), ran(m2)) == (1, 1)

    again = execute(load_recipe(recipe), RunOptions(workspace=ws))
    assert again.run_dir != run                                  # a new run, its stages from the cache
    assert [s.cached for s in again.report.stages] == [False, True, True]
    assert any("reused from the cache" in n for n in again.report.stages[1].notes)
    assert (ran(m1), ran(m2)) == (1, 1)
    assert (again.run_dir / "02-scaled" / "model.onnx").read_bytes() == (run / "02-scaled" / "model.onnx").read_bytes()
    assert "(cached)" in (again.run_dir / "report.md").read_text()

    fresh = execute(load_recipe(recipe), RunOptions(workspace=ws, use_cache=False))
    assert not any(s.cached for s in fresh.report.stages) and (ran(m1), ran(m2)) == (2, 2)

    # a config change is a different cache key, for that stage and the ones after it
    recipe2 = write_recipe(tmp_path, [{"pass": "test.copy", "name": "copy", "config": {"marker": str(m1)}},
                                      {"pass": "test.scale", "name": "scaled",
                                       "config": {"marker": str(m2), "factor": 0.5}}])
    out2 = execute(load_recipe(recipe2), RunOptions(workspace=ws))
    assert [s.cached for s in out2.report.stages] == [False, True, False] and ran(m2) == 3


def test_interrupted_run_resumes_from_last_complete_stage(tmp_path):
    m1, m2, flag = tmp_path / "m1", tmp_path / "m2", tmp_path / "fail-now"
    flag.touch()
    recipe = write_recipe(tmp_path, [{"pass": "test.scale", "name": "a", "config": {"marker": str(m1)}},
                                     {"pass": "test.copy", "name": "b",
                                      "config": {"marker": str(m2), "fail_if_exists": str(flag)}}])
    ws = tmp_path / "runs"
    with pytest.raises(PassError):
        execute(load_recipe(recipe), RunOptions(workspace=ws, use_cache=False))
    run = ws / "t" / "latest"
    assert json.loads((run / "run.json").read_text())["status"] == "failed"
    names = sorted(p.name for p in run.resolve().iterdir())
    assert names == ["00-input", "01-a", "run.json"], names     # nothing half-written: no partial stage
    flag.unlink()
    out = execute(load_recipe(recipe), RunOptions(workspace=ws, use_cache=False))
    assert out.run_dir.resolve() == run.resolve() and out.report.run["resumed"]
    assert any("resumed" in n for n in out.report.stages[1].notes)
    assert (ran(m1), ran(m2)) == (1, 1)                           # stage a did not run again
    assert json.loads((run / "run.json").read_text())["status"] == "complete"
    # a complete run is not resumed: the next one starts afresh
    nxt = execute(load_recipe(recipe), RunOptions(workspace=ws, use_cache=False))
    assert nxt.run_dir != out.run_dir and ran(m1) == 2


def test_branches_with_from(tmp_path):
    recipe = write_recipe(tmp_path, [{"pass": "test.scale", "name": "half", "config": {"factor": 0.5}},
                                     {"pass": "test.copy", "name": "copy", "from": "input"}],
                          gates=["cosine@copy >= 0.9999"])
    out = execute(load_recipe(recipe), RunOptions(workspace=tmp_path / "runs"))
    input_sha = out.report.stages[0].output.sha256
    assert out.report.stages[2].input.sha256 == input_sha
    assert out.gate_results[0].passed


def test_cli_run_gates_exit_1_and_reports(tmp_path):
    recipe = write_recipe(tmp_path, [{"pass": "test.copy", "name": "copy"}],
                          gates=["size_ratio <= 0.5", "accuracy_drop <= 0.01"], name="g")
    r = _testpasses.run_cli("run", recipe, "--workspace", tmp_path / "runs")
    assert r.rc == 1, r.err
    assert "1 of 2 gates failed: size_ratio <= 0.5" in one_error_line(r)
    assert "FAIL" in r.out and "margin" in r.out
    run = tmp_path / "runs" / "g" / "latest"
    junit = (run / "junit.xml").read_text()
    assert junit.count("<testcase") == 2 and junit.count("<failure") == 1
    assert "1 of 2 gates failed" in (run / "report.md").read_text()
    # `optkit gate` on the saved report gives the same verdict, with the recipe's gates
    g = _testpasses.run_cli("gate", run / "report.json")
    assert g.rc == 1 and "size_ratio <= 0.5" in g.out


def test_bad_input_fails_before_work(tmp_path):
    """Pass failures exit 3, leave no stage folder that looks like a result, and later stages never run."""
    flag = tmp_path / "flag"
    flag.touch()
    m = tmp_path / "m"
    recipe = write_recipe(tmp_path, [{"pass": "test.copy", "name": "boom", "config": {"fail_if_exists": str(flag)}},
                                     {"pass": "test.scale", "config": {"marker": str(m)}}], name="f")
    r = _testpasses.run_cli("run", recipe, "--workspace", tmp_path / "runs")
    assert r.rc == 3 and "told to fail" in one_error_line(r)
    run = (tmp_path / "runs" / "f" / "latest").resolve()
    assert sorted(p.name for p in run.iterdir()) == ["00-input", "run.json"] and not m.exists()
