"""Model formats, detected from the path and the file's content; never guessed silently."""
from __future__ import annotations

import re
import zipfile
from enum import Enum
from pathlib import Path

from optkit.core import hffolder, hub
from optkit.core.errors import UsageError


class Format(str, Enum):
    ONNX = "onnx"
    TORCHSCRIPT = "torchscript"
    TORCH_EXPORT = "torch-export"
    TORCH_MODULE = "torch-module"
    TF_SAVEDMODEL = "tf-savedmodel"
    KERAS = "keras"
    TFLITE = "tflite"
    TRT_ENGINE = "trt-engine"
    HF = "hf"   # a Hugging Face transformers / sentence-transformers folder (core/hffolder.py)
    OPENVINO_IR = "openvino-ir"   # OpenVINO IR: NAME.xml (the graph) and NAME.bin (the weights) beside it

    def __str__(self) -> str:
        return self.value


# A factory spec: `path/to/file.py:make_model` or `pkg.mod:make_model`.
_FACTORY = re.compile(r"^(?P<target>[^:]+\.py|[A-Za-z_][\w.]*):(?P<attr>[A-Za-z_]\w*)$")

_KNOWN = (".onnx, .tflite, .keras, .h5, .pt (TorchScript), .pt2, .engine/.plan, OpenVINO IR .xml (+ .bin), a "
          "SavedModel folder, a Hugging Face folder (config.json) or Hub id (org/name), file.py:factory")


def split_factory(spec: str) -> tuple[str, str] | None:
    """Return (file-or-module, attribute) when `spec` names a Python factory."""
    m = _FACTORY.match(str(spec))
    return (m["target"], m["attr"]) if m else None


def detect_format(spec: str | Path) -> Format:
    """Tell the format of a model from its path and content, or raise a UsageError (exit 2)."""
    spec = str(spec)
    factory = split_factory(spec)
    if factory and not Path(spec).exists():
        target, _ = factory
        if target.endswith(".py") and not Path(target).is_file():
            raise UsageError(f"model factory file {target} not found")
        return Format.TORCH_MODULE
    path = Path(spec)
    if hub.is_hub_id(spec):
        return Format.HF   # a snapshot in the local Hugging Face cache (Artifact.load finds it, or says how to get it)
    if not path.exists():
        raise UsageError(f"model {path} not found")
    if path.is_dir():
        if (path / "saved_model.pb").exists() or (path / "saved_model.pbtxt").exists():
            return Format.TF_SAVEDMODEL
        if hffolder.is_folder(path):
            return Format.HF
        raise UsageError(folder_problem(path))
    if path.stat().st_size == 0:
        raise UsageError(f"model {path} is empty (0 bytes)")
    head = path.read_bytes()[:16]
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        return Format.ONNX
    if suffix == ".tflite" or head[4:8] == b"TFL3":
        if head[4:8] != b"TFL3":
            raise UsageError(f"{path} is not a valid TFLite model (no TFL3 identifier); the file is corrupt or truncated")
        return Format.TFLITE
    if suffix in (".h5", ".hdf5"):
        if not head.startswith(b"\x89HDF"):
            raise UsageError(f"{path} is not a valid HDF5 (.h5) Keras model; the file is corrupt or truncated")
        return Format.KERAS
    if suffix == ".keras":
        if not zipfile.is_zipfile(path):
            raise UsageError(f"{path} is not a valid .keras archive; the file is corrupt or truncated")
        return Format.KERAS
    if suffix == ".xml":
        return _detect_ir(path)
    if suffix in (".engine", ".plan", ".trt"):
        return Format.TRT_ENGINE
    if suffix in (".pt", ".pth", ".pt2"):
        return _detect_torch_archive(path, suffix)
    raise UsageError(f"cannot tell the format of {path}; known formats: {_KNOWN}")


# folders other tools and optkit itself write, which hold models but are not one: (marker file, what the folder is)
_FOLDERS = (
    ("split.json", "an optkit split folder (split.json and its parts; `optkit package` serves the folder as an "
                   "ensemble)"),
    ("config.pbtxt", "a Triton model folder (config.pbtxt; a model of a Triton repository, such as one part of "
                     "the ensemble optkit package wrote)"),
    ("MLmodel", "an MLflow model folder (MLmodel)"),
)
MODEL_SUFFIXES = (".onnx", ".tflite", ".keras", ".h5", ".pt", ".pt2", ".engine", ".plan", ".xml")


def folder_problem(path: Path) -> str:
    """What a folder that is not a SavedModel is, and which of the models in it to give instead."""
    path = Path(path)
    what = next((w for marker, w in _FOLDERS if (path / marker).is_file()), None)
    if path.name.isdigit() and (path.parent / "config.pbtxt").is_file():
        what = f"version {path.name} of the Triton model {path.parent.name} (a model of a Triton repository)"
    models = _models_in(path)
    give = (f"give one of its model files: {', '.join(str(m) for m in models[:3])}"
            + (" ..." if len(models) > 3 else "")) if models else "it holds no model file"
    if what:
        return f"{path} is {what}, not a model file; {give}"
    return (f"{path} is a folder but neither a TensorFlow SavedModel (saved_model.pb) nor a Hugging Face model "
            f"(config.json); {give}")


def _models_in(path: Path, depth: int = 2, limit: int = 200) -> list[Path]:
    """Model files in `path` and its sub-folders up to `depth` levels (the first `limit` entries looked at in
    each), numbered version folders last-first (Triton's newest version first)."""
    try:
        entries = sorted(path.iterdir(), key=lambda p: (not p.is_file(), -int(p.name) if p.name.isdigit() else 0,
                                                        p.name))[:limit]
    except OSError:
        return []
    found = [p for p in entries if p.is_file() and p.suffix.lower() in MODEL_SUFFIXES]
    if depth > 1:
        for sub in entries:
            if sub.is_dir() and not sub.is_symlink():
                found += _models_in(sub, depth - 1, limit)
    return found


def ir_weights(xml: str | Path) -> Path:
    """The weights file of an OpenVINO IR: NAME.bin beside NAME.xml (OpenVINO's own rule)."""
    return Path(xml).with_suffix(".bin")


def _detect_ir(path: Path) -> Format:
    with open(path, "rb") as f:
        head = f.read(512)
    if b"<net" not in head:
        raise UsageError(f"{path} is not an OpenVINO IR (no <net> element at its start); give the .xml that "
                         "OpenVINO's save_model or optkit convert -o NAME.xml wrote")
    if not ir_weights(path).is_file():
        raise UsageError(f"{path} is an OpenVINO IR without its weights: {ir_weights(path)} is missing; copy it "
                         "beside the .xml")
    return Format.OPENVINO_IR


def _detect_torch_archive(path: Path, suffix: str) -> Format:
    if not zipfile.is_zipfile(path):
        raise UsageError(f"{path} is not a valid PyTorch archive; the file is corrupt or truncated")
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
    if any(n.endswith("serialized_exported_program.json") or "/models/" in n and n.endswith(".json") for n in names):
        return Format.TORCH_EXPORT
    if any("/code/" in n for n in names) or any(n.endswith("constants.pkl") for n in names):
        return Format.TORCHSCRIPT
    if suffix == ".pt2":
        return Format.TORCH_EXPORT
    raise UsageError(
        f"{path} holds a pickled state dict or whole model, not TorchScript; "
        "pass a factory (file.py:make_model) and the file as --weights"
    )
