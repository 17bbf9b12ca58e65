"""Hostile and careless use of the command line: outputs that would destroy something, interrupts, closed
pipes, bad flags and file names with markup. Each case asserts the exit code, the one-line message and the
file system afterwards. (Data, consent, pipeline and ONNX conformance cases live in test_hostile_*.py and
test_conformance.py.)
"""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import one_error_line

CNN = "torch_cnn.onnx"
CALIB = "digits_calib_nchw.npz"
EVAL = "digits_eval_nchw.npz"


@pytest.fixture
def work(tmp_path, samples):
    """A folder holding copies of a model and its data, so nothing under test can touch the samples."""
    for name in (CNN, CALIB, EVAL):
        (tmp_path / name).write_bytes((samples / name).read_bytes())
    return tmp_path


def snapshot(folder: Path) -> dict:
    """Every entry under `folder` with its kind and content hash, to prove nothing changed."""
    out = {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        kind = stat.S_IFMT(st.st_mode)
        out[str(p.relative_to(folder))] = (kind, p.read_bytes() if stat.S_ISREG(st.st_mode) else None)
    return out


def refused(cli, work, *args, message: str, rc: int = 2):
    before = snapshot(work)
    r = cli(*args, cwd=work)
    line = one_error_line(r)
    assert r.rc == rc, (args, r.rc, r.err)
    assert message in line, (args, line)
    assert snapshot(work) == before, f"{args} changed the folder"
    return line


# ------------------------------------------------------------------ outputs that are not ours to replace

OUTPUT_COMMANDS = {
    "simplify": lambda out: ["simplify", CNN, "-o", out],
    "quantize": lambda out: ["quantize", CNN, "--mode", "dynamic", "--allow-slower", "-o", out],
    "quantize-static": lambda out: ["quantize", CNN, "--calibration-data", CALIB, "-o", out],
    "bench-report": lambda out: ["bench", CNN, "--runs", "5", "--report", out],
    "eval-report": lambda out: ["eval", CNN, "--data", EVAL, "--report", out],
    "simplify-report": lambda out: ["simplify", CNN, "-o", "s.onnx", "--report", out],
}


@pytest.mark.parametrize("command", sorted(OUTPUT_COMMANDS))
def test_output_that_is_a_folder_is_refused_and_kept(cli, work, command):
    folder = work / "models"
    folder.mkdir()
    (folder / "keep.txt").write_text("precious")
    refused(cli, work, *OUTPUT_COMMANDS[command]("models"), message="is an existing folder")
    assert (folder / "keep.txt").read_text() == "precious"


@pytest.mark.parametrize("dest, message", [(".", "is a folder, not a file name"), ("..", "is a folder, not a file name"),
                                           ("./", "ends with '/', which names a folder")])
def test_output_dot_is_refused(cli, work, dest, message):
    refused(cli, work, "simplify", CNN, "-o", dest, message=message)


@pytest.mark.parametrize("command", ["simplify", "bench-report"])
def test_output_device_is_refused(cli, work, command):
    refused(cli, work, *OUTPUT_COMMANDS[command]("/dev/null"), message="not a regular file")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_output_fifo_is_refused(cli, work):
    os.mkfifo(work / "pipe")
    refused(cli, work, "simplify", CNN, "-o", "pipe", message="not a regular file")
    assert stat.S_ISFIFO((work / "pipe").lstat().st_mode)


def test_output_symlink_to_the_input_is_refused(cli, work):
    (work / "link.onnx").symlink_to(CNN)
    refused(cli, work, "simplify", CNN, "-o", "link.onnx", message="symbolic link")


def test_output_symlink_elsewhere_is_refused(cli, work):
    (work / "other.onnx").write_bytes(b"not ours")
    (work / "link.onnx").symlink_to("other.onnx")
    refused(cli, work, "quantize", CNN, "--mode", "dynamic", "-o", "link.onnx", message="symbolic link")


def test_output_hard_link_of_the_input_is_refused(cli, work):
    os.link(work / CNN, work / "hard.onnx")
    refused(cli, work, "simplify", CNN, "-o", "hard.onnx", message="is also an input")


def test_input_named_through_a_symlink_is_still_the_input(cli, work):
    (work / "alias.onnx").symlink_to(CNN)
    refused(cli, work, "simplify", "alias.onnx", "-o", CNN, message="is also an input")


@pytest.mark.parametrize("args, message", [
    (["bench", CNN, "--report", CNN], "--report torch_cnn.onnx is also an input"),
    (["eval", CNN, "--data", EVAL, "--report", CNN], "is also an input"),
    (["eval", CNN, "--data", EVAL, "--report", EVAL], "is also an input"),
    (["eval", CNN, "--data", EVAL, "--reference", "ref.onnx", "--report", "ref.onnx"], "is also an input"),
    (["quantize", CNN, "--mode", "dynamic", "-o", "q.onnx", "--report", "q.onnx"], "name the same file"),
    (["quantize", CNN, "--calibration-data", CALIB, "-o", CALIB], "is also an input"),
    (["quantize", CNN, "--mode", "dynamic", "--eval-data", EVAL, "-o", EVAL], "is also an input"),
    (["quantize", CNN, "--mode", "dynamic", "-o", "q.onnx", "--report", CALIB, "--calibration-data", CALIB],
     "is also an input"),
    (["simplify", CNN, "-o", "s.onnx", "--data", EVAL, "--report", EVAL], "is also an input"),
    (["simplify", CNN, "-o", CNN], "is also an input"),
    (["convert", CNN, "-o", CNN], "is also an input"),
    (["trt", "build", CNN, "-o", "m.engine", "--timing-cache", CNN], "is also an input"),
    (["trt", "build", CNN, "-o", "m.engine", "--report", "m.engine"], "name the same file"),
])
def test_outputs_never_overwrite_inputs(cli, work, args, message):
    (work / "ref.onnx").write_bytes((work / CNN).read_bytes())
    refused(cli, work, *args, message=message)


def _report(cli, work) -> Path:
    r = cli("bench", CNN, "--runs", "5", "--report", "r.json", cwd=work)
    assert r.rc == 0, r.err
    return work / "r.json"


@pytest.mark.parametrize("flag", ["--junit", "--markdown", "--output"])
def test_gate_outputs_never_overwrite_the_report(cli, work, flag):
    _report(cli, work)
    refused(cli, work, "gate", "r.json", "size_mb <= 5", flag, "r.json", message="is also an input")


def test_gate_output_never_overwrites_the_baseline(cli, work):
    _report(cli, work)
    (work / "base.json").write_bytes((work / "r.json").read_bytes())
    refused(cli, work, "gate", "r.json", "size_mb <= 5", "--baseline", "base.json", "--junit", "base.json",
            message="is also an input")


def test_report_render_never_overwrites_its_input(cli, work):
    _report(cli, work)
    refused(cli, work, "report", "render", "r.json", "--format", "md", "-o", "r.json", message="is also an input")


def test_recipe_new_never_replaces_a_folder(cli, work):
    (work / "r.yaml").mkdir()
    refused(cli, work, "recipe", "new", "r.yaml", "--force", message="is an existing folder")


@pytest.mark.parametrize("dest, message", [
    ("missing/out.onnx", "does not exist"),
    (f"{CNN}/out.onnx", "is not a folder"),
    ("x" * 300 + ".onnx", "file name is 305 bytes long"),
])
def test_output_path_problems_are_usage_errors(cli, work, dest, message):
    refused(cli, work, "simplify", CNN, "-o", dest, message=message)


def test_unwritable_output_folder_is_a_usage_error(cli, work):
    # /proc refuses new files even to root: the write fails, and that is the user's path, not our bug
    line = refused(cli, work, "bench", CNN, "--runs", "5", "--report", "/proc/optkit-report.json", message="/proc")
    assert "internal error" not in line


def test_a_long_output_name_leaves_room_for_the_temporary(cli, work):
    name = "y" * 245 + ".onnx"  # 250 bytes: the name is legal, a naive ".NAME.tmp-XXXX.onnx" is not
    r = cli("simplify", CNN, "-o", name, cwd=work)
    assert r.rc == 0, r.err
    assert (work / name).is_file() and not list(work.glob(".*"))


def test_no_arguments_prints_the_help(cli, work):
    for args in ([], ["report"], ["trt"]):
        r = cli(*args, cwd=work)
        assert r.rc == 2 and "Usage:" in r.out + r.err and "Traceback" not in r.err, (args, r.err)


def test_a_regular_output_file_is_replaced(cli, work):
    (work / "s.onnx").write_bytes(b"an old result")
    r = cli("simplify", CNN, "-o", "s.onnx", cwd=work)
    assert r.rc == 0, r.err
    assert (work / "s.onnx").read_bytes()[:2] != b"an"
    assert not list(work.glob(".s.onnx.tmp-*"))


# ------------------------------------------------------------------ interrupts

def _start(args, cwd, env=None):
    # a shell's background job ignores SIGINT; a user's terminal does not: restore the default
    return subprocess.Popen([sys.executable, "-m", "optkit", *map(str, args)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for(predicate, proc, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        if proc.poll() is not None:
            pytest.fail(f"the command ended before the signal: {proc.communicate()}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail("the command never reached the point to interrupt")


def _interrupted(proc, sig, rc, word):
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == rc, (proc.returncode, err)
    errors = [line for line in err.strip().splitlines() if line.startswith("error")]
    assert "Traceback" not in err and len(errors) == 1 and word in errors[0], err
    assert err.strip().splitlines()[-1] == errors[0], err  # progress lines may come before, nothing after
    return out


@pytest.mark.parametrize("sig, rc, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_signal_during_bench(work, sig, rc, word):
    proc = _start(["bench", CNN, "--duration", "60", "--report", "r.json"], work)
    time.sleep(5)  # imports and the session are up; the 60 s timing loop is running in the child
    _interrupted(proc, sig, rc, word)
    assert not (work / "r.json").exists()
    assert not [p for p in work.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("sig, rc, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_signal_during_quantize_leaves_nothing(work, tmp_path_factory, sig, rc, word):
    tmpdir = tmp_path_factory.mktemp("tmpdir")
    proc = _start(["quantize", CNN, "--calibration-data", CALIB, "--eval-data", EVAL, "-o", "q.onnx",
                   "--allow-slower"], work, env={"TMPDIR": str(tmpdir)})
    _wait_for(lambda: any(p.name.startswith("optkit-") for p in tmpdir.iterdir()), proc)  # the pass is working
    time.sleep(0.5)
    _interrupted(proc, sig, rc, word)
    assert sorted(p.name for p in work.iterdir()) == sorted([CNN, CALIB, EVAL])
    assert [p for p in tmpdir.iterdir() if p.name != ".ses"] == []  # .ses: onnxruntime's own session id file


def test_sigint_during_run_says_how_to_resume(work, samples):
    recipe = work / "r.yaml"
    recipe.write_text(f"version: 1\nname: hostile\nmodel: {{path: {CNN}}}\n"
                      f"data: {{eval: {{path: {EVAL}, metric: top1}}}}\n"
                      "stages:\n  - pass: simplify.onnx\n"
                      "measure: {latency: true, trials: 30, runs: 2000}\n")
    proc = _start(["run", "r.yaml", "--workspace", "ws"], work)
    _wait_for(lambda: any((work / "ws").rglob("00-input")), proc)
    out = _interrupted(proc, signal.SIGINT, 130, "resume")
    assert "report" not in out
    runs = [p for p in (work / "ws" / "hostile").iterdir() if p.name != "latest"]
    assert len(runs) == 1 and not (runs[0] / "report.json").exists()


# ------------------------------------------------------------------ messages

@pytest.mark.parametrize("args, message", [
    (["bench", CNN, "--nope"], "no such option: --nope"),
    (["bench"], "give the model to time"),
    (["bench", CNN, "--runs", "abc"], "invalid value for '--runs'"),
    (["bench", CNN, "--runs", "1e20"], "invalid value for '--runs'"),
    (["bench", CNN, "--runs", "0"], "--runs"),
    (["quantize", CNN], "missing option '-o'"),
    (["nosuchcommand"], "no such command"),
    (["report", "compare", "a.json"], "missing argument"),
])
def test_usage_errors_are_one_line(cli, work, args, message):
    line = refused(cli, work, *args, message="", rc=2)
    assert message.lower() in line.lower(), line
    assert "--help" in line or "no such command" in line.lower()


def test_markup_in_file_names_prints_as_written(cli, work):
    (work / "x[").mkdir()
    (work / "[").mkdir()
    for name in ("x[bold].onnx", "x[/y].onnx", "[red]m.onnx", "[/b]z.onnx"):
        (work / name).write_bytes((work / CNN).read_bytes())
        r = cli("inspect", name, cwd=work)
        assert r.rc == 0, r.err
        assert name in r.out


def test_symbolic_shapes_show_in_the_table(cli, work):
    import onnx

    model = onnx.load(work / CNN)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(model, work / "dyn.onnx")
    r = cli("inspect", "dyn.onnx", cwd=work)
    assert r.rc == 0, r.err
    assert "[batch, 1, 8, 8]" in r.out or "[batch,1,8,8]" in r.out, r.out


def test_a_closed_pipe_is_not_a_gate_failure(work):
    cmd = f"{sys.executable} -m optkit inspect {CNN} | head -c 10 >/dev/null; echo ${{PIPESTATUS[0]}}"
    proc = subprocess.run(["bash", "-c", cmd], cwd=work, capture_output=True, text=True, timeout=120)
    rc = int(proc.stdout.strip().splitlines()[-1])
    assert rc in (0, 141), proc
    assert "Traceback" not in proc.stderr and "error" not in proc.stderr


def test_trust_code_is_accepted_after_the_command(cli, work):
    r = cli("inspect", CNN, "--trust-code", cwd=work)
    assert r.rc == 0, r.err
    r = cli("--trust-code", "inspect", CNN, cwd=work)
    assert r.rc == 0, r.err


def test_tensorflow_log_noise_stays_off_stderr(cli, samples):
    r = cli("inspect", samples / "keras_cnn.h5")
    assert r.rc == 0, r.err
    assert r.err.strip() == "", r.err


def test_internal_error_is_reserved_for_bugs(cli, work):
    """An npz with an object array is the user's data, not our bug."""
    np.savez(work / "obj.npz", input=np.array([{"a": 1}], dtype=object))
    r = cli("bench", CNN, "--data", "obj.npz", cwd=work)
    line = one_error_line(r)
    assert r.rc == 2 and "internal error" not in line, line


def test_no_traceback_anywhere_without_debug(cli, work):
    (work / "bad.pt2").write_bytes(b"PK\x03\x04" + os.urandom(200))
    for args in (["inspect", "bad.pt2"], ["bench", "bad.pt2"], ["simplify", "bad.pt2", "-o", "x.onnx"]):
        r = cli(*args, cwd=work)
        one_error_line(r)
        assert r.rc == 2, (args, r.err)
    assert not (work / "x.onnx").exists()


def test_python_api_refuses_the_same_outputs(work):
    from optkit.core.atomic import check_outputs
    from optkit.core.errors import UsageError

    with pytest.raises(UsageError, match="is also an input"):
        check_outputs({"-o": work / CNN}, [work / CNN])
    with pytest.raises(UsageError, match="name the same file"):
        check_outputs({"-o": work / "a.onnx", "--report": work / "a.onnx"})
    with pytest.raises(UsageError, match="existing folder"):
        check_outputs({"-o": work})


# ------------------------------------------------------------------ bad inputs, for every command that reads a model

MODEL_COMMANDS = {
    "inspect": lambda m: ["inspect", m],
    "bench": lambda m: ["bench", m, "--runs", "3"],
    "eval": lambda m: ["eval", m, "--data", EVAL],
    "simplify": lambda m: ["simplify", m, "-o", "out.onnx"],
    "quantize": lambda m: ["quantize", m, "--mode", "dynamic", "-o", "out.onnx"],
    "convert": lambda m: ["convert", m, "-o", "out.onnx"],
}

BAD_MODELS = {
    "missing": (None, "not found"),
    "empty": (b"", ""),
    "garbage": (b"\x08\x07" + bytes(range(256)) * 4, ""),
    "truncated": ("truncate", ""),
}


@pytest.mark.parametrize("problem", sorted(BAD_MODELS))
@pytest.mark.parametrize("command", sorted(MODEL_COMMANDS))
def test_bad_model_is_one_line_and_writes_nothing(cli, work, command, problem):
    content, message = BAD_MODELS[problem]
    name = "bad.onnx"
    if content == "truncate":
        (work / name).write_bytes((work / CNN).read_bytes()[:1500])
    elif content is not None:
        (work / name).write_bytes(content)
    line = refused(cli, work, *MODEL_COMMANDS[command](name), message=message)
    assert "bad.onnx" in line, line


BAD_DATA = {
    "missing file": (None, "not found"),
    "not an npz": (b"hello", ""),
    "wrong input name": ({"nope": np.zeros((4, 1, 8, 8), np.float32)}, ""),
    "wrong shape": ({"input": np.zeros((4, 3, 5, 5), np.float32)}, ""),
    "text values": ({"input": np.array([["a"] * 64] * 4).reshape(4, 1, 8, 8)}, ""),
}


@pytest.mark.parametrize("problem", sorted(BAD_DATA))
@pytest.mark.parametrize("flag", ["bench --data", "eval --data", "quantize --calibration-data"])
def test_bad_data_is_one_line_and_writes_nothing(cli, work, flag, problem):
    content, message = BAD_DATA[problem]
    if isinstance(content, bytes):
        (work / "bad.npz").write_bytes(content)
    elif isinstance(content, dict):
        np.savez(work / "bad.npz", **content, labels=np.zeros(4, np.int64))
    command, option = flag.split()
    extra = {"bench": ["--runs", "3"], "eval": [], "quantize": ["-o", "out.onnx"]}[command]
    line = refused(cli, work, command, CNN, option, "bad.npz", *extra, message=message)
    assert "internal error" not in line


@pytest.mark.parametrize("args, message", [
    (["inspect", "model.xyz"], "model.xyz"),
    (["bench", CNN, "--shape", "input=1,x,8,8"], "--shape"),
    (["bench", CNN, "--shape", "nosuch=1,1,8,8"], "nosuch"),
    (["bench", CNN, "--threads", "100000"], "--threads"),
    (["bench", CNN, "--duration", "inf"], "--duration"),
    (["bench", CNN, "--duration", "nan"], "--duration"),
    (["quantize", CNN, "--mode", "int3", "-o", "q.onnx"], "int3"),
    (["eval", CNN, "--data", EVAL, "--metric", "nosuch"], "nosuch"),
])
def test_bad_options_are_one_line(cli, work, args, message):
    if args[1] == "model.xyz":
        (work / "model.xyz").write_bytes(b"???")
    line = refused(cli, work, *args, message="")
    assert message in line, line


@pytest.mark.parametrize("sig, rc, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_signal_during_bench_with_data_writes_no_report(work, sig, rc, word):
    proc = _start(["bench", CNN, "--data", EVAL, "--runs", "1000000", "--duration", "60", "--report", "r.json"],
                  work)
    time.sleep(5)
    _interrupted(proc, sig, rc, word)
    assert not (work / "r.json").exists()
    assert sorted(p.name for p in work.iterdir()) == sorted([CNN, CALIB, EVAL])


@pytest.mark.parametrize("command", [["inspect", CNN], ["bench", CNN, "--runs", "3"], ["--help"]])
def test_closed_pipe_exits_quietly(work, command):
    cmd = f"{sys.executable} -m optkit {' '.join(command)} | head -c 1 >/dev/null; echo ${{PIPESTATUS[0]}}"
    proc = subprocess.run(["bash", "-c", cmd], cwd=work, capture_output=True, text=True, timeout=120)
    assert int(proc.stdout.strip().splitlines()[-1]) in (0, 141), proc
    assert proc.stderr.strip() == "", proc.stderr


@pytest.mark.parametrize("args", [
    ["quantize", CNN, "--calibration-data", CALIB, "-o", "q.onnx", "--allow-slower", "--no-latency-search"],
    ["quantize", CNN, "--mode", "dynamic", "-o", "q.onnx", "--allow-slower"],  # on any CPU
    ["simplify", CNN, "-o", "q.onnx"],
])
def test_the_working_folder_gets_only_the_output(cli, work, tmp_path_factory, args):
    """onnxruntime's helpers write scratch files (<uuid>.data, sym_shape_infer_temp.onnx) to the cwd and the
    temporary folder: they must land in optkit's own scratch folder, which is removed."""
    tmpdir = tmp_path_factory.mktemp("tmpdir")
    r = subprocess.run([sys.executable, "-m", "optkit", *args], cwd=work, capture_output=True, text=True,
                       env={**os.environ, "TMPDIR": str(tmpdir)}, timeout=600)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in work.iterdir()) == sorted([CNN, CALIB, EVAL, "q.onnx"])
    assert [p for p in tmpdir.iterdir() if p.name != ".ses"] == []  # .ses: onnxruntime's own session id file


def test_interrupt_caught_inside_exec_still_exits_130(tmp_path):
    # CPython ends a `python -m` process by SIGINT when a KeyboardInterrupt was raised inside exec() of a
    # string, even a caught one (dataclasses do that at import); optkit's exit code must still be 130
    (tmp_path / "fake_optkit.py").write_text(
        "import sys\n"
        "from optkit.cli import common, main\n"
        "from optkit.core import interrupts\n"
        "def run_app(app, argv):\n"
        "    interrupts.install()\n"
        "    try:\n"
        "        exec('import os, signal, time\\nos.kill(os.getpid(), signal.SIGINT)\\ntime.sleep(5)')\n"
        "    except KeyboardInterrupt:\n"
        "        return common._interrupted()\n"
        "    return 0\n"
        "common.run_app = run_app\n"
        "sys.argv = ['optkit', 'inspect', 'x.onnx']\n"
        "main.main()\n")
    proc = subprocess.run([sys.executable, "-m", "fake_optkit"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
    assert proc.stderr.strip().startswith("error: interrupted"), proc.stderr
