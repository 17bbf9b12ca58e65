"""Package targets are a registry: a toy target (tests/_toy_target.py, one module and one register_target line)
packages through the CLI, a recipe's `package:` and the Python API; the Triton config's printer and parser
round-trip every config optkit writes (and Triton's own ModelConfig reads them), and hostile text is one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from optkit.core.errors import UsageError
from optkit.package import pbtxt
from optkit.package.pbtxt import Ident
from optkit.package.signature import read_signature
from optkit.package.targets import triton
from optkit.package.tuned import Tuned, defaults

from conftest import ROOT, one_error_line

CNN = str(ROOT / "sample_models" / "torch_cnn.onnx")
TESTS = str(ROOT / "tests")
STAGES = [{"pass": "profile.onnx", "name": "profile", "config": {"runs": 5, "top": 1}}]


@pytest.fixture
def toy_env(monkeypatch):
    """Child processes load the toy target the way a user names an uninstalled plugin: OPTKIT_PLUGINS."""
    monkeypatch.setenv("OPTKIT_PLUGINS", "_toy_target")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), TESTS, os.environ.get("PYTHONPATH", "")]))


def test_a_toy_target_packages_through_the_cli(cli, tmp_path, toy_env):
    repo = tmp_path / "repo"
    r = cli("package", CNN, "--to", "toy", "-o", repo, "--name", "cnn", "--tag", "v1")
    assert r.rc == 0, r.err
    assert "toy package cnn version 1" in r.out
    assert json.loads((repo / "cnn" / "1" / "toy.json").read_text())["batch"] == 1
    assert json.loads((repo / "cnn" / "served.json").read_text()) == {"served": 1}
    r = cli("package", CNN, "--to", "toy", "-o", repo, "--name", "cnn", "--json")
    assert r.rc == 0, r.err and json.loads(r.out)["version"] == 2
    assert json.loads((repo / "cnn" / "served.json").read_text()) == {"served": 2}
    r = cli("package", "serve-version", repo / "cnn", "--tag", "v1")
    assert r.rc == 0, r.err
    assert json.loads((repo / "cnn" / "served.json").read_text()) == {"served": 1}
    # what the toy cannot take is refused by name: its own check, and another target's option
    r = cli("package", CNN, "--to", "toy", "-o", repo, "--name", "cnn", "--manifests", "kserve")
    assert r.rc == 2 and "a toy package has no deployment manifests" in one_error_line(r)
    r = cli("package", CNN, "--to", "toy", "-o", repo, "--name", "cnn", "--queue-delay-us", "5")
    assert r.rc == 2 and "queue_delay_us (--queue-delay-us) is for --to triton, not toy" in one_error_line(r)
    r = cli("package", CNN, "--to", "nope", "-o", repo)
    assert r.rc == 2 and "choose triton, mlflow or toy" in one_error_line(r)


def test_a_toy_target_packages_from_a_recipe(cli, tmp_path, toy_env):
    import yaml

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"version": 1, "name": "toyrun", "model": {"path": CNN},
                                      "measure": {"runs": 5, "trials": 1}, "stages": STAGES,
                                      "package": [{"to": "toy", "output": "repo", "tag": "r1"}]}))
    r = cli("run", recipe, "--workspace", tmp_path / "runs")
    assert r.rc == 0, r.err
    assert json.loads((tmp_path / "repo" / "toyrun" / "1" / "toy.json").read_text())["name"] == "toyrun"


def test_an_unimportable_plugin_is_one_line(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("OPTKIT_PLUGINS", "no_such_module_here")
    r = cli("package", CNN, "--to", "toy", "-o", tmp_path / "repo")
    assert r.rc == 2 and "OPTKIT_PLUGINS: cannot import 'no_such_module_here'" in one_error_line(r)


def test_a_toy_target_through_the_python_api(tmp_path, monkeypatch):
    sys.path.insert(0, TESTS)
    monkeypatch.chdir(tmp_path)
    try:
        import _toy_target  # noqa: F401 - registers "toy" in this process

        import optkit
        from optkit.package.build import package
        from optkit.package.config import PackageConfig

        result = package(CNN, PackageConfig(to="toy", output=str(tmp_path / "a"), name="cnn"))
        assert result.target == "toy" and (tmp_path / "a" / "cnn" / "1" / "toy.json").is_file()
        optkit.run({"version": 1, "name": "viarun", "model": {"path": CNN}, "measure": {"runs": 5, "trials": 1},
                    "stages": STAGES, "package": [{"to": "toy", "output": str(tmp_path / "b")}]}, workspace=tmp_path / "runs")
        assert (tmp_path / "b" / "viarun" / "1" / "toy.json").is_file()
        optkit.run_pass("profile.onnx", CNN, tmp_path / "p.onnx", measure={"runs": 5}, runs=5,
                        package={"to": "toy", "output": str(tmp_path / "c"), "name": "prof"})
        assert (tmp_path / "c" / "prof" / "1" / "toy.json").is_file()
        with pytest.raises(UsageError, match="choose triton, mlflow or toy"):
            package(CNN, to="nope", output=str(tmp_path / "d"))
    finally:
        sys.path.remove(TESTS)


# ------------------------------------------------------------------ the printer and the parser

def _configs() -> list[dict]:
    sig, base = read_signature(CNN), defaults().setting
    settings = [{}, {"batch": 8, "concurrency": 2, "sessions": "per-thread", "threads": 2},
                {"provider": "tensorrt", "session": {**base["session"], "execution_mode": "parallel",
                                                     "inter_op_threads": 2, "graph_optimization": "basic",
                                                     "cpu_mem_arena": False}}]
    return [triton.build_config("cnn", sig, Tuned(setting={**base, **s}), {"input": [1, 8, 8]}, v).config
            for v, s in enumerate(settings, 1)]


@pytest.mark.parametrize("i", range(3))
def test_every_written_config_round_trips_through_the_parser(i):
    config = _configs()[i]
    text = triton.dumps(config)
    assert triton.loads(text) == config
    assert triton.dumps(triton.loads(text)) == text


def test_serve_version_changes_the_parsed_field_and_prints_again():
    config = _configs()[1]
    again = triton.loads(triton.dumps(triton.with_version(config, 7)))
    assert triton.served_version(again) == 7 and {k: v for k, v in again.items() if k != "version_policy"} == {
        k: v for k, v in config.items() if k != "version_policy"}


def test_the_parser_reads_what_triton_users_write():
    text = '''
    # a hand-written config
    name: 'm\\'x'   platform: "onnxruntime_onnx"
    max_batch_size: 0x10
    input < name: "a\\303\\251" data_type: TYPE_FP32 dims: -1 dims: 3 >
    input { name: "b\\u00e9" "c" data_type: TYPE_INT64, dims: [1] };
    version_policy: { latest { num_versions: 2 } }
    parameters: { key: "k" value: { string_value: "v\\n" } }
    parameters { key: "j" value { string_value: "\\x41" } }
    dynamic_batching { }
    '''
    c = triton.loads(text)
    assert c["name"] == "m'x" and c["max_batch_size"] == 16
    assert c["input"] == [{"name": "aé", "data_type": "TYPE_FP32", "dims": [-1, 3]},
                          {"name": "béc", "data_type": "TYPE_INT64", "dims": [1]}]
    assert isinstance(c["input"][0]["data_type"], Ident)
    assert c["parameters"] == {"k": {"string_value": "v\n"}, "j": {"string_value": "A"}}
    assert c["dynamic_batching"] == {} and c["version_policy"] == {"latest": {"num_versions": 2}}
    assert triton.loads(triton.dumps(c)) == c


def test_strings_with_any_character_round_trip():
    name = 'q"uo\\te\n\ttab é ☃ \x01'
    assert pbtxt.loads(pbtxt.dumps({"name": name})) == {"name": name}


@pytest.mark.parametrize("text,says", [
    ('name: "unterminated', "line 1 column 7: unterminated string"),
    ("input { name: \"a\" ", "unterminated message"),
    ("dims: [ 1, 2", "unterminated list"),
    ("name: \"a\"\nname: \"b\"", "line 2 column 1: field name given twice"),
    ("bogus_field: 1", "key bogus_field: not a field of Triton's ModelConfig"),
    ("max_batch_size: 12abc", "not a number"),
    ('name: "\\q"', "unknown escape \\q"),
    ("name \"x\"", "expected ':' or '{' after field name"),
    ("optimization " + "{ graph " * 40 + "}" * 40 + "}", "nested over 32 deep"),
    ("name: " + "x" * (2 << 20), "over the 1048576 a config may have"),
    ("max_batch_size: 1 }", "unexpected '}'"),
    ('name: "\\xff"', "not UTF-8 once unescaped"),
])
def test_hostile_text_is_one_clear_line(text, says):
    with pytest.raises(UsageError) as e:
        triton.loads(text, "c.pbtxt")
    assert says in e.value.message and "\n" not in e.value.message and e.value.message.startswith("c.pbtxt:")


def test_written_configs_parse_with_tritons_own_model_config(tmp_path):
    """Every config optkit writes reads as tritonclient's ModelConfig, in the Triton tool folder's Python."""
    python = ROOT / "tools" / "triton" / ".venv" / "bin" / "python"
    if not python.exists():
        pytest.skip("no tools/triton/.venv (python3 -m venv tools/triton/.venv && tools/triton/.venv/bin/pip "
                    "install -r tools/triton/requirements.txt)")
    files = []
    for i, config in enumerate(_configs()):
        files.append(tmp_path / f"{i}.pbtxt")
        files[-1].write_text(triton.dumps(config))
    checker = ROOT / "optkit" / "package" / "targets" / "triton_check.py"
    proc = subprocess.run([str(python), str(checker), *map(str, files)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    parsed = [json.loads(line) for line in proc.stdout.splitlines()]
    for config, seen in zip(_configs(), parsed):
        assert seen["name"] == config["name"] and seen["max_batch_size"] == config["max_batch_size"]
        assert seen["parameters"] == config["parameters"]
        assert [int(v) for v in seen["version_policy"]["specific"]["versions"]] == \
            config["version_policy"]["specific"]["versions"]
