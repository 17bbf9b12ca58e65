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


def test_no_script_shadows_a_standard_module():
    """Tests put benchmarks/ on sys.path: a benchmarks/profile.py there replaced the standard library's
    `profile`, and torch's dynamo (through cProfile) broke for every later test."""
    names = [p.stem for folder in ("benchmarks", "tests", "sample_models") for p in (ROOT / folder).glob("*.py")]
    assert not [n for n in names if n in sys.stdlib_module_names]
