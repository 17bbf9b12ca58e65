"""Red team (issue 29, round 4): every file optkit reads back is user input. A report with a band no measurement
gives is refused by every reader (render, compare, gate, --baseline), naming the file and the key; a report that
is a FIFO, a device, a 2 GB sparse file, too deeply nested or holds an integer past float's range is exit 2 in one
line; the run workspace's own files (run.json, a stage's report.json, a cache entry.json) that are damaged the
same ways are a miss, never a hang, a crash or gigabytes read."""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from optkit.core.errors import UsageError
from optkit.pipeline import workspace
from optkit.report.schema import Report

from conftest import one_error_line, run_cli

# issue 29: every command here leaves HOME and TMPDIR as it found them
pytestmark = pytest.mark.usefixtures("fresh_home_and_tmp")


@pytest.fixture(scope="module")
def bench(sample_bench_report) -> dict:
    return sample_bench_report


def _edited(bench: dict, tmp_path: Path, edit, name: str = "edited.json") -> Path:
    d = copy.deepcopy(bench)
    edit(d["stages"][-1]["measurements"]["latency"])
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def _band(key, value):
    return lambda lat: lat["ci95"].__setitem__(key, value)


@pytest.mark.parametrize("edit, words", [
    (_band("p99_ms", [1e3, 0.0]), "latency.ci95.p99_ms"),             # inverted
    (_band("p90_ms", [float("nan"), 1.0]), "latency.ci95.p90_ms"),    # NaN end
    (_band("p99_ms", "wide"), "latency.ci95.p99_ms"),                 # a string
    (_band("p99_ms", [0.0, 0.5, 1e3]), "latency.ci95.p99_ms"),        # 3 elements
    (_band("p99_ms", [-1.0, 1e3]), "latency.ci95.p99_ms"),            # negative lower end
    (_band("p90_ms", [500.0, 1e3]), "latency.ci95.p90_ms"),           # not holding the value
    (_band("throughput_per_s", [1e9, 1.0]), "latency.ci95.throughput_per_s"),
    (lambda lat: lat.__setitem__("ci95", [1, 2]), "latency.ci95"),
    (lambda lat: lat.__setitem__("runs", -3), "latency.runs"),
])
def test_a_band_no_measurement_gives_is_refused_by_every_reader_naming_file_and_key(bench, tmp_path, edit, words):
    p = _edited(bench, tmp_path, edit)
    before = p.read_bytes()
    with pytest.raises(UsageError, match=str(p)) as e:
        Report.load(p)
    assert words in str(e.value)
    # render, compare and --baseline used to print or compare the bad band silently (exit 0)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(bench))
    for args in (("report", "render", p, "--format", "html"), ("report", "compare", good, p),
                 ("gate", good, "latency_regression_pct <= 1000", "--baseline", p)):
        r = run_cli(*args)
        assert r.rc == 2, (args, r.out, r.err)
        line = one_error_line(r)
        assert str(p) in line and words in line
    assert p.read_bytes() == before


def test_an_integer_past_float_range_is_bad_input_not_an_internal_error(bench, tmp_path):
    p = _edited(bench, tmp_path, lambda lat: lat.__setitem__("runs", 10**400 - 1), "huge.json")
    with pytest.raises(UsageError, match=r"stages\.0\.measurements\.latency\.runs is an integer of 400 digits"):
        Report.load(p)
    r = run_cli("gate", p, "latency_p99_ms <= 1")    # was exit 3: OverflowError
    assert r.rc == 2 and "internal error" not in r.err
    assert str(p) in one_error_line(r)


def test_a_report_nested_too_deep_is_bad_input(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UsageError, match="nested too deep"):     # was a RecursionError (exit 3)
        Report.load(p)


