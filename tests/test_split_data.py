"""optkit split: dynamic dims sized by --data (an .npz, or an image folder for a model taking uint8 images), and
two runs into one output folder (a lock: the second waits) or into a folder whose split.json is not a complete
split output (refused as foreign, nothing overwritten)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from optkit.split import write

from conftest import ROOT, one_error_line


def _page(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 1), dtype=np.uint8)


def test_data_sizes_the_dynamic_dims(cli, preprocessed, tmp_path):
    np.savez(tmp_path / "x.npz", image=_page(37, 53)[None].repeat(2, axis=0))
    r = cli("split", preprocessed, "-o", tmp_path / "a", "--data", tmp_path / "x.npz", "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["dims"] == {"given": {}, "data": {"batch": 2, "height": 37, "width": 53}, "assumed": {}}
    assert doc["data"] == {"path": "x.npz", "kind": "npz"}
    assert doc["inputs"][0]["name"] == "image" and doc["check"]["bit_exact"]
    # the bytes are at the data's batch: the bounded resize + crop runs on the CPU (issue 39, W1), so the naive
    # placement's core takes the 2x8x8 uint8 crop and gives the 2x10 float logits
    assert doc["naive_cut_bytes_per_sample"] == 2 * 8 * 8 + 2 * 10 * 4
    # a --dim that agrees is taken; one the data contradicts is exit 2, one line, nothing written
    r = cli("split", preprocessed, "-o", tmp_path / "b", "--data", tmp_path / "x.npz", "--dim", "height=37", "--json")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["dims"] == {"given": {"height": 37}, "data": {"batch": 2, "width": 53}, "assumed": {}}
    r = cli("split", preprocessed, "-o", tmp_path / "c", "--data", tmp_path / "x.npz", "--dim", "width=64")
    line = one_error_line(r)
    assert r.rc == 2 and "--dim width=64 contradicts --data" in line and "width=53" in line, r.err
    assert not (tmp_path / "c").exists()
    r = cli("split", preprocessed, "-o", tmp_path / "a", "--data", tmp_path / "x.npz")  # the human report says so
    assert r.rc == 0 and "dynamic dims from the data: batch=2, height=37, width=53" in r.out, r.out


def test_image_folder_as_data(cli, preprocessed, samples, tmp_path):
    from PIL import Image

    flat = tmp_path / "pages"
    flat.mkdir()
    Image.fromarray(_page(41, 29)[:, :, 0]).save(flat / "b.png")
    Image.fromarray(np.zeros((60, 70, 3), np.uint8)).save(flat / "c.jpg")   # colour: converted to gray
    (flat / "notes.txt").write_text("not an image")
    r = cli("split", preprocessed, "-o", tmp_path / "a", "--data", flat, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["dims"]["data"] == {"batch": 1, "height": 41, "width": 29}
    assert doc["data"]["kind"] == "images" and doc["data"]["image"] == "b.png" and doc["data"]["images"] == 2
    # class sub-folders, as optkit's image folders have them
    nested = tmp_path / "classes"
    (nested / "cat").mkdir(parents=True)
    Image.fromarray(_page(30, 31)[:, :, 0]).save(nested / "cat" / "x.png")
    r = cli("split", preprocessed, "-o", tmp_path / "b", "--data", nested, "--json")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["data"]["image"] == os.path.join("cat", "x.png")
    # a model taking float tensors: an image folder is not what it takes
    r = cli("split", samples / "torch_cnn.onnx", "-o", tmp_path / "c", "--data", flat)
    assert r.rc == 2 and "uint8 image" in one_error_line(r) and "optkit.preprocess" in one_error_line(r)
    empty = tmp_path / "empty"
    empty.mkdir()
    r = cli("split", preprocessed, "-o", tmp_path / "c", "--data", empty)
    assert r.rc == 2 and "no images found" in one_error_line(r)
    assert not (tmp_path / "c").exists()


def test_a_split_json_without_its_parts_is_foreign(cli, preprocessed, tmp_path):
    out = tmp_path / "split"
    assert cli("split", preprocessed, "-o", out).rc == 0
    doc = json.loads((out / "split.json").read_text())
    assert write.is_split_output(out)
    cases = {
        "lacks core.onnx": lambda d: (d / "core.onnx").unlink(),
        "sha256": lambda d: (d / "core.onnx").write_bytes((d / "core.onnx").read_bytes() + b"\0"),
        "key parts": lambda d: (d / "split.json").write_text(json.dumps({**doc, "parts": []})),
        "does not list": lambda d: (d / "post.onnx").write_bytes(b"a part file its split.json does not list"),
    }
    for says, damage in cases.items():
        d = tmp_path / f"case{len(os.listdir(tmp_path))}"
        d.mkdir()
        for p in out.iterdir():
            (d / p.name).write_bytes(p.read_bytes())
        damage(d)
        before = {p.name: p.read_bytes() for p in d.iterdir()}
        r = cli("split", preprocessed, "-o", d)
        line = one_error_line(r)
        assert r.rc == 2 and "not a previous optkit split output" in line and says in line, (says, r.err)
        assert {p.name: p.read_bytes() for p in d.iterdir()} == before, says
    only = tmp_path / "only"
    only.mkdir()
    (only / "split.json").write_text(json.dumps(doc))   # a split.json alone: its parts are missing
    r = cli("split", preprocessed, "-o", only)
    assert r.rc == 2 and "lacks pre.onnx" in one_error_line(r)
    assert os.listdir(only) == ["split.json"]


def _spawn(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "optkit", *map(str, args)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "200"})


@pytest.mark.parametrize("exists", [False, True], ids=["new-folder", "previous-output"])
def test_a_second_run_waits_for_the_lock(preprocessed, tmp_path, exists, cli):
    """Another holder of the output folder's lock (its parent's while the folder is new): split says it waits,
    writes nothing meanwhile, and finishes once the lock is released."""
    from optkit.core.locks import lock_folder

    out = tmp_path / "split"
    if exists:
        assert cli("split", preprocessed, "-o", out).rc == 0
    before = sorted(p.name for p in tmp_path.iterdir())
    fd = lock_folder(out if exists else tmp_path)
    try:
        proc = _spawn("split", preprocessed, "-o", out, "--dim", "height=20", "--dim", "width=30", "--json")
        waited, line = time.monotonic(), ""
        while "waiting" not in line and time.monotonic() - waited < 120 and proc.poll() is None:
            line = proc.stderr.readline()
        assert "waiting: another optkit split is writing" in line, line + proc.stderr.read()
        time.sleep(0.3)
        assert proc.poll() is None
        assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == before
    finally:
        os.close(fd)
    out_text, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out_text)["dims"]["given"] == {"height": 20, "width": 30}
    assert write.is_split_output(out)
    assert json.loads((out / "split.json").read_text())["dims"]["given"] == {"height": 20, "width": 30}


@pytest.mark.parametrize("exists", [False, True], ids=["new-folder", "previous-output"])
def test_two_splits_racing_into_one_folder(preprocessed, tmp_path, monkeypatch, exists):
    """Two splits whose commits would overlap (each slowed down inside it): the lock runs them one after the
    other, both succeed and the folder is one whole split output. Without the lock the second rename into the
    first's new folder fails, or the file-by-file replacements interleave."""
    import threading

    from optkit.split import split_model

    out = tmp_path / "split"
    if exists:
        split_model(preprocessed, out, dims=["height=16", "width=16"])
    real, inside, most, lock = write.commit_folder, [0], [0], threading.Lock()

    def slow_commit(tmp, dest, **rules):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.5)
        try:
            real(tmp, dest, **rules)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(write, "commit_folder", slow_commit)
    docs, errors = {}, []

    def run(h):
        try:
            docs[h] = split_model(preprocessed, out, dims=[f"height={h}", "width=30"])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(h,)) for h in (20, 24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert most[0] == 1 and sorted(docs) == [20, 24]
    assert write.is_split_output(out)
    assert json.loads((out / "split.json").read_text())["dims"]["given"]["height"] in (20, 24)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["split"]   # no temporary left beside it


def test_image_folder_reader_decodes_as_a_client_sends(tmp_path):
    from PIL import Image

    from optkit.measure.images import client_images

    rgb = np.random.default_rng(1).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "a.png")
    (got, arr), = client_images(Path(tmp_path))[0]
    assert got.name == "a.png" and arr.dtype == np.uint8 and np.array_equal(arr[0], rgb)
    gray = client_images(Path(tmp_path), gray=True)[0][0][1]
    assert gray.shape == (1, 5, 7, 1)
