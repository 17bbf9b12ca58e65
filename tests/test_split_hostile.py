"""optkit split on careless and hostile input: dims too large to synthesize, metadata nested past any parser, and
Ctrl-C while a previous split output is being replaced. Exit 2, one line, nothing half-written."""
from __future__ import annotations

import os
import random
import signal
import threading
import time

import onnx

from optkit.core import interrupts
from optkit.core.atomic import commit_folder, remove, stage_folder
from optkit.split import write

from conftest import one_error_line


def test_dims_too_large_to_synthesize_are_refused(cli, preprocessed, tmp_path):
    out = tmp_path / "split"
    r = cli("split", preprocessed, "-o", out, "--dim", "height=1048576", "--dim", "width=1048576")
    line = one_error_line(r)
    assert r.rc == 2 and "--dim" in line and "GiB" in line and "internal error" not in line, r.err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []
    r = cli("split", preprocessed, "-o", out, "--dim", "height=32", "--dim", "width=48")
    assert r.rc == 0, r.err and (out / "split.json").is_file()


def test_metadata_nested_past_the_parser_is_exit_2(cli, preprocessed, tmp_path):
    proto = onnx.load(str(preprocessed))
    for p in proto.metadata_props:
        if p.key == "optkit.preprocess":
            p.value = "[" * 100_000 + "]" * 100_000
    forged = tmp_path / "forged.onnx"
    onnx.save(proto, str(forged))
    r = cli("split", forged, "-o", tmp_path / "split")
    line = one_error_line(r)
    assert r.rc == 2 and "optkit.preprocess" in line and "RecursionError" not in line, r.err
    assert not (tmp_path / "split").exists()


def test_ctrl_c_while_replacing_a_previous_split_leaves_a_whole_one(cli, preprocessed, tmp_path):
    """SIGINT arriving at any moment of commit_folder (core.atomic) into a previous split output: afterwards the folder is a split
    output (split.json and its parts), never part files without split.json, which the next run refuses as foreign."""
    out = tmp_path / "split"
    assert cli("split", preprocessed, "-o", out).rc == 0
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, interrupts._on_sigint)
    stop = threading.Event()

    rng = random.Random(0)

    def nag():  # one SIGINT at a random moment of the commit (a few hundred microseconds)
        time.sleep(rng.uniform(0, 0.0006))
        if not stop.is_set():
            os.kill(os.getpid(), signal.SIGINT)

    broken, interrupted = 0, 0
    try:
        for _ in range(1000):
            interrupts.received = None
            tmp = None
            t = threading.Thread(target=nag)
            try:
                tmp = stage_folder(out)
                for name, data in files.items():
                    (tmp / name).write_bytes(data)
                t.start()
                commit_folder(tmp, out, ours=write.ours, last=write.DOC)
                t.join()
            except KeyboardInterrupt:
                interrupted += 1
            finally:
                stop.set()
                if t.is_alive() or t.ident:
                    t.join()
                stop.clear()
                if tmp is not None:
                    remove(tmp)
            interrupts.received = None
            broken += not write.is_split_output(out)
            if broken:
                break
    finally:
        stop.set()
        signal.signal(signal.SIGINT, previous)
        interrupts.received = None
    assert interrupted, "no SIGINT landed; the test proves nothing"
    assert broken == 0, "an interrupted replacement left part files without split.json"
    assert sorted(p.name for p in out.iterdir()) == sorted(files)


def test_a_huge_name_read_from_a_file_is_one_bounded_line(cli, preprocessed, tmp_path):
    """A 10 MB tensor name in forged metadata was echoed whole: a 10 MB error line. Still exit 2, one line, the
    start and the end (what to do) kept."""
    proto = onnx.load(str(preprocessed))
    for p in proto.metadata_props:
        if p.key == "optkit.preprocess":
            p.value = '{"input": "image", "outputs": ["' + "x" * 10_000_000 + '"]}'
    forged = tmp_path / "forged.onnx"
    onnx.save(proto, str(forged))
    for args in (("split", forged, "-o", tmp_path / "split"), ("package", forged, "--to", "triton", "-o",
                                                                tmp_path / "repo")):
        r = cli(*args)
        line = one_error_line(r)
        assert r.rc == 2 and len(r.err) < 3000 and "characters left out" in line, len(r.err)
        assert line.startswith("error: ") and "optkit.preprocess" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forged.onnx"]