def test_a_report_that_is_no_regular_file_is_refused_without_reading_it(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file"):  # never opened: it would block
        Report.load(fifo)
    with pytest.raises(UsageError, match="not a regular file"):
        Report.load("/dev/zero")
    sparse = tmp_path / "sparse.json"
    with open(sparse, "wb") as f:
        f.truncate(2 << 30)
    with pytest.raises(UsageError, match="over 256 MB"):          # from its size, not 256 MB read first
        Report.load(sparse)


def test_an_open_or_wide_band_is_still_a_band(bench, tmp_path):
    p = _edited(bench, tmp_path, _band("p99_ms", [0.0, None]))
    Report.load(p)
    p = _edited(bench, tmp_path, _band("p99_ms", [0.0, 1e308]))
    Report.load(p)


# ------------------------------------------------------------------ the run workspace's own files read back
def _deep(p: Path) -> None:
    p.write_text("[" * 100_000 + "]" * 100_000)


def _fifo(p: Path) -> None:
    p.unlink(missing_ok=True)
    os.mkfifo(p)


def _sparse(p: Path) -> None:
    with open(p, "wb") as f:
        f.truncate(2 << 30)


def _a_list(p: Path) -> None:
    p.write_text("[1, 2]")


@pytest.mark.parametrize("damage", [_deep, _fifo, _sparse, _a_list])
def test_workspace_state_damaged_is_a_miss_never_a_crash_a_hang_or_gigabytes(tmp_path, damage):
    p = tmp_path / "run.json"
    p.write_text("{}")
    damage(p)
    assert workspace._read_json(p) is None          # was RecursionError, a hang, 2 GB read, AttributeError


def test_run_and_cache_survive_damaged_state_files(tmp_path, samples):
    recipe = tmp_path / "mini.yaml"
    recipe.write_text(f"version: 1\nname: mini\nmodel:\n  path: {samples / 'torch_cnn.onnx'}\nstages:\n"
                      "  - pass: simplify.onnx\n    name: simplify\nmeasure:\n  runs: 5\n  warmup: 1\n"
                      "  trials: 1\n")
    ws = tmp_path / "ws"
    r = run_cli("run", recipe, "--workspace", ws)
    assert r.rc == 0, r.err
    run_dir = (ws / "mini" / "latest").resolve()
    (entry,) = (ws / ".cache").glob("*/entry.json")
    _a_list(run_dir / "run.json")                   # was AttributeError: 'list' object has no attribute 'get'
    _fifo(entry)                                    # was a hang on open()
    r = run_cli("run", recipe, "--workspace", ws, "-v", timeout=120)  # the cache note is the reasoning: -v
    assert r.rc == 0, r.err
    assert "dropped; recomputed" in r.out + r.err


# ------------------------------------------------------------------ renderers: hostile text in every field
EVIL = "A\x1b[31mRED\x07\u202eevil\u2066</script><img src=x onerror=alert(2)>|`c`[l](javascript:x)\r\n]]>\x00\x0b"


def test_junit_from_a_report_with_control_bytes_is_well_formed_xml(bench, tmp_path):
    import xml.dom.minidom

    d = copy.deepcopy(bench)
    d["command"] = EVIL
    d["stages"][-1]["name"] = EVIL
    d["gates"] = [{"gate": EVIL, "metric": EVIL, "stage": EVIL, "value": 1.0, "threshold": 2.0, "op": "<=",
                   "passed": False, "detail": EVIL}]
    p = tmp_path / "evil.json"
    p.write_text(json.dumps(d))
    r = run_cli("report", "render", p, "--format", "junit")
    assert r.rc == 0, r.err
    xml.dom.minidom.parseString(r.out)     # a control byte made the file unreadable to every CI system
    assert not any(c in r.out for c in "\x1b\x07\x00\x0b\u202e\u2066")


def test_a_huge_stage_name_is_refused_before_renderers_repeat_it_per_note(bench, tmp_path):
    d = copy.deepcopy(bench)
    d["stages"][-1]["name"] = "N" * 5_000_000
    d["stages"][-1]["notes"] = ["x"] * 10_000          # html and Markdown repeat the name beside each: 50 GB
    p = tmp_path / "huge.json"
    p.write_text(json.dumps(d))
    r = run_cli("report", "render", p, "--format", "html", "-o", tmp_path / "out.html", timeout=60)
    assert r.rc == 2 and "stages.0.name" in one_error_line(r) and str(p) in r.err
    assert not (tmp_path / "out.html").exists()


# ------------------------------------------------------------------ the API: a path with a NUL character
@pytest.mark.parametrize("call, words", [
    (lambda optkit, m: optkit.run_pass("simplify.onnx", "m\x00.onnx", "o.onnx"), "model:"),
    (lambda optkit, m: optkit.run_pass("simplify.onnx", m, "o\x00.onnx"), "output:"),
    (lambda optkit, m: optkit.run_pass("simplify.onnx", m, "o.onnx", calibration="c\x00.npz"), "calibration:"),
    (lambda optkit, m: optkit.run({"version": 1, "name": "r", "model": {"path": str(m)},
                                   "stages": [{"pass": "simplify.onnx"}]}, workspace="w\x00s"), "workspace:"),
])
def test_api_path_with_a_nul_is_a_usage_error_not_a_bare_valueerror(tmp_path, samples, monkeypatch, call, words):
    import optkit

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="NUL") as e:     # was ValueError: embedded null byte
        call(optkit, samples / "torch_cnn.onnx")
    assert str(e.value).startswith(words) and "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ tune: a journal storage that is no file
def test_tune_journal_storage_that_is_a_fifo_is_exit_2_not_a_hang(tmp_path, samples):
    fifo = tmp_path / "j.fifo"
    os.mkfifo(fifo)
    r = run_cli("tune", samples / "torch_cnn.onnx", "--trials", "2", "--trial-seconds", "0.1", "--confirm", "0",
                "-o", tmp_path / "best.json", "--storage", f"journal:{fifo}", timeout=60)   # hung for ever
    assert r.rc == 2 and "not a regular file" in one_error_line(r)
    assert not (tmp_path / "best.json").exists()
