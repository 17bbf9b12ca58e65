"""Red team, round 5 (after issues 39 and 40): each defect class found, tried on every entry point it applies to.

- a path holding a NUL character (a recipe's "\\0", a Python string) was exit 3 "internal error: ValueError";
- an output inside what the run keeps for itself (the workspace's stage cache, the recipe's run folders) was
  written, exit 0;
- an output file named with a trailing '/' (a folder's spelling) was written as a file;
- a key given twice in a file optkit reads back (best.json, CAPACITY.json, split.json, a report, a Prometheus
  answer) was read as its last value, silently;
- the version index took any text, control characters included, as a time, a reason or a registry URI;
- an image folder holding a FIFO named like an image hung every command that reads images;
- the one-stage commands said "recipe: model.path: model /abs/path not found" for the MODEL the user typed;
- tensorrt.build's workspace_mb took any integer (2**70).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

import optkit
from optkit.core.errors import UsageError

from conftest import SAMPLES, no_result_files, one_error_line, run_cli

CNN = SAMPLES / "torch_cnn.onnx"
MIDNIGHT = 1_700_006_400


def _recipe(folder: Path, name: str = "r", **sections) -> Path:
    rec = {"version": 1, "name": name, "model": {"path": str(CNN)}, "stages": [{"pass": "simplify.onnx"}],
           "measure": {"latency": False}, **sections}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(rec, sort_keys=False))
    return path


def _ran_nothing(folder: Path) -> None:
    assert not any(folder.rglob("report.json")), no_result_files(folder)


# ------------------------------------------------------------------ NUL in a path: exit 2 naming the key

@pytest.mark.parametrize("section, key", [
    ({"capacity": {"figures": "best.json", "peak": 5, "output": "c\0.json"}}, "capacity.output"),
    ({"capacity": {"figures": "best.json", "peak": 5, "output": "c.json", "html": "p\0.html"}}, "capacity.html"),
    ({"package": [{"to": "triton", "output": "rp\0x"}]}, "package[0].output"),
    ({"package": [{"to": "triton", "output": "rp", "data": "d\0.npz"}]}, "package[0].data"),
])
def test_a_nul_in_a_recipe_path_is_exit_2_naming_the_key_on_run_and_the_api(tmp_path, monkeypatch, section, key):
    (tmp_path / "best.json").write_text("{}")
    recipe = _recipe(tmp_path, **section)
    r = run_cli("run", recipe, "--workspace", tmp_path / "runs", cwd=tmp_path)
    assert r.rc == 2, r.err
    line = one_error_line(r)
    assert f"{key}:" in line and "NUL character" in line and "internal error" not in line, line
    monkeypatch.chdir(tmp_path)  # the recipe's paths, as a dict, are relative to the working folder
    with pytest.raises(UsageError, match="NUL character"):
        optkit.run(yaml.safe_load(recipe.read_text()), workspace=tmp_path / "runs-api")
    _ran_nothing(tmp_path)


def test_a_nul_in_run_pass_package_output_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match=r"package\[0\]\.output: .*NUL character"):
        optkit.run_pass("simplify.onnx", CNN, tmp_path / "o.onnx", package={"to": "triton", "output": "rp\0x"})
    assert not (tmp_path / "o.onnx").exists()


# ------------------------------------------------------------------ outputs never in what the run keeps

@pytest.mark.parametrize("section, key, where", [
    ({"capacity": {"figures": "best.json", "peak": 5, "output": "runs/.cache/c.json"}}, "capacity.output",
     "stage cache"),
    ({"capacity": {"figures": "best.json", "peak": 5, "output": "runs/r/c.json"}}, "capacity.output",
     "run folders"),
    ({"capacity": {"figures": "best.json", "peak": 5, "output": "c.json", "html": "runs/r/x/p.html"}},
     "capacity.html", "run folders"),
    ({"stages": [{"pass": "capacity.plan", "config": {"figures": "best.json", "peak": 5,
                                                      "output": "runs/.cache/c.json"}}]},
     "stages[0].config.output", "stage cache"),
    ({"package": [{"to": "triton", "output": "runs/.cache/repo"}]}, "package[0].output", "stage cache"),
    ({"package": [{"to": "triton", "output": "runs/r/repo"}]}, "package[0].output", "run folders"),
])
def test_an_output_inside_the_workspace_stage_cache_or_run_folders_is_refused(tmp_path, monkeypatch, section, key,
                                                                              where):
    (tmp_path / "best.json").write_text("{}")
    for folder in ("runs/.cache", "runs/r/x"):
        (tmp_path / folder).mkdir(parents=True)
    recipe = _recipe(tmp_path, **section)
    r = run_cli("run", recipe, "--workspace", "runs", cwd=tmp_path)
    assert r.rc == 2, r.err
    line = one_error_line(r)
    assert key in line and where in line, line
    _ran_nothing(tmp_path)
    assert no_result_files(tmp_path / "runs") == []
    monkeypatch.chdir(tmp_path)  # the recipe's paths, as a dict, are relative to the working folder
    with pytest.raises(UsageError, match=where):
        optkit.run(yaml.safe_load(recipe.read_text()), workspace="runs")
    assert no_result_files(tmp_path / "runs") == []


# ------------------------------------------------------------------ a trailing '/' names a folder

def test_an_output_file_spelled_as_a_folder_is_refused_everywhere(tmp_path):
    (tmp_path / "best.json").write_text("{}")
    r = run_cli("capacity", tmp_path / "best.json", "--peak", "5", "-o", f"{tmp_path}/c.json/")
    assert r.rc == 2 and "ends with '/'" in one_error_line(r), r.err
    r = run_cli("simplify", CNN, "-o", f"{tmp_path}/s.onnx/")
    assert r.rc == 2 and "ends with '/'" in one_error_line(r), r.err
    recipe = _recipe(tmp_path, capacity={"figures": "best.json", "peak": 5, "output": "c.json/"})
    r = run_cli("run", recipe, "--workspace", tmp_path / "runs")
    assert r.rc == 2 and "capacity.output" in one_error_line(r) and "ends with '/'" in one_error_line(r), r.err
    with pytest.raises(UsageError, match="ends with '/'"):
        optkit.run_pass("simplify.onnx", CNN, f"{tmp_path}/p.onnx/")
    assert no_result_files(tmp_path) == ["best.json", "r.yaml"]


# ------------------------------------------------------------------ a key given twice

@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A real best.json, CAPACITY.json and split folder for the same small models."""
    from test_split import _if_model

    root = tmp_path_factory.mktemp("made")
    best = root / "best.json"
    r = run_cli("tune", CNN, "--objective", "throughput", "--trials", "1", "--trial-seconds", "0.2", "--confirm", "0",
                "-o", best)
    assert r.rc == 0, r.err
    r = run_cli("capacity", best, "--peak", "5", "-o", root / "CAPACITY.json")
    assert r.rc == 0, r.err
    r = run_cli("split", _if_model(root / "if.onnx"), "-o", root / "parts", "--provider", "cuda")
    assert r.rc == 0 and (root / "parts" / "split.json").is_file(), r.err
    return root


