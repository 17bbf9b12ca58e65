"""Hostile input to the pipeline (issue 11): ONNX external data that changes under the cache, damaged cache
entries, concurrent runs, recipe names that would leave the workspace, YAML bombs, NaN thresholds and figures,
out-of-range measure settings, reports that are not reports, interrupted runs and markup in user text.

Each case asserts the exit code, the one-line message and the file system afterwards.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_hostile import _interrupted, _wait_for

from conftest import SAMPLES, Result, one_error_line, run_cli

CNN = "torch_cnn.onnx"
EVAL = "digits_eval_nchw.npz"

# A pass that copies its input and waits while a file exists: lets a test hold a run inside a stage (to
# interrupt it, or to start a second run next to it). Loaded by the CLI children through `_cli` below.
HOLD_PASS = '''
import shutil, time
from pathlib import Path
from optkit.core.atomic import atomic_path
from optkit.core.formats import Format
from optkit.core.registry import Pass, PassConfig, register


class HoldConfig(PassConfig):
    hold: str | None = None


@register
class Hold(Pass):
    name = "test.hold"
    summary = "copy an ONNX model, waiting while a file exists (tests)"
    accepts = (Format.ONNX,)
    produces = Format.ONNX
    Config = HoldConfig

    def run(self, artifact, config, ctx):
        end = time.monotonic() + 120
        while config.hold and Path(config.hold).exists() and time.monotonic() < end:
            time.sleep(0.05)
        with atomic_path(ctx.output) as tmp:
            shutil.copyfile(artifact.path, tmp)
        return artifact.derive(ctx.output, Format.ONNX, self.name, config.model_dump())
'''


@pytest.fixture
def work(tmp_path):
    """A folder holding copies of the model and its data (and the hold pass), three levels under tmp_path so
    that a name escaping the workspace would land inside tmp_path, where the test can see it."""
    w = tmp_path / "a" / "b" / "w"
    w.mkdir(parents=True)
    for name in (CNN, EVAL):
        shutil.copyfile(SAMPLES / name, w / name)
    (w / "holdpass.py").write_text(HOLD_PASS)
    return w


def write_recipe(work: Path, stages=None, *, name="r", file="r.yaml", measure=None, gates=(), model=CNN,
                 **extra) -> Path:
    rec = {"version": 1, "model": {"path": str(work / model)},
           "data": {"eval": {"path": str(work / EVAL), "metric": "top1", "max_samples": 50}},
           "stages": stages if stages is not None else [{"pass": "simplify.onnx", "name": "simple"}],
           "measure": measure if measure is not None else {"latency": False}, "gates": list(gates), **extra}
    if name is not None:
        rec["name"] = name
    p = work / file
    p.write_text(yaml.safe_dump(rec, sort_keys=False))
    return p


def _cli_args(args) -> list[str]:
    """The command line of an optkit child that also registers the hold pass."""
    code = ("import sys; sys.path.insert(0, '.'); import holdpass; from optkit.cli.main import main; "
            "sys.argv = ['optkit'] + sys.argv[1:]; main()")
    return [sys.executable, "-c", code, *map(str, args)]


def cli(work: Path, *args, timeout: float = 300):
    proc = subprocess.run(_cli_args(args), cwd=work, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})
    return Result(proc.returncode, proc.stdout, proc.stderr)


def start(work: Path, *args) -> subprocess.Popen:
    # a shell's background job ignores SIGINT; a user's terminal does not: restore the default
    return subprocess.Popen(_cli_args(args), cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_all(predicate, procs, timeout: float = 60.0) -> None:
    """Wait until predicate() holds while every process in `procs` is still running."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        for p in procs:
            if p.poll() is not None:
                for q in procs:
                    if q.poll() is None:
                        q.kill()
                pytest.fail(f"a command ended early: {p.returncode} {p.communicate()}")
        time.sleep(0.1)
    for p in procs:
        p.kill()
    pytest.fail(f"the commands never got there: {[p.communicate() for p in procs]}")


def refused(r, message: str, rc: int = 2) -> str:
    line = one_error_line(r)
    assert r.rc == rc, (r.rc, r.err)
    assert message in line, line
    return line


