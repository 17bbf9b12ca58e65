"""The command line's conventions (issue 43): `optkit --version`, metavars that say what an option takes, positionals
shown as `MODEL`, and `optkit passes` at 80 columns; each through the real command or the real click tree."""
from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version

import pytest
import typer

from optkit.cli import main

from conftest import ROOT

FRAMEWORKS = ("torch", "tensorflow", "tf2onnx", "onnx", "onnxruntime", "openvino", "tensorrt")


def _every_command():
    """(words, click command, context) of the root, every command and every group's command."""
    root = typer.main.get_command(main.app)
    out, todo = [], [([], root, root.context_class(root, info_name="optkit"))]
    while todo:
        words, cmd, ctx = todo.pop()
        out.append((words, cmd, ctx))
        if hasattr(cmd, "list_commands"):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                todo.append(([*words, name], sub, sub.context_class(sub, info_name=name, parent=ctx)))
    return out


def test_no_typer_metavars_in_any_help():
    """No `<str>`-like type and no `{model}` positional in any --help; each option that takes a value names it."""
    commands = _every_command()
    assert len(commands) > 25
    for words, cmd, ctx in commands:
        text = cmd.get_help(ctx)
        usage = text.splitlines()[0]
        assert not re.search(r"<[a-z][^>]*>", text), (words, re.findall(r"<[a-z][^>]*>", text))
        assert not re.search(r"\{[a-z_]+\}", usage), (words, usage)
        for param in cmd.params:
            if isinstance(param, typer.core.TyperArgument):
                assert param.metavar and param.metavar == param.metavar.upper(), (words, param.name)
            elif not (param.is_flag or param.count):
                assert param.metavar and re.fullmatch(r"[A-Z][A-Z0-9=:,.x_]*|\[[a-z0-9_.|-]+\]|RxC|[A-Z]+=[A-Z,.]+",
                                                      param.metavar), (words, param.name, param.metavar)


def test_metavars_come_from_the_config():
    """A pass's choices are its Config's Literal, its numbers N / FLOAT, its files FILE / PATH."""
    words = dict((" ".join(w), (c, x)) for w, c, x in _every_command())
    cmd, ctx = words["quantize"]
    text = cmd.get_help(ctx)
    assert "Usage: optkit quantize [OPTIONS] MODEL" in text
    assert "--mode [dynamic|static|fp16|int4]" in text
    assert "-o, --output FILE" in text and "--calibration-data PATH" in text
    assert "--calibration-size N" in text and "--max-accuracy-drop FLOAT" in text


def _run(*args, columns="200"):
    import os

    return subprocess.run([sys.executable, "-X", "importtime", "-m", "optkit", *args], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "COLUMNS": columns})


def test_version_imports_no_framework():
    r = _run("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"optkit {version('optkit')}\n"
    imported = {line.split("|")[-1].strip().split(".")[0] for line in r.stderr.splitlines() if "|" in line}
    assert not imported & set(FRAMEWORKS), imported & set(FRAMEWORKS)


@pytest.mark.parametrize("args", [["-v", "--version"], ["--version", "-v"]])
def test_version_verbose_names_every_runtime(args):
    r = _run(*args)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"optkit {version('optkit')}"
    assert [line.split()[0] for line in lines[1:]] == ["onnxruntime", "openvino", "torch", "tensorflow", "tensorrt"]
    assert lines[1].split()[1] == version("onnxruntime")
    assert all(len(line.split(None, 1)) == 2 for line in lines[1:])  # a version or "not installed"
    imported = {line.split("|")[-1].strip().split(".")[0] for line in r.stderr.splitlines() if "|" in line}
    assert not imported & set(FRAMEWORKS), imported & set(FRAMEWORKS)


def test_passes_one_line_each_at_80_columns():
    import json
    import os

    env = {**os.environ, "COLUMNS": "80"}
    short = subprocess.run([sys.executable, "-m", "optkit", "passes"], capture_output=True, text=True, cwd=ROOT,
                           env=env)
    names = [p["name"] for p in json.loads(subprocess.run([sys.executable, "-m", "optkit", "passes", "--json"],
                                                          capture_output=True, text=True, cwd=ROOT).stdout)]
    assert short.returncode == 0, short.stderr
    lines = short.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    assert [line.split()[0] for line in lines[1:]] == names  # a header, then one line a pass
    full = subprocess.run([sys.executable, "-m", "optkit", "-v", "passes"], capture_output=True, text=True,
                          cwd=ROOT, env=env)
    assert full.returncode == 0 and "accepts" in full.stdout and "produces" in full.stdout
    assert len(full.stdout.splitlines()) > 2 * len(lines)
