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
    """One static quantize of the sample CNN with its search, -v, and its report; on one thread, as the search
    times its candidates, so the race's figure of the chosen file is the stage's."""
    import time

    work = tmp_path_factory.mktemp("story")
    t0 = time.perf_counter()
    rc, out, err = _cli("-v", "quantize", SAMPLES / "torch_cnn.onnx", "-o", work / "q.onnx", "--calibration-data",
                        SAMPLES / "digits_calib_nchw.npz", "--eval-data", SAMPLES / "digits_eval_nchw.npz",
                        "--allow-slower", "--max-candidates", "2", "--threads", "1", "--report", work / "r.json", cwd=work)
    assert rc == 0, err
    return work, out, json.loads((work / "r.json").read_text()), err, time.perf_counter() - t0


def _note_lines(out: str, stage: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(f"{stage}: ")]


def test_default_console_has_two_note_lines_a_stage(quantized):
    work, _, report, _, _ = quantized
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
    work, out, report, _, _ = quantized
    stage = report["stages"][-1]
    assert _note_lines(out, stage["name"]) == [f"{stage['name']}: {n}" for n in stage["notes"]]
    assert "candidates tried" in out
    rc, rendered, err = _cli("-v", "report", "render", work / "r.json", cwd=work)
    assert rc == 0, err
    assert _note_lines(rendered, stage["name"]) == _note_lines(out, stage["name"])


def test_a_report_without_briefs_shows_its_first_two_notes(quantized, tmp_path):
    """A report.json written before briefs were kept reads as before, cut to two notes a stage."""
    _, _, report, _, _ = quantized
    for stage in report["stages"]:
        stage.pop("brief", None)
    (tmp_path / "old.json").write_text(json.dumps(report))
    rc, out, err = _cli("report", "render", tmp_path / "old.json", cwd=tmp_path)
    assert rc == 0, err
    stage = report["stages"][-1]
    assert _note_lines(out, stage["name"]) == [f"{stage['name']}: {n}" for n in stage["notes"][:2]]


def test_verbose_ends_with_phase_times_that_add_up_to_the_wall_time(quantized):
    """-v's last line: every phase of the command with its seconds, their sum the wall time, which is no more than
    the process's as the caller measured it (the race was the stage's timing: no phase times the file again)."""
    import re

    _, _, report, err, measured = quantized
    (line,) = [ln for ln in err.splitlines() if "phase times: " in ln]
    phases, wall = line.split("phase times: ", 1)[1].rsplit("; wall ", 1)
    assert "(kernels " in phases and " time " in phases  # the search's own phases, beside the pass
    phases = re.sub(r" \([^)]*\)", "", phases)
    seconds = [float(s) for s in re.findall(r"(?:^|, )[a-z0-9 -]+ (\d+\.\d) s", phases)]
    names = re.findall(r"(?:^|, )([a-z0-9 -]+) \d+\.\d s", phases)
    assert names == ["start-up", "checks and data", "input measured", "quantize pass", "quantize measured",
                     "report and exit"], names
    assert abs(sum(seconds) - float(wall.split()[0])) <= 0.05 * len(seconds) + 0.01, line
    assert float(wall.split()[0]) <= measured + 0.5, (line, measured)
    assert "not timed again" in err  # the stage's latency is the race's figure of the chosen file
    assert report["stages"][-1]["measurements"]["latency_change"]["trials"] >= 2
