"""core.isolate's children once torch is loaded: forked by a forkserver (a clean process started once, never
spawned per child), with the environment as the parent has it at each call, and nothing left in $TMPDIR."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

CHILD = """
import os, sys

def child():
    return {"parent": os.getppid(), "env": os.environ.get("OPTKIT_TEST_VAR"),
            "torch": "torch" in sys.modules}
"""
SCRIPT = """
import json, os
import torch  # a framework with threads of its own: children may not be plain forks of this process
from optkit.core.isolate import run_isolated
from isochild import child

first = run_isolated(child, what="first")
os.environ["OPTKIT_TEST_VAR"] = "set after the server started"
second = run_isolated(child, what="second")
print(json.dumps({"first": first, "second": second, "me": os.getpid()}))
"""


@pytest.mark.parametrize("deep", [False, "d" * 90, "\u65e5" * 28])
def test_children_after_torch_come_from_one_forkserver_with_the_current_environment(tmp_path, deep):
    """Under a $TMPDIR too deep for the server's socket path (107 bytes), spawned as before; a folder named in
    a non-ASCII script counts in bytes (28 CJK characters are 84 bytes)."""
    pytest.importorskip("torch")
    tmpdir = Path(tempfile.mkdtemp(prefix="iso-", dir="/tmp"))
    try:
        if deep:
            tmpdir = tmpdir / deep
            tmpdir.mkdir()
        (tmp_path / "isochild.py").write_text(CHILD)
        env = {k: v for k, v in os.environ.items() if k != "OPTKIT_TEST_VAR"}
        r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                           cwd=tmp_path, env={**env, "TMPDIR": str(tmpdir)})
        assert r.returncode == 0, r.stderr[-3000:]
        out = json.loads(r.stdout)
        first, second = out["first"], out["second"]
        assert first["env"] is None and second["env"] == "set after the server started"
        assert list(tmpdir.iterdir()) == []
        if deep:
            assert first["parent"] == second["parent"] == out["me"]
        else:   # both forked by the same server, not by this process; the server never imported torch
            assert first["parent"] == second["parent"] != out["me"]
            assert not first["torch"] and not second["torch"]
    finally:
        shutil.rmtree(tmpdir.parent if deep else tmpdir, ignore_errors=True)