def _twice(path: Path, key: str, value) -> None:
    """The file with `key` given a second time, first, at its top level."""
    text = path.read_text()
    path.write_text(text.replace("{", "{" + json.dumps(key) + ": " + json.dumps(value) + ",", 1))


def test_a_key_given_twice_is_refused_by_every_reader_of_optkits_files(made, tmp_path, sample_bench_report):
    import shutil

    other = "0" * 64
    best = tmp_path / "best.json"
    shutil.copy(made / "best.json", best)
    _twice(best, "model_sha256", other)
    cap = tmp_path / "CAPACITY.json"
    shutil.copy(made / "CAPACITY.json", cap)
    _twice(cap, "model_sha256", other)
    parts = tmp_path / "parts"
    shutil.copytree(made / "parts", parts)
    _twice(parts / "split.json", "model_sha256", other)
    report = tmp_path / "report.json"
    report.write_text(json.dumps(sample_bench_report))
    first = next(iter(sample_bench_report))
    _twice(report, first, sample_bench_report[first])
    prom = tmp_path / "traffic.json"
    series = {"metric": {}, "values": [[MIDNIGHT + 60 * i, "5"] for i in range(3)]}
    prom.write_text('{"status": "success", "data": {"resultType": "matrix", "result": []}, "data": '
                    + json.dumps({"resultType": "matrix", "result": [series]}) + "}")
    cases = [
        (("capacity", best, "--peak", "5", "-o", tmp_path / "c1.json"), "model_sha256"),
        (("package", CNN, "--to", "triton", "-o", tmp_path / "rp1", "--tuned", best), "model_sha256"),
        (("package", CNN, "--to", "triton", "-o", tmp_path / "rp2", "--manifests", "kserve", "--capacity", cap),
         "model_sha256"),
        (("package", parts, "--to", "triton", "-o", tmp_path / "rp3"), "model_sha256"),
        (("gate", report, "size_mb <= 5"), first),
        (("capacity", made / "best.json", "--history", prom, "-o", tmp_path / "c2.json"), "data"),
    ]
    for args, key in cases:
        r = run_cli(*args)
        assert r.rc == 2, (args, r.err)
        line = one_error_line(r)
        assert f"key '{key}' is given twice" in line, line
    assert not any((tmp_path / n).exists() for n in ("c1.json", "c2.json", "rp1", "rp2", "rp3"))


