"""Red team of the package-target registry: hostile config.pbtxt text, hostile plugins (bad names, a take-over of
`--to triton`, sys.exit() on import, a target writing outside its folder, links, its own exceptions) and a
registry password in a recipe. Each is one `error:` line with the right exit code and nothing left behind."""
from __future__ import annotations

import json
import os
import textwrap

import pytest

from optkit.core.errors import UsageError
from optkit.package import pbtxt
from optkit.package.targets import triton

from conftest import ROOT, one_error_line

CNN = str(ROOT / "sample_models" / "torch_cnn.onnx")

# a plugin whose behaviour the test picks with RED_* variables
PLUGIN = '''
import os
import shutil

from optkit.package.target import Served, Target, register_target


class Red(Target):
    name = os.environ.get("RED_NAME", "red")
    model_files = frozenset(os.environ.get("RED_FILES", "served.json").split(","))

    def write_version(self, job, vdir, number):
        shutil.copyfile(job.model, vdir / "model.onnx")
        mode = os.environ.get("RED_MODE", "")
        if mode == "link":
            os.symlink("/etc/passwd", vdir / "passwd")
        if mode == "raise":
            raise KeyError("oops")
        return {os.environ.get("RED_KEY", "served.json"): "{}"}

    def serve(self, model_dir, index, number, recorded, registry):
        return Served(replace={model_dir / os.environ.get("RED_KEY", "served.json"): "{}"},
                      before=index.get("served"))


register_target(os.environ.get("RED_NAME", "red"), Red)
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """OPTKIT_PLUGINS=red_plugin (and exiting_plugin, sys.exit(0) on import) on the children's PYTHONPATH."""
    where = tmp_path / "plugins"
    where.mkdir()
    (where / "red_plugin.py").write_text(PLUGIN)
    (where / "exiting_plugin.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.setenv("OPTKIT_PLUGINS", "red_plugin")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(where), os.environ.get("PYTHONPATH", "")]))
    for var in ("RED_NAME", "RED_FILES", "RED_MODE", "RED_KEY"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


# ------------------------------------------------------------------ pbtxt

@pytest.mark.parametrize("text, says", [
    ("input { dims: " + "[" * 200_000 + " }", "a list inside a list"),
    ('parameters { key { } value { string_value: "1" } }', "a key is a string or a number"),
    ('parameters { key: [1] value { string_value: "1" } }', "a key is a string or a number"),
    ("max_batch_size: -infinite", "not a number"),
])
def test_hostile_pbtxt_is_one_usage_error(text, says):
    with pytest.raises(UsageError) as e:
        triton.loads(text)
    assert says in e.value.message and "\n" not in e.value.message


def test_non_finite_floats_print_and_read_back():
    config = {"a": float("nan"), "b": float("-inf"), "c": float("inf"), "d": [float("-inf"), 1.5]}
    text = pbtxt.dumps(config)
    assert "a: nan" in text and "b: -inf" in text
    again = pbtxt.loads(text)
    assert again["a"] != again["a"] and again["b"] == float("-inf") and again["d"] == [float("-inf"), 1.5]


@pytest.mark.parametrize("served", ["version_policy: 5", "version_policy { specific: 3 }",
                                    'version_policy { specific { versions: "x" } }',
                                    "parameters { key { } value { } }", "dims: [[[[1]]]]"])
def test_a_hand_edited_served_config_does_not_block_a_rollback(cli, tmp_path, served, fresh_home_and_tmp):
    repo = tmp_path / "repo"
    for _ in range(2):
        assert cli("package", CNN, "--to", "triton", "-o", repo, "--name", "cnn").rc == 0
    (repo / "cnn" / "config.pbtxt").write_text(served + "\n")
    r = cli("package", "serve-version", repo / "cnn", "--version", "1")
    assert r.rc == 0, r.err
    config = triton.loads((repo / "cnn" / "config.pbtxt").read_text())
    assert triton.served_version(config) == 1


# ------------------------------------------------------------------ plugins

@pytest.mark.parametrize("name", ["a b", "../x", "x/y", "", "Triton", "triton"])
def test_a_plugin_target_name_is_a_word_of_its_own(cli, tmp_path, plugin, name):
    plugin.setenv("RED_NAME", name)
    r = cli("package", CNN, "--to", name, "-o", tmp_path / "repo", "--name", "cnn")
    line = one_error_line(r)
    assert r.rc == 2 and "OPTKIT_PLUGINS: cannot import 'red_plugin'" in line
    assert ("registered already" if name == "triton" else "use lowercase letters") in line
    assert not (tmp_path / "repo").exists()


def test_a_plugin_that_exits_on_import_is_exit_2(cli, tmp_path, plugin):
    plugin.setenv("OPTKIT_PLUGINS", "exiting_plugin")
    r = cli("package", CNN, "--to", "triton", "-o", tmp_path / "repo", "--name", "cnn")
    assert r.rc == 2 and "cannot import 'exiting_plugin' (SystemExit" in one_error_line(r)
    assert not (tmp_path / "repo").exists()


def test_a_target_registered_by_a_module_that_does_not_import(cli, tmp_path, plugin):
    (tmp_path / "plugins" / "lazy_plugin.py").write_text(
        "from optkit.package.target import register_target\nregister_target('lazy', 'no_such_module_x:Cls')\n")
    plugin.setenv("OPTKIT_PLUGINS", "lazy_plugin")
    r = cli("package", CNN, "--to", "lazy", "-o", tmp_path / "repo", "--name", "cnn")
    assert r.rc == 2 and "package target 'lazy' (no_such_module_x:Cls) does not load" in one_error_line(r)
    # another target's option check does not trip over it
    r = cli("package", CNN, "--to", "triton", "-o", tmp_path / "repo", "--name", "cnn", "--queue-delay-us", "7")
    assert r.rc == 0, r.err


def test_a_target_writes_only_its_own_files(cli, tmp_path, plugin):
    repo = tmp_path / "repo"
    r = cli("package", CNN, "--to", "red", "-o", repo, "--name", "cnn")
    assert r.rc == 0, r.err
    index = (repo / "cnn" / "optkit-versions.json").read_text()
    # a model-level file outside the model folder, or optkit's own index
    plugin.setenv("RED_FILES", "served.json,../../escape.txt")
    plugin.setenv("RED_KEY", "../../escape.txt")
    r = cli("package", CNN, "--to", "red", "-o", repo, "--name", "cnn")
    assert r.rc == 2 and "model_files '../../escape.txt' is not a plain file name" in one_error_line(r)
    plugin.setenv("RED_FILES", "served.json")
    plugin.setenv("RED_KEY", "optkit-versions.json")
    r = cli("package", CNN, "--to", "red", "-o", repo, "--name", "cnn")
    assert r.rc == 3 and "wrote model-level file 'optkit-versions.json'" in one_error_line(r)
    r = cli("package", "serve-version", repo / "cnn", "--version", "1")
    assert r.rc == 3 and "asked to replace" in one_error_line(r)
    plugin.delenv("RED_KEY")
    # a link in the version, and the target's own exception
    plugin.setenv("RED_MODE", "link")
    r = cli("package", CNN, "--to", "red", "-o", repo, "--name", "cnn")
    assert r.rc == 3 and "wrote passwd, a link or special file" in one_error_line(r)
    plugin.setenv("RED_MODE", "raise")
    r = cli("package", CNN, "--to", "red", "-o", repo, "--name", "cnn")
    assert r.rc == 3 and "package target 'red' failed writing version 2: KeyError" in one_error_line(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plugins", "repo"]
    assert sorted(p.name for p in (repo / "cnn").iterdir()) == ["1", "optkit-versions.json", "served.json"]
    assert (repo / "cnn" / "optkit-versions.json").read_text() == index


# ------------------------------------------------------------------ a recipe's registry password

def test_a_recipe_registry_password_is_not_recorded(cli, tmp_path, fresh_home_and_tmp):
    """An MLflow server URL with a password (a local server that answers 404 to everything: reachable, so the
    stages run and the report is written; the registration then fails)."""
    import http.server
    import threading

    pytest.importorskip("mlflow")

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_error(404)

        do_POST = do_PATCH = do_GET  # noqa: N815

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://u:s3cretPW@127.0.0.1:{server.server_port}"
        recipe = tmp_path / "r.yaml"
        recipe.write_text(textwrap.dedent(f"""\
            version: 1
            name: pw
            model: {{path: {CNN}}}
            stages:
              - {{pass: profile.onnx, name: profile, config: {{runs: 3, top: 1}}}}
            package:
              - {{to: mlflow, output: repo, name: cnn, registry: "{url}"}}
            """))
        r = cli("run", recipe, "--workspace", tmp_path / "ws", cwd=tmp_path, timeout=300)
    finally:
        server.shutdown()
        server.server_close()
    assert "s3cretPW" not in r.out + r.err
    reports = list((tmp_path / "ws").rglob("report.json"))
    assert reports, r.err
    for p in tmp_path.rglob("*"):
        assert p == recipe or not p.is_file() or b"s3cretPW" not in p.read_bytes(), p
    recorded = json.loads(reports[0].read_text())["recipe"]["package"][0]["registry"]
    assert recorded == url.replace("s3cretPW", "***")


def test_a_package_entry_is_checked_whole_before_any_stage_runs(tmp_path, fresh_home_and_tmp):
    import optkit

    out = tmp_path / "o.onnx"
    for entry, says in (({"to": "triton", "output": str(tmp_path / "r"), "registry": "sqlite:///x.db"},
                         "registry (--registry) is for --to mlflow, not triton"),
                        ({"to": "triton", "output": str(tmp_path / "r"), "tuned": str(tmp_path / "no.json")},
                         "tuned: " + str(tmp_path / "no.json") + " does not exist")):
        with pytest.raises(UsageError) as e:
            optkit.run_pass("profile.onnx", CNN, out, package=entry, runs=2, top=1)
        assert says in e.value.message, e.value.message
    assert sorted(p.name for p in tmp_path.iterdir()) == []
