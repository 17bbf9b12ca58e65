"""Single-stage commands print the one-stage recipe they are equivalent to, and that recipe runs."""
from __future__ import annotations

import pytest
import yaml

from conftest import no_result_files


@pytest.mark.parametrize("args, pass_name", [
    (["convert", "torch_cnn.py:make_model", "--data", "digits_eval_nchw.npz"], "convert.torch"),
    (["simplify", "torch_cnn.onnx"], "simplify.onnx"),
    (["trt", "build", "torch_cnn.onnx", "--precision", "fp16"], "tensorrt.build"),
    (["prune", "keras_cnn.keras", "--train", "digits_train_nhwc.npz"], "prune.keras"),
    (["tflite", "keras_cnn.keras", "--mode", "int8", "--calib", "digits_calib_nhwc.npz"], "tflite.export"),
])
def test_printed_recipe_is_valid_and_nothing_runs(cli, samples, tmp_path, args, pass_name):
    out = tmp_path / "out.model"
    r = cli(*args, "-o", out, "--print-recipe", cwd=samples)
    assert r.rc == 0, r.err
    recipe = yaml.safe_load(r.out)
    assert recipe["stages"][0]["pass"] == pass_name
    for flag, key in (("--train", "train"), ("--calib", "calibration")):
        if flag in args:  # the data the command was given is in the recipe
            assert recipe["data"][key]["path"].endswith(args[args.index(flag) + 1])
    assert no_result_files(tmp_path) == []  # printing runs nothing
    path = tmp_path / "recipe.yaml"
    path.write_text(r.out)
    dry = cli("run", path, "--dry-run")
    assert dry.rc == 0, dry.err


def test_printed_simplify_recipe_runs_like_the_command(cli, samples, tmp_path):
    r = cli("simplify", samples / "torch_cnn.onnx", "-o", tmp_path / "s.onnx", "--print-recipe")
    path = tmp_path / "recipe.yaml"
    path.write_text(r.out)
    run = cli("run", path, "--workspace", tmp_path / "runs", "--json")
    assert run.rc == 0, run.err
    import json

    stages = json.loads(run.out)["stages"]
    assert [s["name"] for s in stages][0] == "input" and stages[-1]["pass"] == "simplify.onnx"
    assert stages[-1]["measurements"]["fidelity"]["max_abs_error"] <= 1e-5