# ------------------------------------------------------------------ the version index's free text

@pytest.mark.parametrize("key, edit", [
    ("versions.0.created", lambda d: d["versions"][0].__setitem__("created", "2026\x1b[2J\nserved: 9")),
    ("history.0.why", lambda d: d["history"][0].__setitem__("why", "x" * 100_000)),
    ("history.0.time", lambda d: d["history"][0].__setitem__("time", "\x07")),
])
def test_the_version_index_takes_one_short_line_where_it_holds_text(made, tmp_path, key, edit):
    repo = tmp_path / "repo"
    r = run_cli("package", CNN, "--to", "triton", "-o", repo, "--name", "cnn")
    assert r.rc == 0, r.err
    index = repo / "cnn" / "optkit-versions.json"
    doc = json.loads(index.read_text())
    edit(doc)
    index.write_text(json.dumps(doc))
    for args in (("package", "inspect", repo / "cnn"), ("package", "serve-version", repo / "cnn", "--version", "1"),
                 ("package", CNN, "--to", "triton", "-o", repo, "--name", "cnn")):
        r = run_cli(*args)
        assert r.rc == 2, (args, r.err)
        assert f"key {key}:" in one_error_line(r), r.err
    assert not (repo / "cnn" / "2").exists()


# ------------------------------------------------------------------ a FIFO named like an image

@pytest.fixture(scope="module")
def u8_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("u8") / "cnn_u8.onnx"
    r = run_cli("preprocess", CNN, "-o", out, "--preprocess", "{color: gray, resize: 8, center_crop: 8}")
    assert r.rc == 0, r.err
    return out


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_an_image_that_is_a_fifo_or_device_is_exit_2_on_every_command_reading_images(tmp_path, u8_model, kind):
    from PIL import Image

    folder = tmp_path / "images" / "cls"
    folder.mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(folder / "a.png")
    if kind == "fifo":  # named to sort first: split reads the folder's first image
        os.mkfifo(folder / "0.png")
    else:
        os.symlink("/dev/zero", folder / "0.png")
    data = tmp_path / "images"
    commands = [("eval", CNN, "--data", data, "--preprocess", "{color: gray, resize: 8, center_crop: 8}"),
                ("preprocess", CNN, "-o", tmp_path / "p.onnx", "--preprocess",
                 "{color: gray, resize: 8, center_crop: 8}", "--data", data),
                ("split", u8_model, "-o", tmp_path / "sp", "--data", data)]
    for args in commands:
        r = run_cli(*args, timeout=120)
        assert r.rc == 2, (args, r.err)
        assert "is not a regular file (a FIFO, device or folder)" in one_error_line(r), r.err
    assert not (tmp_path / "p.onnx").exists() and not (tmp_path / "sp").exists()


# ------------------------------------------------------------------ a command's MODEL in the user's words

@pytest.mark.parametrize("command", [("simplify",), ("quantize", "--mode", "dynamic"), ("preprocess", "--preprocess",
                                                                                      "{resize: 8}")])
def test_a_commands_missing_model_is_named_as_typed_not_as_a_recipe_key(tmp_path, command):
    r = run_cli(command[0], "nope.onnx", "-o", "o.onnx", *command[1:], cwd=tmp_path)
    assert r.rc == 2, r.err
    line = one_error_line(r)
    assert line == "error: model nope.onnx not found", line
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"version": 1, "name": "r", "model": {"path": "nope.onnx"},
                                      "stages": [{"pass": "simplify.onnx"}]}))
    r = run_cli("run", recipe, "--workspace", tmp_path / "runs")
    assert r.rc == 2 and "model.path" in one_error_line(r), r.err  # a recipe keeps its key


# ------------------------------------------------------------------ every Config bounded

