"""Targets own their options (issue 40): a plugin target (tests/_toy_target.py: one module, one registration line,
no optkit file touched) declares `--toy-batch` and `--toy-note` in its Config; they show in `optkit package
--help` under "toy options", a recipe's `package:` entry takes them as keys, a bad value is refused naming the key
and the flag (CLI, recipe, Python API), another target's option is refused naming its targets, and two targets
meaning different things by one flag is a registration error naming both. Every registered target's Config
imports no framework."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import yaml

from optkit.core.errors import UsageError
from optkit.package import target as target_mod

from conftest import ROOT, one_error_line

CNN = str(ROOT / "sample_models" / "torch_cnn.onnx")
TESTS = str(ROOT / "tests")
STAGES = [{"pass": "profile.onnx", "name": "profile", "config": {"runs": 5, "top": 1}}]


@pytest.fixture
def toy_env(monkeypatch):
    """Child processes load the toy target the way a user names an uninstalled plugin: OPTKIT_PLUGINS."""
    monkeypatch.setenv("OPTKIT_PLUGINS", "_toy_target")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), TESTS, os.environ.get("PYTHONPATH", "")]))


@pytest.fixture
def registry(monkeypatch):
    """The toy registered in this process (as a user's import does: for good, as test_package_targets.py's), and
    the registry put back after the test, which registers targets of its own."""
    sys.path.insert(0, TESTS)
    try:
        import _toy_target
    finally:
        sys.path.remove(TESTS)
    assert "toy" in target_mod.target_names()
    monkeypatch.setattr(target_mod, "_TARGETS", dict(target_mod._TARGETS))
    monkeypatch.setattr(target_mod, "_CHECKED", set(target_mod._CHECKED))
    return _toy_target


def _sections(help_text: str) -> dict[str, str]:
    """`optkit package --help` cut at its section titles ("triton options:" ...)."""
    out, title = {}, ""
    for line in help_text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            title = line[:-1]
            continue
        out[title] = out.get(title, "") + line + "\n"
    return out


def test_the_toy_options_show_in_help_under_the_toy(cli, toy_env):
    r = cli("package", "--help")
    assert r.rc == 0, r.err
    sections = _sections(r.out)
    assert "--toy-batch" in sections["toy options"] and "--toy-note" in sections["toy options"]
    assert "--queue-delay-us" in sections["triton options"] and "--gpu" in sections["triton options"]
    assert "--registry" in sections["mlflow options"]
    shared = sections["optkit package MODEL --to triton|mlflow|toy -o REPO [OPTIONS]"]
    assert "--output" in shared and "--manifests" in shared and "--toy" not in shared and "--gpu" not in shared
    assert "triton, mlflow or toy" in shared  # --to's help lists every registered target
    r = cli("package", CNN, "--help")  # the build command's own help: the same sections
    assert r.rc == 0 and "--toy-batch" in _sections(r.out)["toy options"], r.err


def test_the_toy_options_through_the_cli(cli, tmp_path, toy_env):
    repo = tmp_path / "repo"
    r = cli("package", CNN, "--to", "toy", "-o", repo, "--name", "cnn", "--toy-batch", "8", "--toy-note", "hello")
    assert r.rc == 0, r.err
    assert json.loads((repo / "cnn" / "1" / "toy.json").read_text())["batch"] == 8
    assert json.loads((repo / "cnn" / "1" / "toy.json").read_text())["note"] == "hello"
    assert "batch = 8 -> toy.json batch = 8" in r.out
    for args, says in ((["--toy-batch", "0"], "--toy-batch"), (["--toy-batch", "x"], "--toy-batch"),
                       (["--toy-note", "n" * 201], "toy_note (--toy-note): string should have at most 200")):
        r = cli("package", CNN, "--to", "toy", "-o", tmp_path / "bad", *args)
        assert r.rc == 2 and says in one_error_line(r), (args, r.err)
    r = cli("package", CNN, "--to", "triton", "-o", tmp_path / "bad", "--toy-batch", "4")
    assert r.rc == 2 and "toy_batch (--toy-batch) is for --to toy, not triton" in one_error_line(r)
    r = cli("package", CNN, "--to", "toy", "-o", tmp_path / "bad", "--gpu")
    assert r.rc == 2 and "gpu (--gpu) is for --to triton, not toy" in one_error_line(r)
    r = cli("package", "serve-version", repo / "cnn", "--version", "1", "--registry", "sqlite:///r.db")
    assert r.rc == 2 and "registry (--registry) is for --to mlflow packages, not toy" in one_error_line(r)
    r = cli("package", "sample_models/keras_cnn.tflite", "--to", "toy", "-o", tmp_path / "bad")
    assert r.rc == 2 and "a toy package takes an ONNX model: convert it first (optkit convert" in one_error_line(r)
    assert not (tmp_path / "bad").exists()
    assert json.loads((repo / "cnn" / "optkit-versions.json").read_text())["served"] == 1


def _recipe(tmp_path, entry: dict) -> str:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"version": 1, "name": "toyrun", "model": {"path": CNN},
                                      "measure": {"runs": 5, "trials": 1}, "stages": STAGES, "package": [entry]}))
    return recipe


def test_the_toy_options_in_a_recipe(cli, tmp_path, toy_env):
    r = cli("run", _recipe(tmp_path, {"to": "toy", "output": "repo", "toy_batch": 3, "toy_note": "from yaml"}),
            "--workspace", tmp_path / "runs")
    assert r.rc == 0, r.err
    written = json.loads((tmp_path / "repo" / "toyrun" / "1" / "toy.json").read_text())
    assert written["batch"] == 3 and written["note"] == "from yaml"


@pytest.mark.parametrize("entry, says", [
    ({"toy_batch": 0}, "toy_batch (--toy-batch): input should be greater than or equal to 1"),
    ({"toy_batch": "many"}, "toy_batch (--toy-batch): input should be a valid integer"),
    ({"queue_delay_us": 5}, "queue_delay_us (--queue-delay-us) is for --to triton, not toy"),
    ({"registry": "sqlite:///r.db"}, "registry (--registry) is for --to mlflow, not toy"),
    ({"toy_bacth": 3}, "toy_bacth: unknown option (--to toy takes the shared ones and: toy_batch, toy_note)"),
])
def test_a_bad_toy_entry_in_a_recipe_is_refused_before_any_stage(cli, tmp_path, toy_env, entry, says):
    r = cli("run", _recipe(tmp_path, {"to": "toy", "output": "repo", **entry}), "--workspace", tmp_path / "runs")
    line = one_error_line(r)
    assert r.rc == 2 and "recipe package[0] (output repo): " + says in line, line
    assert not (tmp_path / "repo").exists() and not list(tmp_path.glob("runs/*/*/01-*"))  # no stage ran


def test_the_toy_options_through_the_python_api(tmp_path, registry, monkeypatch):
    import optkit

    monkeypatch.chdir(tmp_path)
    from optkit.package.build import package

    result = package(CNN, to="toy", output=str(tmp_path / "a"), name="cnn", toy_batch=2, toy_note="api")
    assert json.loads((tmp_path / "a" / "cnn" / "1" / "toy.json").read_text())["batch"] == 2 == \
        result.mapping[0]["written"]
    with pytest.raises(UsageError, match=r"toy_batch \(--toy-batch\): input should be less than or equal to 4096"):
        package(CNN, to="toy", output=str(tmp_path / "b"), toy_batch=5000)
    with pytest.raises(UsageError, match=r"queue_delay_us \(--queue-delay-us\) is for --to triton, not toy"):
        optkit.run_pass("profile.onnx", CNN, tmp_path / "p.onnx", runs=2, top=1,
                        package={"to": "toy", "output": str(tmp_path / "c"), "queue_delay_us": 5})
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists() and not (tmp_path / "p.onnx").exists()


def test_no_file_of_optkit_names_the_toy():
    """The toy is one module and one registration: nothing under optkit/ knows of it."""
    named = [str(p.relative_to(ROOT)) for p in (ROOT / "optkit").rglob("*") if p.is_file() and p.suffix in (
        ".py", ".md", ".txt", ".json", ".yaml") and "toy" in p.read_text(errors="replace").lower()]
    assert named == []


def test_one_flag_two_meanings_is_a_registration_error(registry):
    from pydantic import Field

    from optkit.core.registry import cli

    class Clash(target_mod.TargetConfig):
        toy_batch: str | None = Field(default=None, description="Another toy's batch, as text.",
                                      json_schema_extra=cli("--toy-batch"))

    class Toy2(registry.ToyTarget):
        name = "toy2"
        Config = Clash

    with pytest.raises(UsageError) as e:
        target_mod.register_target("toy2", Toy2)
    msg = e.value.message
    assert "package targets 'toy' (_toy_target:ToyTarget) and 'toy2'" in msg and "--toy-batch" in msg, msg
    assert "type: 'int' vs 'str'" in msg and "\n" not in msg
    assert "toy2" not in target_mod._TARGETS

    class Renamed(target_mod.TargetConfig):  # one key under another flag: the recipe key would mean two things
        toy_batch: int | None = Field(default=None, ge=1, le=4096, description="Toy: the batch it records "
                                                                            "(default: the tuned batch).",
                                      json_schema_extra=cli("--toy-size"))

    Toy2.Config = Renamed
    with pytest.raises(UsageError, match="flag: '--toy-batch' vs '--toy-size'"):
        target_mod.register_target("toy2", Toy2)

    class Shared(target_mod.TargetConfig):  # the same option, declared identically: shared deliberately
        toy_note: str | None = registry.ToyOptions.model_fields["toy_note"]

    Toy2.Config = Shared
    target_mod.register_target("toy2", Toy2)
    assert target_mod.takers("toy_note") == ["toy", "toy2"]

    class Own(target_mod.TargetConfig):  # an option every target has: not a target's to declare again
        output: str | None = Field(default=None, description="Mine.", json_schema_extra=cli("--out2"))

    class Needed(target_mod.TargetConfig):  # a target's options are optional: a package is made without them
        toy_level: int = Field(description="Required.", json_schema_extra=cli("--toy-level"))

    for config, says in ((Own, "option output (--out2) is one `optkit package` has for every target"),
                         (Needed, "option toy_level has no default")):
        toy3 = type("Toy3", (registry.ToyTarget,), {"name": "toy3", "Config": config})
        with pytest.raises(UsageError, match=re.escape(says)):
            target_mod.register_target("toy3", toy3)
    assert "toy3" not in target_mod._TARGETS


CLASH = """
from pydantic import Field
from optkit.core.registry import cli
from optkit.package.target import TargetConfig, register_target
from _toy_target import ToyTarget


