"""Evaluation reads its data a batch at a time: peak memory does not grow with the data set (issue 22 item 7)."""
from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest

from optkit.core.shapes import TensorSpec
from optkit.measure.datasets import LazyArray, load_dataset

SIDE = 200  # one sample: 3 x 200 x 200 float32 = 480 KB


def _tiny_model(path, side=SIDE, classes=10):
    """[N,3,side,side] -> GlobalAveragePool -> Flatten -> MatMul [3, classes]: cheap to run."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((3, classes)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("GlobalAveragePool", ["x"], ["p"]),
                           helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("MatMul", ["f", "w"], ["y"])],
                          "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, side, side])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", classes])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def _folder(root, n: int):
    """An image folder of n samples: 8 distinct PNGs and hard links to them (a labels.csv lists each file
    once), listed by labels.csv."""
    from PIL import Image

    root.mkdir()
    rng = np.random.default_rng(1)
    for i in range(8):
        Image.fromarray(rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)).save(root / f"{i}.png")
    for i in range(8, n):
        os.link(root / f"{i % 8}.png", root / f"{i}.png")
    (root / "labels.csv").write_text("file,class_index\n" + "".join(f"{i}.png,{i % 10}\n" for i in range(n)))
    return root


def test_eval_peak_memory_does_not_grow_with_the_data(tmp_path, cli):
    model = _tiny_model(tmp_path / "tiny.onnx")
    peaks, top1 = {}, {}
    for n in (100, 800):
        folder = _folder(tmp_path / f"n{n}", n)
        r = cli("eval", model, "--data", folder, "--json", timeout=120)
        assert r.rc == 0, r.err
        m = json.loads(r.out)["stages"][0]["measurements"]
        assert m["accuracy"]["samples"] == n
        peaks[n], top1[n] = m["memory"]["peak_mb"], m["accuracy"]["top1"]
    grown_inputs_mb = 700 * 3 * SIDE * SIDE * 4 / 2**20   # 320 MiB more inputs; held whole they would show
    # a batch of inputs (64 x 480 KB = 30 MB) and the allocator's slack are all that may differ
    assert peaks[800] - peaks[100] < 100, (peaks, grown_inputs_mb)
    assert top1[100] == pytest.approx(top1[800], abs=0.02)  # the same 8 images over and over


def test_lazy_folder_reads_what_it_is_asked(tmp_path):
    folder = _folder(tmp_path / "imgs", 20)
    ds = load_dataset(folder)
    x = ds.arrays[""]
    assert isinstance(x, LazyArray) and x.shape == (20, 3, SIDE, SIDE) and x.dtype == np.float32
    eager = np.asarray(x)
    assert np.array_equal(x[3:7], eager[3:7]) and np.array_equal(x[-1], eager[-1])
    assert np.array_equal(x[5, 0], eager[5, 0]) and np.array_equal(x[[9, 2]], eager[[9, 2]])
    sub = ds.subset(6, seed=3)
    spec = [TensorSpec("x", ["N", 3, SIDE, SIDE], "float32")]
    streamed, whole = sub.bind(spec, stream=True)["x"], sub.bind(spec)["x"]
    assert isinstance(streamed, LazyArray) and isinstance(whole, np.ndarray)
    assert np.array_equal(streamed[0:6], whole) and float(x.min()) == float(eager.min())


def test_npy_and_stored_npz_read_lazily(tmp_path):
    big = np.random.default_rng(0).standard_normal((80, 3, 128, 128)).astype(np.float32)  # 15.7 MB... and more
    big = np.concatenate([big, big])                                                       # 31 MB: read lazily
    np.save(tmp_path / "x.npy", big)
    ds = load_dataset(tmp_path / "x.npy")
    assert isinstance(ds.arrays[""], LazyArray) and np.array_equal(ds.arrays[""][[1, 2, 3, 150]], big[[1, 2, 3, 150]])
    labels = np.arange(160) % 10
    np.savez(tmp_path / "d.npz", input=big, labels=labels)   # np.savez stores members uncompressed
    with zipfile.ZipFile(tmp_path / "d.npz") as z:
        assert z.getinfo("input.npy").compress_type == zipfile.ZIP_STORED
    ds = load_dataset(tmp_path / "d.npz").subset(50, seed=1)
    assert isinstance(ds.arrays["input"], LazyArray) and isinstance(ds.labels, np.ndarray)
    idx = np.sort(np.random.default_rng(1).choice(160, size=50, replace=False))
    assert np.array_equal(np.asarray(ds.arrays["input"]), big[idx]) and np.array_equal(ds.labels, labels[idx])
    np.savez_compressed(tmp_path / "c.npz", input=big)       # compressed: read whole, as before
    assert isinstance(load_dataset(tmp_path / "c.npz").arrays["input"], np.ndarray)


def test_lazy_npy_with_nan_is_refused_at_load(tmp_path):
    from optkit.core.errors import UsageError

    x = np.zeros((300, 64, 256), np.float32)   # 19.7 MB
    x[250, 3, 7] = np.nan
    np.save(tmp_path / "x.npy", x)
    with pytest.raises(UsageError, match="has 1 non-finite"):
        load_dataset(tmp_path / "x.npy")


def test_calibration_reader_makes_the_same_calls_one_at_a_time(tmp_path):
    from optkit.core.batching import calls
    from optkit.passes.quantize.engine import calibration_reader

    ds = load_dataset(_folder(tmp_path / "imgs", 40))
    spec = [TensorSpec("x", ["N", 3, SIDE, SIDE], "float32")]
    eager = list(calls(spec, ds.bind(spec)))
    reader = calibration_reader(spec, ds.bind(spec, stream=True))
    for _ in range(2):  # and again after a rewind
        got = []
        while (call := reader.get_next()) is not None:
            got.append(call)
        assert len(got) == len(eager) == 2
        assert all(np.array_equal(a["x"], b["x"]) for a, b in zip(got, eager))
        reader.rewind()
