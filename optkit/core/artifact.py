"""An artifact is a model on disk with its format and lineage."""
from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from optkit.core import hffolder, hub, strictjson
from optkit.core.errors import UsageError
from optkit.core.formats import Format, detect_format, ir_weights, split_factory


@dataclass
class Artifact:
    path: str                      # a file, a folder, or a factory spec (file.py:make_model)
    format: Format
    sha256: str
    parent: str | None = None      # sha256 of the artifact this one was made from
    produced_by: str | None = None  # name of the pass that made it
    config: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. weights file, input shapes

    @classmethod
    def load(cls, spec: str | Path, *, format: Format | str | None = None, **meta: Any) -> Artifact:
        spec = hub.local_model(str(spec)) if isinstance(spec, (str, os.PathLike)) else spec  # org/name: its cached snapshot
        fmt = Format(format) if format else detect_format(spec)
        meta = {k: v for k, v in meta.items() if v is not None}
        return cls(path=str(spec), format=fmt, sha256=content_sha256(spec, fmt, meta.get("weights")), meta=meta)

    def derive(self, path: str | Path, fmt: Format | str, pass_name: str, config: dict, **meta: Any) -> Artifact:
        """The artifact a pass made from this one."""
        fmt = Format(fmt)
        return Artifact(
            path=str(path), format=fmt, sha256=content_sha256(path, fmt),
            parent=self.sha256, produced_by=pass_name, config=config, meta=meta,
        )

    @property
    def name(self) -> str:
        factory = split_factory(self.path) if self.format == Format.TORCH_MODULE else None
        return Path(factory[0] if factory else self.path).stem

    def size_bytes(self) -> int:
        p = Path(self.path)
        if self.format == Format.TORCH_MODULE:
            weights = self.meta.get("weights")
            return Path(weights).stat().st_size if weights else 0
        if self.format == Format.HF:
            return sum(f.stat().st_size for f in hffolder.model_files(p))
        if p.is_dir():
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        return p.stat().st_size + sum(f.stat().st_size for _, f in companion_files(p, self.format))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["format"] = self.format.value
        return d


def content_sha256(spec: str | Path, fmt: Format, weights: str | None = None) -> str:
    h = hashlib.sha256()
    if fmt == Format.TORCH_MODULE:
        target, attr = split_factory(str(spec))
        h.update(attr.encode())
        if target.endswith(".py"):
            _hash_file(h, Path(target))
        else:
            h.update(target.encode())
        if weights:
            _hash_file(h, Path(weights))
        return h.hexdigest()
    p = Path(spec)
    if fmt == Format.HF:  # the files the model is made of (a Hub repository's README or ONNX copies are not)
        for f in hffolder.model_files(p):
            h.update(str(f.relative_to(p)).encode())
            _hash_file(h, f)
        return h.hexdigest()
    _hash_path(h, p)
    if not p.is_dir():
        for location, f in companion_files(p, fmt):
            h.update(b"\0external:" + location.encode())
            _hash_file(h, f)
    return h.hexdigest()


def path_sha256(path: str | Path) -> str:
    """sha256 of a plain file, or of a folder's files and their relative names (data files, not models)."""
    h = hashlib.sha256()
    _hash_path(h, Path(path))
    return h.hexdigest()


def _hash_path(h, p: Path) -> None:
    if p.is_dir():
        for f in sorted(x for x in p.rglob("*") if x.is_file()):
            h.update(str(f.relative_to(p)).encode())
            _hash_file(h, f)
    else:
        _hash_file(h, p)


def companion_files(model: Path, fmt: Format) -> list[tuple[str, Path]]:
    """The files a model file needs beside it: an ONNX model's external data, an OpenVINO IR's weights."""
    if fmt == Format.ONNX:
        return external_data_files(model)
    if fmt == Format.OPENVINO_IR:
        return [(ir_weights(model).name, ir_weights(model))]
    return []


def external_data_files(model: str | Path) -> list[tuple[str, Path]]:
    """The external data files an ONNX model file references: [(location, path)], sorted, each once.

    The model is read without its external data. A location that leaves the model's folder or a file that
    is missing is a usage error: the model's weights would not be what the hash and the size describe.
    """
    model = Path(model)
    try:
        import onnx
        from onnx.external_data_helper import _get_all_tensors

        proto = onnx.load(str(model), load_external_data=False)
        locations = set()
        for t in _get_all_tensors(proto):
            if t.data_location == onnx.TensorProto.EXTERNAL:
                locations.update(e.value for e in t.external_data if e.key == "location")
    except Exception:  # not a readable ONNX file: its bytes are all there is (loading it reports the problem)
        return []
    out = []
    for loc in sorted(locations):
        norm = os.path.normpath(loc)
        if os.path.isabs(loc) or norm == ".." or norm.startswith(".." + os.sep) or norm == ".":
            raise UsageError(f"{model}: external data location {loc!r} is outside the model's folder; "
                             "keep the .data file next to the model")
        f = model.parent / norm
        if not f.is_file():
            raise UsageError(f"{model}: external data file {f} is missing; copy it next to the model")
        out.append((loc, f))
    return out


def _hash_file(h, path: Path) -> None:
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)


def config_key(*parts: Any) -> str:
    """A stable hash of JSON-able parts (used for cache keys)."""
    return hashlib.sha256(strictjson.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
