"""The console tells one short story (issue 43): per stage at most two note lines by default (what was done, the
latency verdict), the reasoning (skipped settings, kernel tables, candidate races) with -v, where every note of
report.json shows as it did before."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import SAMPLES


def _cli(*args, cwd):
    env = {**os.environ, "COLUMNS": "2000"}  # a note is one line, however long
    r = subprocess.run([sys.executable, "-m", "optkit", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                       env=env, timeout=600)
    return r.returncode, r.stdout, r.stderr


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """One static quantize of the sample CNN with its search, -v, and its report."""
    work = tmp_path_factory.mktemp("story")
    rc, out, err = _cli("-v", "quantize", SAMPLES / "torch_cnn.onnx", "-o", work / "q.onnx", "--calibration-data",
                        SAMPLES / "digits_calib_nchw.npz", "--eval-data", SAMPLES / "digits_eval_nchw.npz",
                        "--allow-slower", "--max-candidates", "4", "--report", work / "r.json", cwd=work)
    assert rc == 0, err
    return work, out, json.loads((work / "r.json").read_text())


def _note_lines(out: str, stage: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(f"{stage}: ")]


def test_default_console_has_two_note_lines_a_stage(quantized):
    work, _, report = quantized
    rc, out, err = _cli("report", "render", work / "r.json", cwd=work)
    assert rc == 0, err
    stage = report["stages"][-1]
    lines = _note_lines(out, stage["name"])
    assert len(stage["notes"]) > 2 and 1 <= len(lines) <= 2, lines
    assert lines[0].startswith("quantize: static INT8: ")  # what was done
    assert lines[-1].startswith("quantize: latency: ")      # the verdict, one figure
    assert not any("search race" in line or "kernel table" in line for line in lines)
    assert "candidates tried" not in out


def test_verbose_shows_every_note_and_the_candidates(quantized):
    work, out, report = quantized
    stage = report["stages"][-1]
    assert _note_lines(out, stage["name"]) == [f"{stage['name']}: {n}" for n in stage["notes"]]
    assert "candidates tried" in out
    rc, rendered, err = _cli("-v", "report", "render", work / "r.json", cwd=work)
    assert rc == 0, err
    assert _note_lines(rendered, stage["name"]) == _note_lines(out, stage["name"])


def test_a_report_without_briefs_shows_its_first_two_notes(quantized, tmp_path):
    """A report.json written before briefs were kept reads as before, cut to two notes a stage."""
    _, _, report = quantized
    for stage in report["stages"]:
        stage.pop("brief", None)
    (tmp_path / "old.json").write_text(json.dumps(report))
    rc, out, err = _cli("report", "render", tmp_path / "old.json", cwd=tmp_path)
    assert rc == 0, err
    stage = report["stages"][-1]
    assert _note_lines(out, stage["name"]) == [f"{stage['name']}: {n}" for n in stage["notes"][:2]]
