"""Consent: no model file runs its author's code unless the user passed --trust-code.

Each hostile file writes a marker file when its code runs. Every case asserts the exit code, the one-line
message and that the marker is absent; the trusted runs prove the marker would appear, so the refusals
are not vacuous.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import one_error_line

# Written into the files below: run when the file is loaded, it creates the file named by $OPTKIT_MARKER.
_PAYLOAD = "open(__import__('os').environ['OPTKIT_MARKER'], 'w') if 'OPTKIT_MARKER' in __import__('os').environ else None"

_BUILD = f"""
import io, os, sys, zipfile
os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
out = sys.argv[1]
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)
    def forward(self, x):
        return self.fc(x)

torch.export.save(torch.export.export(Net().eval(), (torch.randn(1, 4),)), f"{{out}}/good.pt2")

class Evil:
    def __reduce__(self):
        return (eval, ({_PAYLOAD!r},))

buf = io.BytesIO()
torch.save(Evil(), buf)
with zipfile.ZipFile(f"{{out}}/good.pt2") as zin, zipfile.ZipFile(f"{{out}}/evil.pt2", "w") as zout:
    for item in zin.infolist():
        data = zin.read(item.filename)
        if item.filename.endswith("sample_inputs/model.pt"):
            data = buf.getvalue()
        zout.writestr(item, data)
sys.path.insert(0, out)
import factory
torch.save(factory.make(), f"{{out}}/whole.pt")   # a pickled whole model, not a state dict

import tf_keras as k
inp = k.Input((4,))
hidden = k.layers.Dense(4)(inp)
evil = k.layers.Lambda(lambda t: ({_PAYLOAD}, t)[1], name="sneaky")(hidden)
model = k.Model(inp, k.layers.Dense(2)(evil))
model.save(f"{{out}}/evil.h5")
model.save(f"{{out}}/evil.keras")
inner = k.Sequential([k.Input((4,)), k.layers.Lambda(lambda t: ({_PAYLOAD}, t)[1], name="nested")])
outer_in = k.Input((4,))
k.Model(outer_in, inner(outer_in)).save(f"{{out}}/nested.h5")
plain = k.Sequential([k.Input((4,)), k.layers.Dense(2)])
plain.save(f"{{out}}/plain.h5")
plain.save(f"{{out}}/plain.keras")
"""

_FACTORY = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)
    def forward(self, x):
        return self.fc(x)

def make():
    return Net()

def example_inputs():
    return (torch.randn(1, 4),)
"""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hostile-files")
    env = {k: v for k, v in os.environ.items() if k != "OPTKIT_MARKER"}
    (folder / "factory.py").write_text(_FACTORY)
    subprocess.run([sys.executable, "-c", _BUILD, str(folder)], check=True, env=env, capture_output=True,
                   timeout=600)
    return folder


