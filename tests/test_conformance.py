"""ONNX backend node tests through `optkit simplify` and `optkit quantize --mode dynamic`.

Each run must end ok or refused with one `error:` line: no traceback, no "internal error", no hang, and no
exit-0 result whose outputs differ from the reference where onnxruntime matches it (see
benchmarks/conformance.py for the classes). CI runs the first 40 cases (one per operator, in name order);
OPTKIT_CONFORMANCE=200 runs the acceptance sweep.
"""
from __future__ import annotations

import os
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import conformance  # noqa: E402

LIMIT = int(os.environ.get("OPTKIT_CONFORMANCE", "40"))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    cases = conformance.node_cases(tmp_path_factory.mktemp("nodes"), LIMIT)
    assert len(cases) == LIMIT
    return conformance.sweep(cases, jobs=max(1, min(4, os.cpu_count() or 1)), timeout=60)


@pytest.mark.parametrize("command", sorted(conformance.COMMANDS))
def test_no_node_test_ends_badly(results, command):
    bad = {name: outcome for (name, cmd), outcome in results.items() if cmd == command and outcome[0] in conformance.BAD}
    assert bad == {}, bad


def test_the_sweep_does_real_work(results):
    """Not everything refused: most node tests simplify and match the reference."""
    ok = [name for (name, cmd), (cls, detail) in results.items()
          if cmd == "simplify" and cls == "ok" and detail.startswith("matches")]
    assert len(ok) >= LIMIT // 2, len(ok)
