"""Messages that name the user's own path, flag or key and say what is true (issue 39, W10): a folder optkit wrote
given as a model says what it is and which model file to give, on every command that reads a model; an IPv6 URL is
shown as a URL writes it; `package` says truthfully why config.pbtxt was not checked and gives the command that
checks it. (The traffic history's messages are in test_capacity_bounds.py, --cut's in test_split_probe.py.)"""
from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess

import _triton
import pytest

import optkit
from optkit.core.errors import UsageError
from optkit.runtimes.kserve_http import ServedModel

from conftest import one_error_line


@pytest.fixture(scope="module")
def written(tmp_path_factory, preprocessed):
    """A split folder and a Triton package with an ensemble, both of the preprocessed sample CNN."""
    from conftest import run_cli

    root = tmp_path_factory.mktemp("w10")
    r = run_cli("split", preprocessed, "-o", root / "split")
    assert r.rc == 0, r.err
    r = run_cli("package", preprocessed, "--to", "triton", "-o", root / "repo", "--shape", "image=1x8x8x1")
    assert r.rc == 0, r.err
    return root, r


@pytest.mark.parametrize("folder, says, model", [
    ("split", "is an optkit split folder (split.json", "split/core.onnx"),
    ("repo/cnn_u8.core", "is a Triton model folder (config.pbtxt", "repo/cnn_u8.core/1/model.onnx"),
    ("repo/cnn_u8.pre/1", "is version 1 of the Triton model cnn_u8.pre", "repo/cnn_u8.pre/1/model.onnx"),
])
@pytest.mark.parametrize("command", [["inspect"], ["bench", "--runs", "3"], ["split", "-o", "OUT"],
                                     ["simplify", "-o", "OUT.onnx"]])
def test_a_folder_optkit_wrote_is_named_as_what_it_is(cli, written, tmp_path, folder, says, model, command):
    root, _ = written
    args = [str(tmp_path / a) if a.startswith("OUT") else a for a in command]
    r = cli(args[0], root / folder, *args[1:])
    line = one_error_line(r)
    assert r.rc == 2 and says in line and str(root / model) in line, line
    assert "TensorFlow SavedModel" not in line
    assert list(tmp_path.iterdir()) == []


def test_the_python_api_says_the_same(written, tmp_path):
    root, _ = written
    with pytest.raises(UsageError, match=r"is an optkit split folder .*give one of its model files: .*core\.onnx"):
        optkit.run_pass("simplify.onnx", str(root / "split"), str(tmp_path / "s.onnx"))
    assert not (tmp_path / "s.onnx").exists()


def test_a_plain_folder_still_says_savedmodel_and_that_it_holds_no_model(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    r = cli("inspect", tmp_path / "empty")
    assert r.rc == 2 and "nor a Hugging Face model (config.json); it holds no model file" in one_error_line(r)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_ipv6_url_is_shown_in_brackets(cli):
    assert ServedModel("http://[::1]:18100/v2/models/m").server == "http://[::1]:18100"
    assert ServedModel("https://[fe80::1]/p/v2/models/m").server == "https://[fe80::1]:443/p"
    assert ServedModel("http://127.0.0.1:8000/v2/models/m").server == "http://127.0.0.1:8000"
    port = _free_port()
    r = cli("bench", "--url", f"http://[::1]:{port}/v2/models/m", "--runs", "3")
    line = one_error_line(r)
    assert r.rc == 2 and f"http://[::1]:{port}" in line and f"http://::1:{port}" not in line, line


def test_package_says_why_config_pbtxt_was_not_checked_and_how_to_check_it(written):
    from optkit.package.targets import triton_check

    root, r = written
    if triton_check.parse_if_installed('name: "m"') is not None:
        pytest.skip("tritonclient is importable here: the package checks its configs itself")
    lineage = json.loads((root / "repo" / "cnn_u8" / "1" / "optkit-package.json").read_text())
    (note,) = [n for n in lineage["notes"] if "not checked against Triton's ModelConfig" in n]
    assert "pip install tritonclient to check it" not in note
    assert triton_check.unavailable() in note and "tritonclient is not installed in optkit's Python" in note
    assert "not checked against Triton" in r.out      # also said on the console
    command = re.search(r"run `([^`]+)` in the repository", note).group(1).split()
    assert command[0] == "python" and command[2:] == ["cnn_u8/1/config.pbtxt", "cnn_u8.pre/1/config.pbtxt",
                                                      "cnn_u8.core/1/config.pbtxt"]
    if _triton.missing() is not None:
        pytest.skip(f"the command is checked with the Triton tool folder's Python: {_triton.missing()}")
    proc = subprocess.run([str(_triton.PYTHON), *command[1:]], cwd=root / "repo", capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr + shlex.join(command)
    parsed = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [p["name"] for p in parsed] == ["cnn_u8", "cnn_u8.pre", "cnn_u8.core"]