@pytest.fixture
def marker(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "code-ran"
    monkeypatch.setenv("OPTKIT_MARKER", str(path))
    monkeypatch.delenv("OPTKIT_TRUST_CODE", raising=False)
    return path


def _refused(cli, hostile, marker, *args, message: str) -> str:
    r = cli(*args, cwd=hostile)
    line = one_error_line(r)
    assert r.rc == 2, (args, r.rc, r.err)
    assert message in line and "--trust-code" in line, line
    assert not marker.exists(), f"{args} ran the file's code"
    return line


@pytest.mark.parametrize("args", [
    ["inspect", "evil.pt2"],
    ["bench", "evil.pt2", "--runs", "2"],
    ["convert", "evil.pt2", "-o", "out.onnx"],
])
def test_pickle_inside_pt2_is_refused(cli, hostile, marker, args):
    _refused(cli, hostile, marker, *args, message="evil.pt2 holds pickled Python objects")
    assert not (hostile / "out.onnx").exists()


def test_pt2_pickle_runs_only_with_trust_code(cli, hostile, marker):
    r = cli("--trust-code", "inspect", "evil.pt2", cwd=hostile)
    assert marker.exists(), r.err  # the payload ran: the refusals above guard something real
    assert "Traceback" not in r.err


def test_plain_pt2_loads_without_trust(cli, hostile, marker):
    r = cli("inspect", "good.pt2", cwd=hostile)
    assert r.rc == 0, r.err
    assert not marker.exists()


@pytest.mark.parametrize("name", ["evil.h5", "evil.keras"])
@pytest.mark.parametrize("command", [["inspect"], ["bench", "--runs", "2"]])
def test_keras_lambda_is_refused(cli, hostile, marker, name, command):
    line = _refused(cli, hostile, marker, command[0], name, *command[1:], message="Lambda layer 'sneaky'")
    assert name in line


def test_keras_lambda_in_a_nested_model_is_refused(cli, hostile, marker):
    _refused(cli, hostile, marker, "inspect", "nested.h5", message="Lambda layer 'nested'")


def test_keras_convert_with_lambda_writes_nothing(cli, hostile, marker):
    _refused(cli, hostile, marker, "convert", "evil.h5", "-o", "k.onnx", message="Lambda layer")
    assert not (hostile / "k.onnx").exists()


@pytest.mark.parametrize("name", ["evil.h5", "evil.keras"])
def test_keras_lambda_runs_only_with_trust_code(cli, hostile, marker, name):
    r = cli("inspect", name, "--trust-code", cwd=hostile)  # the flag works after the command too
    assert r.rc == 0, r.err
    assert marker.exists()


def test_trust_from_the_environment(cli, hostile, marker, monkeypatch):
    monkeypatch.setenv("OPTKIT_TRUST_CODE", "1")
    r = cli("inspect", "evil.h5", cwd=hostile)
    assert r.rc == 0, r.err
    assert marker.exists()


@pytest.mark.parametrize("name", ["plain.h5", "plain.keras"])
def test_keras_without_code_loads_without_trust(cli, hostile, marker, name):
    r = cli("inspect", name, cwd=hostile)
    assert r.rc == 0, r.err


def test_pickled_whole_model_weights_need_trust(cli, hostile, marker, tmp_path):
    out = tmp_path / "f.onnx"
    _refused(cli, hostile, marker, "convert", "factory.py:make", "--weights", "whole.pt", "-o", str(out),
             message="pickled whole model")
    assert not out.exists()
    r = cli("--trust-code", "convert", "factory.py:make", "--weights", "whole.pt", "-o", str(out), cwd=hostile)
    assert r.rc == 0, r.err
    assert out.exists()


def test_a_recipe_cannot_grant_trust(cli, hostile, marker, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nname: sneaky\nmodel: {{path: {hostile / 'evil.h5'}}}\n"
                      "stages:\n  - pass: convert.tf\n")
    r = cli("run", str(recipe), "--workspace", str(tmp_path / "ws"), cwd=tmp_path)
    line = one_error_line(r)
    assert r.rc == 2, r.err
    assert "--trust-code" in line
    assert not marker.exists()


@pytest.mark.parametrize("corrupt, message", [
    (lambda good: good[: len(good) // 3], "cannot load"),
    (lambda good: b"\x00" * 512, "cannot load"),
    (lambda good: b"PK\x05\x06" + b"\x00" * 18, "cannot load"),  # an empty zip
    (lambda good: good.replace(b"model.json", b"mod3l.json"), "cannot load"),
])
def test_corrupt_pt2_is_one_line(cli, hostile, marker, tmp_path, corrupt, message):
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(corrupt((hostile / "good.pt2").read_bytes()))
    r = cli("inspect", str(bad), cwd=tmp_path)
    line = one_error_line(r)
    assert r.rc == 2, r.err
    assert "bad.pt2" in line
    assert len([x for x in r.err.splitlines() if x.strip()]) == 1, r.err
