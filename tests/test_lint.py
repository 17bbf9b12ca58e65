"""ruff (pyflakes, import order, pyupgrade; configured in pyproject.toml) finds nothing, so the README's test
command is also the lint step."""
from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def test_ruff_finds_nothing():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
