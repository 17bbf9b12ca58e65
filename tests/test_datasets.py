"""Data: .npz, image folders and IDX files, deterministic subsets, binding to a model's inputs."""
from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from optkit.core.errors import UsageError
from optkit.core.shapes import TensorSpec
from optkit.measure.datasets import Preprocess, load_dataset, read_idx


def test_npz_binds_by_input_name(samples):
    ds = load_dataset(samples / "digits_eval_nchw.npz")
    assert len(ds) == 497 and ds.labels.dtype == np.int64
    feeds = ds.bind([TensorSpec("input", [None, 1, 8, 8], "float32")])
    assert feeds["input"].shape == (497, 1, 8, 8)
    with pytest.raises(UsageError, match="model's inputs are x"):
        ds.bind([TensorSpec("x", [None, 1, 8, 8], "float32")])


def test_bind_reshapes_only_across_unit_dims(samples):
    ds = load_dataset(samples / "digits_eval_nchw.npz")
    feeds = ds.bind([TensorSpec("input", [None, 8, 8], "float64")])
    assert feeds["input"].shape == (497, 8, 8) and feeds["input"].dtype == np.float64
    with pytest.raises(UsageError, match="per-sample shape"):
        ds.bind([TensorSpec("input", [None, 3, 8, 8], "float32")])


def test_subset_is_deterministic(samples):
    ds = load_dataset(samples / "digits_eval_nchw.npz")
    a, b = ds.subset(50, seed=3), ds.subset(50, seed=3)
    assert np.array_equal(a.labels, b.labels) and np.array_equal(a.arrays["input"], b.arrays["input"])
    assert not np.array_equal(a.arrays["input"], ds.subset(50, seed=4).arrays["input"])
    assert ds.subset(None) is ds


def _write_idx(path, arr, code):
    header = struct.pack(">HBB", 0, code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.tobytes())


def test_idx_images_with_labels_beside_them(tmp_path):
    images = np.arange(3 * 4 * 4, dtype=np.uint8).reshape(3, 4, 4)
    _write_idx(tmp_path / "t-images-idx3-ubyte.gz", images, 0x08)
    _write_idx(tmp_path / "t-labels-idx1-ubyte.gz", np.array([1, 2, 3], dtype=np.uint8), 0x08)
    ds = load_dataset(tmp_path / "t-images-idx3-ubyte.gz")
    assert ds.arrays[""].shape == (3, 4, 4)
    assert np.allclose(ds.arrays[""], images / 255.0) and list(ds.labels) == [1, 2, 3]
    assert np.array_equal(read_idx(tmp_path / "t-images-idx3-ubyte.gz"), images)


def test_truncated_idx_is_a_usage_error(tmp_path):
    path = tmp_path / "bad-images-idx3-ubyte"
    path.write_bytes(struct.pack(">HBB", 0, 8, 3) + struct.pack(">3I", 10, 28, 28) + b"\x00" * 100)
    with pytest.raises(UsageError, match="truncated"):
        load_dataset(path)


def test_image_folder_with_preprocessing(tmp_path):
    from PIL import Image

    for cls, color in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
        (tmp_path / cls).mkdir()
        for i in range(2):
            Image.new("RGB", (40, 30), color).save(tmp_path / cls / f"{i}.png")
    pre = Preprocess(resize=20, center_crop=16, mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5], layout="nchw")
    ds = load_dataset(tmp_path, pre)
    x = ds.arrays[""]
    assert x.shape == (4, 3, 16, 16) and ds.classes == ["cat", "dog"] and list(ds.labels) == [0, 0, 1, 1]
    assert np.allclose(x[0, 0], 1.0) and np.allclose(x[0, 2], -1.0)  # red cat: R=1, B=-1
    bgr = load_dataset(tmp_path, Preprocess(color="bgr", layout="nhwc")).arrays[""]
    assert bgr.shape == (4, 30, 40, 3) and np.allclose(bgr[0, 0, 0], [0, 0, 1])


def test_bad_data_sources(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        load_dataset(tmp_path / "missing.npz")
    (tmp_path / "x.bin").write_text("1,2")
    with pytest.raises(UsageError, match="cannot read data"):
        load_dataset(tmp_path / "x.bin")
    (tmp_path / "x.csv").write_text("1,2")   # text data: tokenized by a model's tokenizer, and none is given
    with pytest.raises(UsageError, match="is text data, tokenized by the model's own tokenizer"):
        load_dataset(tmp_path / "x.csv")
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(UsageError, match="cannot read"):
        load_dataset(tmp_path / "broken.npz")
    np.savez(tmp_path / "uneven.npz", input=np.zeros((3, 2)), labels=np.zeros(4))
    with pytest.raises(UsageError, match="different sample counts"):
        load_dataset(tmp_path / "uneven.npz")