def test_tensorrt_workspace_is_bounded_on_the_flag_the_recipe_and_the_config(tmp_path):
    from optkit.core.registry import ConfigError, build_config
    from optkit.passes import get_pass

    huge = str(2 ** 70)
    with pytest.raises((ConfigError, UsageError)):
        build_config(get_pass("tensorrt.build"), {"workspace_mb": 2 ** 70})
    r = run_cli("trt", "build", CNN, "-o", tmp_path / "e.engine", "--workspace-mb", huge)
    assert r.rc == 2 and "--workspace-mb" in one_error_line(r), r.err
    recipe = tmp_path / "t.yaml"
    recipe.write_text(yaml.safe_dump({"version": 1, "name": "t", "model": {"path": str(CNN)},
                                      "stages": [{"pass": "tensorrt.build", "config": {"workspace_mb": 2 ** 70}}]}))
    r = run_cli("run", recipe, "--dry-run")
    assert r.rc == 2 and "stages[0].config.workspace_mb" in one_error_line(r), r.err


def test_every_config_number_is_bounded_passes_stage_kinds_package_and_targets():
    """A ratchet: every number a flag or recipe key sets has both bounds (tensorrt.build's workspace_mb had none)."""
    import optkit.pipeline.kinds  # noqa: F401 - split.onnx and capacity.plan
    from optkit.core.fieldspec import field_spec
    from optkit.core.registry import registered
    from optkit.package import target
    from optkit.package.config import PackageConfig
    from optkit.passes import get_pass

    get_pass("simplify.onnx")  # every built-in pass registered
    configs = {name: cls.Config for name, cls in registered().items()  # the built-in ones, not a test's plugin
               if cls.__module__.startswith("optkit.")}
    configs["PackageConfig"] = PackageConfig
    configs.update({f"--to {n}": target.get_target(n).Config for n in target.target_names()})
    by_validator = {"prune.keras.sparsity", "prune.torch.sparsity"}  # (0, 1), in its validator's own words
    unbounded = [f"{name}.{key}" for name, config in configs.items() for key, f in config.model_fields.items()
                 if (s := field_spec(key, f))["type"] in ("int", "float") and f"{name}.{key}" not in by_validator
                 and (s.get("min", s.get("min_open")) is None or s.get("max", s.get("max_open")) is None)]
    assert unbounded == []


@pytest.mark.parametrize("field, says", [
    ("n: int = Field(default=5, ge=1, description='x', json_schema_extra=cli('--evil-n'))", "without an upper bound"),
    ("r: float = Field(default=1.0, description='x', json_schema_extra=cli('--evil-r'))", "without a lower bound"),
    ("n: int = Field(default=10**30, ge=1, le=100, description='x', json_schema_extra=cli('--evil-n'))",
     "outside its bounds"),
    ("o: str | None = Field(default=None, description='x', json_schema_extra=cli('--evil-o', short='-o'))",
     "option o (-o) is one `optkit package` has"),
])
def test_a_plugin_targets_unbounded_or_clashing_option_is_refused_at_registration(tmp_path, field, says):
    plugin = tmp_path / "evil_target.py"
    plugin.write_text(
        "from pydantic import Field\nfrom optkit.core.registry import cli\n"
        "from optkit.package.target import Target, TargetConfig, register_target\n"
        f"class EvilOptions(TargetConfig):\n    {field}\n"
        "class EvilTarget(Target):\n    name = 'evil'\n    Config = EvilOptions\n"
        "register_target('evil', EvilTarget)\n")
    env = {**os.environ, "OPTKIT_PLUGINS": "evil_target",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "optkit", "package", CNN, "--to", "evil", "-o", tmp_path / "rp"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and says in p.stderr.strip().splitlines()[-1], p.stderr
    assert not (tmp_path / "rp").exists()


def test_profile_threads_follow_benchs_rule_and_a_measure_flag_is_named_as_typed(tmp_path):
    """profile --threads 100000 started 100,000 threads and hung; tune --seed 2**32 said 'recipe: measure.seed'."""
    r = run_cli("profile", CNN, "--threads", "100000")
    assert r.rc == 2 and "--threads" in one_error_line(r), r.err
    recipe = tmp_path / "p.yaml"
    recipe.write_text(yaml.safe_dump({"version": 1, "name": "p", "model": {"path": str(CNN)},
                                      "stages": [{"pass": "profile.onnx", "config": {"threads": 100000}}]}))
    r = run_cli("run", recipe, "--dry-run")
    assert r.rc == 2 and "stages[0].config.threads" in one_error_line(r), r.err
    r = run_cli("tune", CNN, "--trials", "1", "-o", tmp_path / "t.json", "--seed", str(2 ** 32))
    assert r.rc == 2 and "--seed" in one_error_line(r) and "recipe:" not in one_error_line(r), r.err
    assert not (tmp_path / "t.json").exists()
