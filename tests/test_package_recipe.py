"""`package:` in a recipe: the tuned stage's model packaged with the run's report and the tune stage's setting,
only when every gate passed; a repository optkit may not write into fails the run before any stage."""
from __future__ import annotations

import json

import yaml

from conftest import ROOT, one_error_line

RECIPE = {
    "version": 1, "name": "pkg-recipe",
    "model": {"path": str(ROOT / "sample_models" / "torch_cnn.onnx")},
    "data": {"eval": {"path": str(ROOT / "sample_models" / "digits_eval_nchw.npz"), "metric": "top1"}},
    "measure": {"runs": 20, "trials": 2},
    "stages": [{"pass": "tune.onnx", "name": "tune",
                "config": {"trials": 3, "trial_seconds": 0.3, "confirm": 0, "space": {"batch": [1, 8]}}}],
    "package": [{"to": "triton", "output": "repo", "name": "cnn", "tag": "v1.0"}],
}


def test_recipe_packages_the_tuned_model_when_gates_pass(cli, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    r = cli("run", recipe, "--workspace", tmp_path / "runs")
    assert r.rc == 0, r.err
    assert "packaged: triton cnn version 1" in r.out
    lin = json.loads((tmp_path / "repo" / "cnn" / "1" / "optkit-package.json").read_text())
    assert [p["pass"] for p in lin["passes"]] == [None, "tune.onnx"]
    assert lin["tuned"]["setting"]["threads"] and lin["measured"]["latency"]["p50_ms"] > 0
    config = (tmp_path / "repo" / "cnn" / "config.pbtxt").read_text()
    assert f"max_batch_size: {lin['tuned']['setting']['batch']}" in config

    # a failed gate: nothing packaged
    recipe.write_text(yaml.safe_dump({**RECIPE, "gates": ["size_mb <= 0.0001"],
                                      "package": [{**RECIPE["package"][0], "tag": "v1.1"}]}))
    r = cli("run", recipe, "--workspace", tmp_path / "runs")
    assert r.rc == 1 and "not packaged: a gate failed" in r.out
    assert sorted(p.name for p in (tmp_path / "repo" / "cnn").iterdir()) == ["1", "config.pbtxt",
                                                                            "optkit-versions.json"]
    # a repository holding a file optkit did not write: exit 2 before any stage runs
    (tmp_path / "repo" / "README").write_text("mine")
    r = cli("run", recipe, "--workspace", tmp_path / "runs2")
    assert r.rc == 2 and "holds 'README', which optkit did not create" in one_error_line(r)
    assert not (tmp_path / "runs2").exists()