class Clash(TargetConfig):
    toy_batch: str | None = Field(default=None, description="Another toy's batch, as text.",
                                  json_schema_extra=cli("--toy-batch"))


class Toy2(ToyTarget):
    name = "toy2"
    Config = Clash


register_target("toy2", Toy2)
"""


def test_a_clashing_plugin_is_one_line_and_writes_nothing(cli, tmp_path, monkeypatch):
    (tmp_path / "_toy_clash.py").write_text(CLASH)
    monkeypatch.setenv("OPTKIT_PLUGINS", "_toy_target,_toy_clash")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), TESTS, str(tmp_path),
                                                      os.environ.get("PYTHONPATH", "")]))
    for args in (["package", CNN, "--to", "toy", "-o", tmp_path / "repo"], ["package", "--help"]):
        r = cli(*args)
        line = one_error_line(r)
        assert r.rc == 2 and "'toy' (_toy_target:ToyTarget) and 'toy2' (_toy_clash:Toy2)" in line, line
    assert [p.name for p in tmp_path.iterdir() if p.name != "__pycache__"] == ["_toy_clash.py"]


def test_every_targets_config_imports_no_framework():
    """`optkit package --help` reads every registered target's Config: none imports a framework."""
    code = textwrap.dedent("""
        import sys
        from optkit.package.target import get_target, target_names
        names = target_names()
        assert "toy" in names, names
        for n in names:
            get_target(n).Config.model_json_schema()
        heavy = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "tensorflow", "mlflow", "tritonclient",
                                                                 "onnxruntime", "tf_keras", "transformers"})
        print(",".join(heavy))
        """)
    env = {**os.environ, "OPTKIT_PLUGINS": "_toy_target",
           "PYTHONPATH": os.pathsep.join([str(ROOT), TESTS, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""
