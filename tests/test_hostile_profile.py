"""Red-team reproducers for `optkit profile` and the temporary files of isolated children and libraries:
Ctrl-C / SIGTERM during a profile leaves nothing in $TMPDIR, a 20,000-node graph is profiled in bounded memory
with a capped trace, and `inspect X.pt2` / `convert X.keras` leave $TMPDIR as they found it."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, SAMPLES, Result, one_error_line

BIG_NODES = 20_000
RSS_LIMIT_MB = 1500  # peak RSS of the whole command; it was 3.9 GB at --runs 20 before the bounds


def _chain(path: Path, nodes: int) -> Path:
    """A small model with many cheap nodes: Abs / Neg alternating on a [1, 4] tensor (unary: an Add chain costs
    onnxruntime's basic optimizers four times the session build)."""
    import onnx
    from onnx import TensorProto, helper

    chain, prev = [], "x"
    for i in range(nodes):
        chain.append(helper.make_node("Abs" if i % 2 == 0 else "Neg", [prev], [f"h{i}"], name=f"n{i}"))
        prev = f"h{i}"
    graph = helper.make_graph(chain, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def big_model(tmp_path_factory) -> Path:
    return _chain(tmp_path_factory.mktemp("big") / "big.onnx", BIG_NODES)


@pytest.fixture
def work(tmp_path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


@pytest.fixture
def tmpdir_env(tmp_path) -> Path:
    """A fresh $TMPDIR for the command, to check that it is left as it was: empty."""
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    return folder


def _env(tmpdir: Path) -> dict:
    return {**os.environ, "COLUMNS": "200", "TMPDIR": str(tmpdir)}


def _run(args, cwd: Path, tmpdir: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "optkit", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=_env(tmpdir), timeout=timeout)


def _left(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# ------------------------------------------------------------------ item 4: interrupted profile

def _start(args, cwd: Path, tmpdir: Path) -> subprocess.Popen:
    # its own process group, signalled whole like a terminal does; a shell's `&` ignores SIGINT: restore it
    return subprocess.Popen([sys.executable, "-m", "optkit", *map(str, args)], cwd=cwd, env=_env(tmpdir),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _profiling(tmpdir: Path) -> bool:
    return any(not p.name.startswith("optkit-profile-cal-") for p in tmpdir.rglob("optkit-profile-*"))


@pytest.mark.parametrize("sig, rc, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_signal_during_profile_leaves_no_temporary(big_model, work, tmpdir_env, sig, rc, word):
    model = work / "big.onnx"
    shutil.copy(big_model, model)
    proc = _start(["profile", model.name, "--threads", "1", "--trace", "t.json"], work, tmpdir_env)
    try:
        end = time.monotonic() + 120
        while not _profiling(tmpdir_env):
            if proc.poll() is not None:
                pytest.fail(f"the command ended before the signal: {proc.communicate()}")
            if time.monotonic() > end:
                pytest.fail("the command never reached its profiling phase")
            time.sleep(0.05)
        time.sleep(0.5)
        os.killpg(proc.pid, sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == rc, (proc.returncode, err)
    errors = [line for line in err.strip().splitlines() if line.startswith("error")]
    assert "Traceback" not in err and len(errors) == 1 and word in errors[0], err
    assert err.strip().splitlines()[-1] == errors[0], err
    assert _left(tmpdir_env) == []  # the profile (hundreds of MB on this model) and every folder are gone
    assert _left(work) == ["big.onnx"]  # no trace, no temporary beside it


def _linger(marker: str) -> None:
    """In an isolated child: make a temporary folder, say where, and wait to be stopped; the `finally` is what
    SIGTERM must let run."""
    with tempfile.TemporaryDirectory(prefix="optkit-linger-") as scratch:
        try:
            Path(marker, "scratch").write_text(scratch)
            Path(marker, "pid").write_text(str(os.getpid()))
            time.sleep(120)
        finally:
            Path(marker, "cleaned").write_text("yes")


def test_sigterm_lets_the_child_clean_up(tmp_path, monkeypatch):
    """A child stopped by SIGTERM (what run_isolated sends when interrupted) unwinds: its `finally` runs and its
    temporary folders go; the parent then removes the folder it gave the child."""
    from optkit.core.errors import PassError
    from optkit.core.isolate import run_isolated

    tmp_root = tmp_path / "tmp"
    tmp_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_root))
    marker = tmp_path / "marker"
    marker.mkdir()

    def stop_child():
        end = time.monotonic() + 60
        while not (marker / "pid").exists() and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(0.2)
        os.kill(int((marker / "pid").read_text()), signal.SIGTERM)

    killer = threading.Thread(target=stop_child)
    killer.start()
    with pytest.raises(PassError, match="killed by SIGTERM"):
        run_isolated(_linger, str(marker), what="lingering")
    killer.join()
    scratch = Path((marker / "scratch").read_text())
    assert scratch.is_relative_to(tmp_root) and scratch.parent.name.startswith("optkit-child-")  # its own folder
    assert (marker / "cleaned").read_text() == "yes" and not scratch.exists()
    assert _left(tmp_root) == []


# ------------------------------------------------------------------ item 5: bounds on a large graph

def test_large_graph_profile_is_bounded(big_model, work, tmpdir_env):
    """20,000 nodes at the default --runs 50: fewer calls (said), peak memory bounded, the trace under its cap."""
    from optkit.measure.profile import EVENT_BUDGET, TRACE_CAP_BYTES

    model = work / "big.onnx"
    shutil.copy(big_model, model)
    # the peak RSS of the command and its children (the profiling child among them), read by a wrapper
    wrapper = ("import resource, subprocess, sys\n"
               "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
               "sys.stderr.write(p.stderr)\nsys.stdout.write(p.stdout)\n"
               "print('PEAK_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
               "sys.exit(p.returncode)\n")
    proc = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "optkit", "profile", model.name,
                           "--threads", "1", "--trace", "t.json", "--json"], capture_output=True, text=True,
                          cwd=work, env=_env(tmpdir_env), timeout=600)
    assert proc.returncode == 0, proc.stderr
    body, peak = proc.stdout.rsplit("PEAK_KB", 1)
    peak_mb = int(peak) / 1024
    d = json.loads(body)
    assert d["runs_asked"] == 50 and 1 <= d["runs"] < 50 and (d["runs"] + d["warmup"]) * BIG_NODES <= EVENT_BUDGET
    assert any(f"{BIG_NODES:,} nodes: {d['runs']} calls profiled (of --runs 50)" in n for n in d["notes"]), d["notes"]
    assert d["node_count"] == BIG_NODES and d["total_ms"] > 0
    assert peak_mb < RSS_LIMIT_MB, f"peak RSS {peak_mb:.0f} MB"
    trace = work / "t.json"
    size = trace.stat().st_size
    assert 0 < size <= TRACE_CAP_BYTES
    assert 1 <= d["trace_calls"] <= d["runs"]
    with open(trace, "rb") as f:  # the Chrome trace's frame, without loading 100 MB into the test
        head = f.read(200)
        f.seek(-300, os.SEEK_END)
        tail = f.read()
    assert head.startswith(b'{"traceEvents": [\n{') and tail.rstrip().endswith(b"}")
    assert json.loads(tail[tail.rindex(b'"otherData": ') + 13:].rstrip()[:-1])["optkit"].startswith(
        f"{d['trace_calls']} profiled calls of {d['runs']}")
    assert _left(tmpdir_env) == [] and _left(work) == ["big.onnx", "t.json"]


def test_fewer_calls_are_said_in_the_table_output(work, tmpdir_env):
    model = _chain(work / "mid.onnx", 5000)
    r = _run(["profile", model.name, "--threads", "1"], work, tmpdir_env)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "note: 5,000 nodes: 32 calls profiled (of --runs 50) after 8 warm-up" in text, r.stdout
    assert "(32 calls profiled;" in text
    assert _left(tmpdir_env) == []


def test_plan_calls_and_refusal():
    from optkit.core.errors import UsageError
    from optkit.measure.profile import EVENT_BUDGET, ORT_EVENT_LIMIT, plan_calls

    assert plan_calls(100, 10, 50) == (10, 50, [])  # small graphs: as asked
    warm, calls, notes = plan_calls(BIG_NODES, 10, 50)
    assert (warm + calls) * BIG_NODES <= EVENT_BUDGET and warm >= 1 and calls >= 1 and notes
    assert plan_calls(EVENT_BUDGET, 10, 50)[:2] == (1, 1)  # one warm-up and one call, never none
    with pytest.raises(UsageError, match="at most 1,000,000 events"):
        plan_calls(ORT_EVENT_LIMIT, 10, 50, "huge.onnx")
    assert plan_calls(10, 10, 100_000)[1] == EVENT_BUDGET // 10 - 10  # many runs of a small graph: bounded too


def test_trace_writer_keeps_whole_calls_under_the_cap(tmp_path):
    from optkit.measure.profile import TraceWriter, iter_calls, iter_events

    events = [{"cat": "Session", "name": "model_loading_uri", "ts": 0, "dur": 5, "ph": "X"}]
    for c in range(6):
        t0 = 100 * (c + 1)
        events += [{"cat": "Node", "name": f"n{k}_kernel_time", "ts": t0 + k, "dur": 1, "ph": "X",
                    "args": {"op_name": "Relu", "pad": "x" * 100}} for k in range(5)]
        events.append({"cat": "Session", "name": "model_run", "ts": t0, "dur": 10, "ph": "X"})
    src = tmp_path / "profile.json"
    src.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + "\n]\n")
    per_call = sum(len(json.dumps(e)) + 2 for e in events[1:7])
    cap = 300 + len(json.dumps(events[0])) + 2 * per_call + per_call // 2  # the frame and two calls, not three
    out = tmp_path / "trace.json"
    with open(out, "w") as f:
        writer = TraceWriter(f, skip=1, cap=cap)
        for call in iter_calls(iter_events(src)):
            writer.add(*call)
        writer.close()
    assert out.stat().st_size <= cap
    trace = json.loads(out.read_text())
    runs = [e for e in trace["traceEvents"] if e["name"] == "model_run"]
    assert len(runs) == writer.calls == 2 and runs[0]["ts"] == 200  # the warm-up call (ts 100) is left out
    assert trace["traceEvents"][0]["name"] == "model_loading_uri"
    kernels = [e for e in trace["traceEvents"] if e["cat"] == "Node"]
    assert len(kernels) == 5 * len(runs)  # whole calls only
    assert writer.notes(5) and "first 2 of the 5 profiled calls" in writer.notes(5)[0] and writer.notes(2) == []


@pytest.mark.parametrize("dump", ["ort", "compact"])
def test_profile_file_is_read_in_pieces(tmp_path, monkeypatch, dump):
    from optkit.measure import profile

    events = [{"cat": "Node", "name": f"n{i}_kernel_time", "ts": i, "dur": 1, "args": {"s": "a,]}[{" * (i % 3)}}
              for i in range(50)]
    text = ("[\n" + ",\n".join(json.dumps(e, separators=(",", " :")) for e in events) + "\n]\n" if dump == "ort"
            else json.dumps(events))
    path = tmp_path / "p.json"
    path.write_text(text)
    monkeypatch.setattr(profile, "CHUNK", 7)  # objects cut across every read
    got = list(profile.iter_events(path))
    assert [e for e, _ in got] == events
    assert [json.loads(t) for _, t in got] == events


def test_help_states_the_bounds(tmpdir_env, work):
    from optkit.measure.profile import EVENT_BUDGET, TRACE_CAP_BYTES

    r = _run(["profile", "--help"], work, tmpdir_env)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.replace("│", " ").split())
    assert f"at most {TRACE_CAP_BYTES // 2**20} MB" in text and f"under {EVENT_BUDGET:,}" in text
    readme = " ".join((ROOT / "docs" / "profile.md").read_text().split())
    assert f"{TRACE_CAP_BYTES // 2**20} MB" in readme and f"{EVENT_BUDGET:,}" in readme


# ------------------------------------------------------------------ item 12: libraries' files in $TMPDIR

@pytest.mark.parametrize("case", ["inspect-pt2", "convert-keras", "tflite-keras", "profile-onnx"])
def test_commands_leave_tmpdir_as_they_found_it(work, tmpdir_env, case):
    need = {"inspect-pt2": "torch", "convert-keras": "tf2onnx", "tflite-keras": "tensorflow",
            "profile-onnx": "onnxruntime"}[case]
    if importlib.util.find_spec(need) is None:
        pytest.skip(f"{need} is not installed")
    args = {"inspect-pt2": ["inspect", "torch_cnn.pt2"],  # torch: torchinductor_<user>/
            "convert-keras": ["convert", "keras_cnn.keras", "-o", "x.onnx"],  # autograph: __autograph_generated_*
            "tflite-keras": ["tflite", "keras_cnn.keras", "-o", "x.tflite"],  # TensorFlow outside convert too
            "profile-onnx": ["profile", "torch_cnn.onnx", "--runs", "5", "--trace", "t.json"]}[case]
    shutil.copy(SAMPLES / args[1], work / args[1])
    r = _run(args, work, tmpdir_env)
    assert r.returncode == 0, r.stderr
    assert _left(tmpdir_env) == []


def test_bad_model_still_one_line(work, tmpdir_env):
    bad = work / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 50)
    p = _run(["profile", bad.name], work, tmpdir_env)
    assert p.returncode == 2
    assert "is corrupt or truncated" in one_error_line(Result(p.returncode, p.stdout, p.stderr))
    assert _left(tmpdir_env) == [] and _left(work) == ["bad.onnx"]