def tree(folder: Path) -> dict:
    """Every entry under `folder`: relative path -> file bytes (None for folders and links)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        out[str(p.relative_to(folder))] = p.read_bytes() if p.is_file() and not p.is_symlink() else None
    return out


def runs_of(ws: Path, name: str = "r") -> list[Path]:
    folder = ws / name
    return sorted(p for p in folder.iterdir() if p.name != "latest") if folder.is_dir() else []


def partials(ws: Path, name: str) -> list[Path]:
    """The run folders (not `latest`, a link to one of them) where a stage is being built."""
    return [r for r in runs_of(ws) if (r / name).is_dir()]


def report_of(run: Path) -> dict:
    return json.loads((run / "report.json").read_text())


def status_of(run: Path) -> str:
    return json.loads((run / "run.json").read_text())["status"]


def deterministic(report: dict) -> list:
    """The figures of a report that do not depend on timing: names, passes, hashes, sizes, accuracy, fidelity."""
    out = []
    for s in report["stages"]:
        m = s["measurements"]
        out.append((s["name"], s.get("pass"), s["output"]["sha256"], s["output"]["format"],
                    (m.get("size") or {}).get("bytes"), (m.get("size") or {}).get("parameters"),
                    json.dumps(m.get("accuracy"), sort_keys=True),
                    (m.get("fidelity") or {}).get("cosine"), (m.get("fidelity") or {}).get("max_abs_error")))
    return out


def cache_entries(ws: Path) -> list[Path]:
    return sorted(p for p in (ws / ".cache").iterdir() if p.is_dir()) if (ws / ".cache").is_dir() else []


# ------------------------------------------------------------------ ONNX external data

def _external(work: Path, name="ext.onnx", location="ext.onnx.data") -> Path:
    import onnx

    model = onnx.load(work / CNN)
    onnx.save(model, str(work / name), save_as_external_data=True, all_tensors_to_one_file=True,
              location=location, size_threshold=1024)
    return work / name


def _new_weights(data_file: Path, seed: int) -> None:
    """Other weights of the same size, as a retrained model would have."""
    w = np.fromfile(data_file, dtype=np.float32)
    (np.random.default_rng(seed).standard_normal(w.shape).astype(np.float32) * 0.1).tofile(data_file)


def test_changed_external_weights_are_not_served_from_the_cache(work):
    model = _external(work)
    data = work / "ext.onnx.data"
    write_recipe(work, model="ext.onnx")
    r1 = cli(work, "run", "r.yaml", "--workspace", "ws")
    assert r1.rc == 0, r1.err
    first = report_of((work / "ws" / "r" / "latest").resolve())
    assert first["stages"][0]["measurements"]["size"]["bytes"] == model.stat().st_size + data.stat().st_size

    _new_weights(data, seed=1)  # the .onnx file is byte for byte the same; only its weights changed
    r2 = cli(work, "run", "r.yaml", "--workspace", "ws")
    assert r2.rc == 0, r2.err
    second = report_of((work / "ws" / "r" / "latest").resolve())
    s0, s1 = second["stages"]
    assert s0["output"]["sha256"] != first["stages"][0]["output"]["sha256"]
    assert s1["output"]["sha256"] != first["stages"][1]["output"]["sha256"]
    assert not s1["cached"] and not any("reused from the cache" in n for n in s1["notes"])
    assert s1["measurements"]["fidelity"]["cosine"] > 0.9999   # measured against the new input, not 0.2
    assert len(runs_of(work / "ws")) == 2 and len(cache_entries(work / "ws")) == 2


def test_missing_external_data_is_a_usage_error(work):
    _external(work)
    (work / "ext.onnx.data").unlink()
    write_recipe(work, model="ext.onnx")
    before = tree(work)
    r = cli(work, "run", "r.yaml", "--workspace", "ws")
    refused(r, "external data file")
    assert tree(work) == before and not (work / "ws").exists()


def test_external_data_outside_the_model_folder_is_refused(work):
    import onnx

    (work / "m").mkdir()
    _external(work, name="m/ext.onnx", location="w.data")
    model = onnx.load(str(work / "m" / "ext.onnx"), load_external_data=False)
    for t in model.graph.initializer:  # onnx itself refuses to write such a model: edit the references
        for e in t.external_data:
            if e.key == "location":
                e.value = "../outside.data"
    (work / "m" / "ext.onnx").write_bytes(model.SerializeToString())
    (work / "m" / "w.data").rename(work / "outside.data")
    write_recipe(work, model="m/ext.onnx")
    before = tree(work)
    r = cli(work, "run", "r.yaml", "--workspace", "ws")
    refused(r, "outside the model's folder")
    assert tree(work) == before


# ------------------------------------------------------------------ damaged cache entries

def _damage_truncate(entry: Path) -> None:
    f = entry / "files" / "model.onnx"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _damage_flip(entry: Path) -> None:
    f = entry / "files" / "model.onnx"
    b = bytearray(f.read_bytes())
    b[-100] ^= 0xFF  # same size, one weight byte changed
    f.write_bytes(bytes(b))


def _damage_entry_json(entry: Path) -> None:
    (entry / "entry.json").write_text("[")


def _damage_traversal(entry: Path) -> None:
    e = json.loads((entry / "entry.json").read_text())
    e["artifact"]["path"] = "../../../r.yaml"
    (entry / "entry.json").write_text(json.dumps(e))


def _damage_link(entry: Path) -> None:
    f = entry / "files" / "model.onnx"
    target = entry.parent.parent.parent / "elsewhere.onnx"
    target.write_bytes(f.read_bytes())
    f.unlink()
    f.symlink_to(target)


@pytest.mark.parametrize("damage", [_damage_truncate, _damage_flip, _damage_entry_json, _damage_traversal,
                                    _damage_link], ids=["truncated", "flipped", "entry-json", "traversal", "link"])
def test_a_damaged_cache_entry_is_rebuilt_not_reused(work, damage):
    write_recipe(work)
    r = cli(work, "run", "r.yaml", "--workspace", "ws")
    assert r.rc == 0, r.err
    first = report_of((work / "ws" / "r" / "latest").resolve())
    [entry] = cache_entries(work / "ws")
    damage(entry)
    recipe_bytes = (work / "r.yaml").read_bytes()

    r = cli(work, "run", "r.yaml", "--workspace", "ws")
    assert r.rc == 0, r.err
    second = report_of((work / "ws" / "r" / "latest").resolve())
    stage = second["stages"][1]
    assert not stage["cached"]
    assert any("was dropped; recomputed" in n for n in stage["notes"]), stage["notes"]
    assert deterministic(second) == deterministic(first)
    # the entry was stored again, whole; nothing outside the workspace was read into or written from it
    [entry] = cache_entries(work / "ws")
    files = [p for p in (entry / "files").rglob("*")]
    assert [p.name for p in files] == ["model.onnx"] and not files[0].is_symlink()
    assert (work / "r.yaml").read_bytes() == recipe_bytes
    third = cli(work, "run", "r.yaml", "--workspace", "ws")
    assert third.rc == 0 and report_of((work / "ws" / "r" / "latest").resolve())["stages"][1]["cached"]


# ------------------------------------------------------------------ concurrent runs

def test_two_concurrent_runs_each_get_their_own_folder(work):
    hold = work / "hold"
    hold.touch()
    write_recipe(work, [{"pass": "test.hold", "name": "h", "config": {"hold": "hold"}}])
    ws = work / "ws"
    a = start(work, "run", "r.yaml", "--workspace", "ws")
    _wait_for(lambda: any(ws.glob("r/*/.01-h.partial")), a)          # A is inside the stage, holding its key
    b = start(work, "run", "r.yaml", "--workspace", "ws")
    wait_all(lambda: len(partials(ws, ".01-h.partial")) == 2, [a, b])  # B too, in a folder of its own
    hold.unlink()
    outs = [p.communicate(timeout=120) for p in (a, b)]
    assert (a.returncode, b.returncode) == (0, 0), outs
    runs = runs_of(ws)
    assert len(runs) == 2 and all(status_of(r) == "complete" for r in runs)
    reports = [report_of(r) for r in runs]
    assert sorted(r["stages"][1]["cached"] for r in reports) == [False, True]  # B waited, then reused A's stage
    assert deterministic(reports[0]) == deterministic(reports[1])
    assert {r["run"]["dir"] for r in reports} == {str(Path("ws") / "r" / r.name) for r in runs}
    assert (ws / "r" / "latest").resolve() in [r.resolve() for r in runs]
    assert not list(ws.rglob("*.partial")) and len(cache_entries(ws)) == 1


def test_an_interrupted_run_is_resumed_by_one_of_two_concurrent_runs(work):
    hold = work / "hold"
    hold.touch()
    write_recipe(work, [{"pass": "simplify.onnx", "name": "simple"},
                        {"pass": "test.hold", "name": "h", "config": {"hold": "hold"}}])
    ws = work / "ws"
    p = start(work, "run", "r.yaml", "--workspace", "ws")
    _wait_for(lambda: any(ws.glob("r/*/.02-h.partial")), p)
    _interrupted(p, signal.SIGINT, 130, "resume")
    [old] = runs_of(ws)
    assert status_of(old) == "interrupted"

    a = start(work, "run", "r.yaml", "--workspace", "ws")
    b = start(work, "run", "r.yaml", "--workspace", "ws")
    wait_all(lambda: len(partials(ws, ".02-h.partial")) == 2, [a, b])
    hold.unlink()
    outs = [q.communicate(timeout=120) for q in (a, b)]
    assert (a.returncode, b.returncode) == (0, 0), outs
    runs = runs_of(ws)
    assert len(runs) == 2 and old in runs and all(status_of(r) == "complete" for r in runs)
    assert sorted(bool(report_of(r)["run"]["resumed"]) for r in runs) == [False, True]
    assert report_of(old)["run"]["resumed"]


# ------------------------------------------------------------------ interrupted runs resume

@pytest.mark.parametrize("sig, rc, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_an_interrupted_run_resumes_to_the_same_result(work, sig, rc, word):
    hold = work / "hold"
    hold.touch()
    stages = [{"pass": "simplify.onnx", "name": "simple"}, {"pass": "test.hold", "name": "h", "config": {"hold": "hold"}},
              {"pass": "simplify.onnx", "name": "again"}]
    write_recipe(work, stages, gates=["accuracy_drop <= 0.01", "cosine >= 0.999"])
    ws = work / "ws"
    p = start(work, "run", "r.yaml", "--workspace", "ws")
    _wait_for(lambda: any(ws.glob("r/*/.02-h.partial")), p)
    out = _interrupted(p, sig, rc, word)
    assert "report" not in out
    [run] = runs_of(ws)
    assert status_of(run) == "interrupted"  # not `running`: the process is gone
    assert sorted(x.name for x in run.iterdir()) == ["00-input", "01-simple", "run.json"]  # no partial, no report

    hold.unlink()
    r = cli(work, "run", "r.yaml", "--workspace", "ws")
    assert r.rc == 0, r.err
    assert runs_of(ws) == [run] and status_of(run) == "complete"
    resumed = report_of(run)
    assert resumed["run"]["resumed"]
    assert any("resumed" in n for n in resumed["stages"][1]["notes"])
    assert all(g["passed"] for g in resumed["gates"]) and len(resumed["gates"]) == 2

    fresh = cli(work, "run", "r.yaml", "--workspace", "fresh", "--no-cache")
    assert fresh.rc == 0, fresh.err
    [clean] = runs_of(work / "fresh")
    assert deterministic(report_of(clean)) == deterministic(resumed)
    assert [s["name"] for s in resumed["stages"]] == ["input", "simple", "h", "again"]


def test_a_completed_stage_changed_after_the_interrupt_is_rebuilt(work):
    hold = work / "hold"
    hold.touch()
    write_recipe(work, [{"pass": "simplify.onnx", "name": "simple"},
                        {"pass": "test.hold", "name": "h", "config": {"hold": "hold"}}])
    ws = work / "ws"
    p = start(work, "run", "r.yaml", "--workspace", "ws")
    _wait_for(lambda: any(ws.glob("r/*/.02-h.partial")), p)
    _interrupted(p, signal.SIGINT, 130, "interrupted")
    [run] = runs_of(ws)
    model = run / "01-simple" / "model.onnx"
    model.write_bytes(model.read_bytes()[:1000])  # someone damaged a finished stage's output
    hold.unlink()
    r = cli(work, "run", "r.yaml", "--workspace", "ws")
    assert r.rc == 0, r.err
    rep = report_of(run)
    assert not any("resumed" in n for n in rep["stages"][1]["notes"])  # rebuilt, not trusted
    fresh = cli(work, "run", "r.yaml", "--workspace", "fresh", "--no-cache")
    assert fresh.rc == 0, fresh.err
    assert deterministic(report_of(runs_of(work / "fresh")[0])) == deterministic(rep)


# ------------------------------------------------------------------ recipe names and the workspace

@pytest.mark.parametrize("name", ["../../..", "..", "/tmp/optkit-abs", "a/b", "a\0b", "x" * 300, ".hidden",
                                  "x[/y]", " ", ""], ids=["up3", "up1", "absolute", "slash", "nul", "long",
                                                          "hidden", "markup", "space", "empty"])
def test_recipe_names_never_leave_the_workspace(work, tmp_path, name):
    write_recipe(work, name=name)
    before = tree(tmp_path)
    r = cli(work, "run", "r.yaml", "--workspace", "ws")
    line = refused(r, "recipe name")
    assert repr(name)[:40] in line   # printed as written, no markup interpreted
    assert tree(tmp_path) == before and not Path("/tmp/optkit-abs").exists()


def test_a_recipe_file_name_becomes_a_plain_folder_name(work):
    (work / "x[").mkdir()
    write_recipe(work, name=None, file="x[/y z].yaml")
    r = cli(work, "run", "x[/y z].yaml", "--workspace", "ws")
    assert r.rc == 0, r.err
    assert sorted(p.name for p in (work / "ws").iterdir()) == [".cache", "y_z_"]


def test_workspace_library_guard_refuses_names_outside(tmp_path):
    from optkit.core.errors import UsageError
    from optkit.pipeline.workspace import Workspace

    for name in ("..", "../x", "a/b", "/abs", ".cache", ""):
        with pytest.raises(UsageError, match="not a plain folder name"):
            Workspace(tmp_path / "runs", name)
    assert not (tmp_path / "runs").exists()


def test_a_recipe_folder_that_links_out_of_the_workspace_is_refused(work, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (work / "ws").mkdir()
    (work / "ws" / "r").symlink_to(outside)
    write_recipe(work)
    r = cli(work, "run", "r.yaml", "--workspace", "ws")
    refused(r, "is a link out of the workspace")
    assert list(outside.iterdir()) == []


def test_markup_in_user_text_prints_as_written(work):
    (work / "x[").mkdir()
    write_recipe(work, name=None, file="x[/y].yaml")
    r = cli(work, "run", "x[/y].yaml", "--workspace", "w[/b][bold]")
    assert r.rc == 0, r.err
    assert "w[/b][bold]/y_/" in r.err and "MarkupError" not in r.err
    [run] = runs_of(work / "w[/b][bold]", "y_")
    assert status_of(run) == "complete" and f"reports in w[/b][bold]/y_/{run.name}/" in r.err
    r = cli(work, "run", "x[/y].yaml", "--workspace", "w[/b][bold]", "--dry-run")
    assert r.rc == 0 and "x[/y].yaml" in r.out, r.err


# ------------------------------------------------------------------ YAML bombs

def _billion_laughs() -> str:
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for prev, name in zip("abcdefgh", "bcdefghi"):
        text += f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]\n"
    return text


@pytest.mark.parametrize("text, message", [
    (_billion_laughs(), "expands to more than"),
    ("version: 1\nmodel: &m {path: torch_cnn.onnx, again: *m}\n", "refers to itself"),
    ("a: &a [*a]\n", "refers to itself"),
    ("x: &x 1\ny: [" + ", ".join(["*x"] * 101) + "]\n", "more than 100 YAML aliases"),
    ("model: " + "[" * 5000 + "]" * 5000 + "\n", "nest"),
    ("model: " + "[" * 100 + "]" * 100 + "\n", "nested more than 64 levels"),
    ("version: 1\ndescription: [" + ",".join(["1"] * 150_000) + "]\n", "more than 100000 YAML values"),
], ids=["billion-laughs", "recursive", "self", "aliases", "deep-5000", "deep-100", "flat-150k"])
def test_yaml_bombs_are_refused_quickly(work, text, message):
    (work / "bomb.yaml").write_text(text)
    assert len(text) < 1 << 20
    before = tree(work)
    t0 = time.monotonic()
    r = cli(work, "run", "bomb.yaml", "--workspace", "ws")
    assert time.monotonic() - t0 < 5, "the bound must hold before the work"
    refused(r, message)
    assert tree(work) == before


def test_a_huge_recipe_file_is_refused(work):
    (work / "huge.yaml").write_text("version: 1\n# " + "x" * (1 << 20) + "\n")
    before = tree(work)
    refused(cli(work, "run", "huge.yaml", "--workspace", "ws"), "is over 1048576 bytes")
    assert tree(work) == before


# ------------------------------------------------------------------ thresholds

@pytest.mark.parametrize("gate, message", [
    ("size_mb <= nan", "cannot read gate"),
    ("size_mb <= inf", "cannot read gate"),
    ("size_mb <= 1e999", "not a finite number"),
    ("size_mb <= five", "cannot read gate"),
    ({"metric": "size_mb", "max": float("nan")}, "finite number"),
    ({"metric": "size_mb", "max": float("inf")}, "finite number"),
    ({"metric": "accuracy", "min": float("-inf")}, "finite number"),
    ({"metric": "size_mb", "max": "five"}, "valid number"),
    ({"metric": "size_mb", "op": "<=", "value": "1e999"}, "finite number"),
    ({"metric": "size_mb", "max": [1]}, "valid number"),
], ids=["nan", "inf", "1e999", "word", "map-nan", "map-inf", "map-neg-inf", "map-word", "map-1e999", "map-list"])
def test_a_recipe_gate_threshold_must_be_a_finite_number(work, gate, message):
    write_recipe(work, gates=[gate])
    before = tree(work)
    line = refused(cli(work, "run", "r.yaml", "--workspace", "ws"), message)
    assert "gates[0]" in line or "gate" in line
    assert tree(work) == before


@pytest.fixture(scope="module")
def real_report(tmp_path_factory) -> dict:
    """One real report (size, latency, accuracy and fidelity) to derive hostile copies from."""
    w = tmp_path_factory.mktemp("report")
    for name in (CNN, EVAL):
        shutil.copyfile(SAMPLES / name, w / name)
    write_recipe(w, measure={"runs": 5, "warmup": 1, "trials": 2, "threads": 1})
    r = run_cli("run", "r.yaml", "--workspace", "ws", cwd=w)
    assert r.rc == 0, r.err
    return report_of((w / "ws" / "r" / "latest").resolve())


def _hostile_report(folder: Path, base: dict, edit=None, name="rep.json") -> Path:
    rep = json.loads(json.dumps(base))
    if edit:
        edit(rep)
    p = folder / name
    p.write_text(json.dumps(rep))  # json writes NaN and Infinity as their JavaScript literals, as other tools do
    return p


@pytest.mark.parametrize("gate, message", [
    ("size_mb <= nan", "cannot read gate"), ("size_mb <= 1e999", "not a finite number"),
    ("size_mb <= -1e400", "not a finite number"), ("size_mb <= big", "cannot read gate"),
])
def test_gate_command_refuses_non_finite_thresholds(work, real_report, gate, message):
    _hostile_report(work, real_report)
    before = tree(work)
    refused(cli(work, "gate", "rep.json", gate, "--junit", "j.xml"), message)
    assert tree(work) == before  # no junit written


def _set(group, key, value, stage=1):
    return lambda rep: rep["stages"][stage]["measurements"][group].__setitem__(key, value)


@pytest.mark.parametrize("edit, gate, detail", [
    (_set("fidelity", "cosine", float("nan")), "cosine >= 0.5", "NaN"),
    (_set("fidelity", "cosine", None), "cosine >= 0.5", "NaN"),
    (_set("accuracy", "top1", float("nan")), "accuracy >= 0.5", "NaN"),
    (_set("accuracy", "top1", float("inf")), "accuracy >= 0.5", "not a finite"),
    (_set("accuracy", "top1", float("nan"), stage=0), "accuracy_drop <= 0.01", "NaN"),
    (_set("size", "bytes", float("nan")), "size_mb <= 100", "NaN"),
    (_set("size", "bytes", float("-inf")), "size_mb <= 100", "not a finite"),
    (_set("latency", "p50_ms", float("nan")), "latency_p50_ms <= 1000", "NaN"),
    (_set("latency", "ci95_pct", float("inf")), "latency_p50_ms <= 1000", "noise"),
], ids=["cosine-nan", "cosine-null", "acc-nan", "acc-inf", "first-acc-nan", "size-nan", "size-neg-inf",
        "p50-nan", "noise-inf"])
def test_a_gate_on_a_non_finite_figure_fails(work, real_report, edit, gate, detail):
    _hostile_report(work, real_report, edit)
    r = cli(work, "gate", "rep.json", gate, "--json", "--junit", "j.xml")
    refused(r, "1 of 1 gates failed", rc=1)
    [result] = json.loads(r.out)
    assert result["passed"] is False and detail in result["detail"], result
    assert "<failure" in (work / "j.xml").read_text()


def test_a_gate_on_an_absent_figure_is_still_a_usage_error(work, real_report):
    _hostile_report(work, real_report, lambda rep: rep["stages"][1]["measurements"].pop("fidelity"))
    refused(cli(work, "gate", "rep.json", "cosine >= 0.5"), "has no fidelity figures")


def test_in_process_gates_fail_on_nan_figures():
    from optkit.pipeline.gates import evaluate, parse_gates
    from optkit.report.schema import Report, Stage

    out = {"path": "m.onnx", "format": "onnx", "sha256": "0" * 64}
    rep = Report(stages=[Stage(name="input", output=out, measurements={"size": {"bytes": 10.0}}),
                         Stage(name="q", output=out, measurements={"size": {"bytes": math.nan},
                                                                   "fidelity": {"cosine": math.nan}})])
    results = evaluate(rep, parse_gates(["size_ratio <= 1", "cosine >= 0.9", "size_mb <= 1"]))
    assert [g.passed for g in results] == [False, False, False]


# ------------------------------------------------------------------ measure bounds

@pytest.mark.parametrize("measure, message", [
    ({"threads": 0}, "measure.threads"), ({"threads": 100_000}, "measure.threads"),
    ({"threads": True}, "not a count"), ({"runs": 0}, "measure.runs"), ({"runs": 10**7}, "measure.runs"),
    ({"runs": 1.5}, "measure.runs"), ({"trials": 1000}, "measure.trials"), ({"warmup": -1}, "measure.warmup"),
    ({"batch": 0}, "measure.batch"), ({"duration": 5}, "measure.duration: unknown key"),
    ({"seed": -5}, "measure.seed"), ({"seed": 10**30}, "measure.seed"),
    ({"shapes": {"input": [-1, 1, 8, 8]}}, "measure.shapes"),
    ({"shapes": {"input": [1 << 19, 1, 1 << 10, 8]}}, "elements"),
    ({"threads": float("nan")}, "measure.threads"),
], ids=["threads-0", "threads-huge", "threads-bool", "runs-0", "runs-huge", "runs-frac", "trials-huge", "warmup-neg",
        "batch-0", "duration", "seed-neg", "seed-huge", "shape-neg", "shape-huge", "threads-nan"])
def test_measure_settings_out_of_range_are_refused(work, measure, message):
    write_recipe(work, measure=measure)
    before = tree(work)
    line = refused(cli(work, "run", "r.yaml", "--workspace", "ws"), message)
    assert "r.yaml:" in line and tree(work) == before


# ------------------------------------------------------------------ reports that are not reports

@pytest.mark.parametrize("content, message", [
    ("{}", "is not an optkit report"),
    ("not json at all", "not valid JSON"),
    ("[1, 2]", "is not an optkit report"),
    (b"\xff\xfe\x00", "not valid JSON"),
    (json.dumps({"tool": "optkit", "schema_version": "1.0", "stages": []}), "has no stages"),
    (json.dumps({"tool": "optkit", "schema_version": "1.0", "stages": [{"name": 3}]}), "stages.0"),
    (json.dumps({"tool": "optkit", "schema_version": "9.0",
                 "stages": [{"name": "x", "output": {"path": "m", "format": "onnx", "sha256": "0"}}]}),
     "report schema 9.0"),
], ids=["empty-object", "text", "list", "binary", "no-stages", "stage-type", "schema-9"])
def test_report_compare_refuses_non_reports(work, content, message):
    for name in ("a.json", "b.json"):
        if isinstance(content, bytes):
            (work / name).write_bytes(content)
        else:
            (work / name).write_text(content)
    before = tree(work)
    refused(cli(work, "report", "compare", "a.json", "b.json"), message)
    assert tree(work) == before


@pytest.mark.parametrize("edit, message", [
    (_set("size", "bytes", "big"), "size.bytes is 'big', not a number"),
    (_set("size", "bytes", True), "size.bytes is True, not a number"),
    (_set("latency", "trial_p50_ms", "x"), "latency.trial_p50_ms"),
    (lambda rep: rep["stages"][1]["measurements"].__setitem__("latency", [1]), "latency is not an object"),
    (lambda rep: rep["stages"][1]["measurements"]["accuracy"].__setitem__("metric", ["top1"]), "metric"),
], ids=["size-str", "size-bool", "trials-str", "latency-list", "metric-list"])
@pytest.mark.parametrize("command", [["gate", "rep.json", "size_mb <= 5"], ["report", "compare", "rep.json", "rep.json"],
                                     ["report", "render", "rep.json", "--format", "html"]],
                         ids=["gate", "compare", "render"])
def test_a_report_with_figures_of_the_wrong_type_is_a_usage_error(work, real_report, edit, message, command):
    _hostile_report(work, real_report, edit)
    refused(cli(work, *command), message)


def test_stored_gates_that_are_not_gates_are_a_usage_error(work, real_report):
    _hostile_report(work, real_report, lambda rep: rep.__setitem__("recipe", {"gates": [5]}))
    refused(cli(work, "gate", "rep.json"), "cannot read gate 5")


def test_renderers_survive_non_finite_figures(work, real_report):
    def edit(rep):
        rep["stages"][1]["measurements"]["accuracy"]["top1"] = float("inf")
        rep["stages"][0]["measurements"]["latency"]["p50_ms"] = None

    _hostile_report(work, real_report, edit)
    for fmt in ("console", "md", "html", "junit", "json"):
        r = cli(work, "report", "render", "rep.json", "--format", fmt)
        assert r.rc == 0 and "Traceback" not in r.err, (fmt, r.err)
    r = cli(work, "report", "compare", "rep.json", "rep.json")
    assert r.rc == 0, r.err
    # a NaN noise band is no measurement's (figures.py): every reader refuses it, naming file and key
    _hostile_report(work, real_report, lambda rep: rep["stages"][1]["measurements"]["latency"].__setitem__(
        "ci95_pct", float("nan")))
    r = cli(work, "report", "render", "rep.json")
    assert r.rc == 2 and "rep.json" in r.err and "latency.ci95_pct" in r.err and "Traceback" not in r.err, r.err


def test_gzip_size_counts_external_data(tmp_path):
    import onnx
    from onnx import helper, numpy_helper

    from optkit.core.artifact import Artifact
    from optkit.measure.size import gzip_bytes

    w = numpy_helper.from_array(np.random.default_rng(0).random((128, 128), dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", 1, [1, 128])],
                              [helper.make_tensor_value_info("y", 1, [1, 128])], [w])
    model = helper.make_model(graph)
    onnx.save(model, tmp_path / "inline.onnx")
    onnx.save(model, tmp_path / "ext.onnx", save_as_external_data=True, location="ext.data", size_threshold=0)
    inline, ext = gzip_bytes(Artifact.load(str(tmp_path / "inline.onnx"))), gzip_bytes(Artifact.load(str(tmp_path / "ext.onnx")))
    assert abs(inline - ext) < 0.01 * inline, (inline, ext)
