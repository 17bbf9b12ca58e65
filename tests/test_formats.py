"""Format detection and artifacts: every sample format, and the bad inputs users really hand us."""
from __future__ import annotations

import shutil

import pytest

from optkit.core.artifact import Artifact
from optkit.core.atomic import atomic_path
from optkit.core.errors import UsageError
from optkit.core.formats import Format, detect_format


@pytest.mark.parametrize("name, fmt", [
    ("torch_cnn.onnx", Format.ONNX),
    ("torch_cnn.ts.pt", Format.TORCHSCRIPT),
    ("torch_cnn.pt2", Format.TORCH_EXPORT),
    ("torch_cnn.py:make_model", Format.TORCH_MODULE),
    ("keras_cnn_savedmodel", Format.TF_SAVEDMODEL),
    ("keras_cnn.keras", Format.KERAS),
    ("keras_cnn.h5", Format.KERAS),
    ("keras_cnn.tflite", Format.TFLITE),
])
def test_detects_every_sample_format(samples, monkeypatch, name, fmt):
    monkeypatch.chdir(samples)
    assert detect_format(name) == fmt


def test_module_factory_spec_is_torch_module():
    assert detect_format("optkit.some.module:make_model") == Format.TORCH_MODULE


def test_state_dict_is_not_mistaken_for_torchscript(samples):
    with pytest.raises(UsageError, match="state dict.*--weights"):
        detect_format(samples / "torch_cnn_state.pt")


@pytest.mark.parametrize("name, content, message", [
    ("model.tflite", b"\x00" * 64, "not a valid TFLite"),
    ("model.h5", b"not hdf5 at all", "not a valid HDF5"),
    ("model.keras", b"PK broken", "not a valid .keras"),
    ("model.pt", b"garbage", "not a valid PyTorch archive"),
    ("model.txt", b"hello", "cannot tell the format"),
    ("model.onnx", b"", "empty"),
])
def test_bad_files_are_usage_errors(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(UsageError, match=message):
        detect_format(path)


def test_missing_model_and_plain_folder(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        detect_format(tmp_path / "nope.onnx")
    with pytest.raises(UsageError, match=r"neither a TensorFlow SavedModel \(saved_model.pb\) nor a Hugging Face model"):
        detect_format(tmp_path)
    with pytest.raises(UsageError, match="factory file"):
        detect_format(tmp_path / "missing.py:make_model")


def test_hugging_face_folders_and_hub_ids(tmp_path, monkeypatch):
    from optkit.core.formats import Format

    (tmp_path / "config.json").write_text("{}")
    assert detect_format(tmp_path) == Format.HF
    st = tmp_path / "st"
    st.mkdir()
    (st / "modules.json").write_text("[]")   # sentence-transformers, its transformer in a sub-folder
    assert detect_format(st) == Format.HF
    monkeypatch.chdir(tmp_path)
    assert detect_format("some-org/some-model") == Format.HF   # no such path: a Hub id
    with pytest.raises(UsageError, match="not found"):
        detect_format("some-org/model.onnx")                      # a missing file, not an id


def test_sha256_follows_content_and_weights(samples, tmp_path):
    a = Artifact.load(samples / "torch_cnn.onnx")
    copy = tmp_path / "copy.onnx"
    shutil.copy(samples / "torch_cnn.onnx", copy)
    assert Artifact.load(copy).sha256 == a.sha256
    copy.write_bytes(copy.read_bytes() + b"\x00")
    assert Artifact.load(copy).sha256 != a.sha256
    factory = f"{samples / 'torch_cnn.py'}:make_model"
    bare = Artifact.load(factory)
    weighted = Artifact.load(factory, weights=str(samples / "torch_cnn_state.pt"))
    assert bare.sha256 != weighted.sha256
    folder = Artifact.load(samples / "keras_cnn_savedmodel")
    assert folder.format == Format.TF_SAVEDMODEL and len(folder.sha256) == 64


def test_derive_records_lineage(samples):
    src = Artifact.load(samples / "torch_cnn.onnx")
    out = src.derive(samples / "torch_cnn.onnx", Format.ONNX, "demo.copy", {"k": 1})
    assert (out.parent, out.produced_by, out.config) == (src.sha256, "demo.copy", {"k": 1})


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    dest = tmp_path / "out.onnx"
    with pytest.raises(RuntimeError):
        with atomic_path(dest) as tmp:
            tmp.write_bytes(b"partial")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with atomic_path(dest) as tmp:
        tmp.write_bytes(b"done")
    assert dest.read_bytes() == b"done" and [p.name for p in tmp_path.iterdir()] == ["out.onnx"]
    assert dest.stat().st_mode & 0o044  # readable by others, like any normal output


def test_atomic_directory_and_missing_folder(tmp_path):
    dest = tmp_path / "saved"
    with atomic_path(dest, directory=True) as tmp:
        (tmp / "saved_model.pb").write_bytes(b"x")
    assert (dest / "saved_model.pb").exists()
    with pytest.raises(UsageError, match="does not exist"):
        with atomic_path(tmp_path / "missing" / "out.onnx"):
            pass
