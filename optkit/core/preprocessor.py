"""A model's preprocessor (a tokenizer, an image processor) travels with it by one rule.

A model made from a Hugging Face folder records, in its ONNX metadata under META_KEY, the folder of preprocessor
files that lies beside it (`model.onnx` -> `model.preprocessor/`) and that folder's sha256. Every pass's output
inherits the record and a copy of the folder (`carry`), so eval, quantize, bench, tune, package and recipes find
the tokenizer with `resolve`, without flags. A folder that is missing or changed since the model was written is
exit 2. A Hugging Face folder is its own preprocessor folder; what a model made from it carries are its
tokenizer / image-processor files and configs (core.hffolder.PREPROCESSOR_FILES), not its weights.
`inherit` is the rule a pipeline applies after every pass, and `carry` what a copy of a model (a published `-o`)
does.

The record also names the Hugging Face folder the model was converted from (`source`: its path and the sha256 of
each file the model is made of), so a package's lineage can name the source folder's hashes after any pass.

The folder holds plain files only (no links, no sub-folders), at most MAX_FILES of at most MAX_BYTES in all, and a
marker MARKER that says optkit wrote it: only such a folder is ever replaced.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from optkit.core import hffolder, strictjson
from optkit.core.artifact import path_sha256
from optkit.core.atomic import atomic_path, commit_folder, remove, stage_folder
from optkit.core.errors import UsageError

META_KEY = "optkit.preprocessor"
SUFFIX = ".preprocessor"
MARKER = "optkit-preprocessor.json"
MAX_FILES = 64
MAX_BYTES = 1 << 30   # a tokenizer is a few MB; a SentencePiece model of a large vocabulary tens of MB


@dataclass(frozen=True)
class Record:
    """What a model's metadata says of its preprocessor folder."""

    folder: str          # the folder's name, beside the model file
    sha256: str          # folder_sha256 of its files (the marker left out)
    kind: str = "tokenizer"   # tokenizer | image-processor
    source: dict | None = None   # the Hugging Face folder it came from: {"path", "files": {name: sha256}}

    def to_json(self) -> str:
        raw = {"folder": self.folder, "sha256": self.sha256, "kind": self.kind}
        if self.source is not None:
            raw["source"] = self.source
        return strictjson.dumps(raw, sort_keys=True)

    def moved(self, folder: str) -> Record:
        """The same record for a copy of the folder under another name."""
        return Record(folder=folder, sha256=self.sha256, kind=self.kind, source=self.source)

    @classmethod
    def from_json(cls, text: str, where: str) -> Record:
        try:
            raw = json.loads(text)
            rec = cls(folder=str(raw["folder"]), sha256=str(raw["sha256"]), kind=str(raw.get("kind", "tokenizer")),
                      source=_source(raw.get("source")))
        except (ValueError, TypeError, KeyError, AttributeError):
            raise UsageError(f"{where}: metadata {META_KEY} is not optkit's record ({{folder, sha256, kind}}); "
                             "convert the model again") from None
        if Path(rec.folder).name != rec.folder or rec.folder in ("", ".", ".."):
            raise UsageError(f"{where}: metadata {META_KEY} names {rec.folder!r}, not a folder beside the model")
        return rec


def _source(raw) -> dict | None:
    """A record's `source`, held to its shape: {"path": str, "files": {str: 64 hex digits}}."""
    if raw is None:
        return None
    files = raw["files"]
    if not isinstance(raw["path"], str) or not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and len(v) == 64 and int(v, 16) >= 0 for k, v in files.items()):
        raise ValueError("source")
    return {"path": raw["path"], "files": dict(files)}


def source_of(folder: Path) -> dict:
    """What a record says of the Hugging Face folder a model came from: its path and each model file's sha256."""
    folder = Path(folder)
    return {"path": str(folder.absolute()),
            "files": {str(f.relative_to(folder)): path_sha256(f) for f in hffolder.model_files(folder)}}


def folder_beside(model: str | os.PathLike) -> Path:
    """Where a model file's preprocessor folder lies: `x/model.onnx` -> `x/model.preprocessor`."""
    model = Path(model)
    name = model.stem + SUFFIX
    if len(os.fsencode(name)) > 255:
        raise UsageError(f"{model}: its preprocessor folder would be named {name[:40]}... ({len(os.fsencode(name))} "
                         "bytes), longer than a file name may be; choose a shorter output name")
    return model.with_name(name)


def files_of(folder: Path) -> list[Path]:
    """The folder's preprocessor files, sorted (the marker left out): plain files only, bounded in count and size;
    anything else is exit 2 naming it."""
    folder = Path(folder)
    found, total = [], 0
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name == MARKER:
            continue
        st = os.lstat(entry.path)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"preprocessor folder {folder}: {entry.name} is not a plain file (a link, folder or "
                             "device); it holds the tokenizer's files only")
        total += st.st_size
        found.append(Path(entry.path))
        if len(found) > MAX_FILES or total > MAX_BYTES:
            raise UsageError(f"preprocessor folder {folder} holds more than {MAX_FILES} files or "
                             f"{MAX_BYTES >> 20} MB; it should hold the tokenizer's files only")
    return found


def folder_sha256(folder: Path) -> str:
    """sha256 of the folder's files and their names (the marker left out)."""
    h = hashlib.sha256()
    for f in files_of(folder):
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def record_of(model_proto, where: str) -> Record | None:
    """The record in an ONNX ModelProto's metadata, or None."""
    raw = next((p.value for p in model_proto.metadata_props if p.key == META_KEY), None)
    return None if raw is None else Record.from_json(raw, where)


def stamp(model_proto, record: Record | None) -> None:
    """Set (or, for None, remove) the record in an ONNX ModelProto's metadata."""
    for p in [p for p in model_proto.metadata_props if p.key == META_KEY]:
        model_proto.metadata_props.remove(p)
    if record is not None:
        model_proto.metadata_props.add(key=META_KEY, value=record.to_json())


def read_record(model: str | os.PathLike) -> Record | None:
    """The record of an ONNX file (read without its external data), or None for a model without one."""
    import onnx

    model = Path(model)
    if model.is_dir() or model.suffix.lower() != ".onnx":
        return None
    try:
        proto = onnx.load(str(model), load_external_data=False)
    except Exception:  # not a readable ONNX file: loading it for real says what is wrong
        return None
    return record_of(proto, str(model))


def resolve(model: str | os.PathLike) -> Path | None:
    """The preprocessor folder of a model: a Hugging Face folder itself, or the folder an ONNX file's record names,
    checked (missing or changed: exit 2); None when the model has none."""
    model = Path(model)
    if model.is_dir():
        return model if hffolder.is_folder(model) else None
    rec = read_record(model)
    if rec is None:
        return None
    folder = model.parent / rec.folder
    if not folder.is_dir() or folder.is_symlink():
        raise UsageError(f"{model} needs its preprocessor folder {folder} ({rec.kind}), which is missing; copy it "
                         "beside the model (it travels with the model)")
    got = folder_sha256(folder)
    if got != rec.sha256:
        raise UsageError(f"{model}: its preprocessor folder {folder} changed since the model was written (sha256 "
                         f"{got[:12]}, the model records {rec.sha256[:12]}); restore it or convert the model again")
    return folder


def write_folder(files: list[Path], dest_model: str | os.PathLike, kind: str = "tokenizer",
                 source: dict | None = None) -> Record:
    """Copy `files` into the preprocessor folder beside `dest_model` and return the record to stamp into it.
    An existing folder with the same files is kept; one optkit wrote (it has the marker) is replaced; anything
    else at that path is exit 2, untouched."""
    dest = folder_beside(dest_model)
    tmp = Path(_mkdtemp(dest))
    try:
        for f in files:
            shutil.copyfile(f, tmp / Path(f).name)
        record = Record(folder=dest.name, sha256=folder_sha256(tmp), kind=kind, source=source)
        (tmp / MARKER).write_text(record.to_json() + "\n", encoding="utf-8")
        _commit(tmp, dest, record)
    finally:
        remove(tmp)
    return record


def carry(src_model: str | os.PathLike, dest_model: str | os.PathLike) -> Record | None:
    """The source model's preprocessor folder copied beside `dest_model`; returns the record to stamp into the
    destination's metadata (None when the source has none)."""
    folder = resolve(src_model)
    if folder is None:
        return None
    if Path(folder).is_dir() and hffolder.is_folder(folder) and Path(folder) == Path(src_model):
        files, kind = hffolder.preprocessor_files(folder)
        return None if kind == "none" else write_folder(files, dest_model, kind, source_of(folder))
    kind, source = "tokenizer", None
    rec = read_record(src_model)
    if rec is not None:
        kind, source = rec.kind, rec.source
    if Path(folder).resolve() == folder_beside(dest_model).resolve():
        return Record(folder=Path(folder).name, sha256=folder_sha256(folder), kind=kind, source=source)
    return write_folder(files_of(folder), dest_model, kind, source)


def inherit(src_model: str | os.PathLike, dest_model: str | os.PathLike) -> bool:
    """A pass's ONNX output inherits its input's preprocessor: the folder beside it and the record in its
    metadata (rewritten in place, atomically; its external data untouched). Returns whether `dest_model` changed
    (its sha256 with it). An output whose record already names its own folder (the pass carried it) is left."""
    dest = Path(dest_model)
    if dest.is_dir() or dest.suffix.lower() != ".onnx" or not dest.is_file():
        return False
    own = read_record(dest)
    if own is not None and (dest.parent / own.folder).is_dir():
        try:
            resolve(dest)
            return False
        except UsageError:  # a folder of that name that is not the recorded one: carried again
            pass
    record = carry(src_model, dest)
    if record is None and own is None:
        return False
    restamp(dest, record)
    return True


def restamp(model: str | os.PathLike, record: Record | None) -> None:
    """Set the record in an ONNX file's metadata, rewriting the file atomically (external data stays where it is)."""
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    stamp(proto, record)
    with atomic_path(model) as tmp:
        onnx.save_model(proto, str(tmp))


def _mkdtemp(dest: Path) -> str:
    if not dest.parent.is_dir():
        raise UsageError(f"folder {dest.parent} does not exist; create it first")
    return str(stage_folder(dest))


def _commit(tmp: Path, dest: Path, record: Record) -> None:
    """The folder into place (core.atomic.commit_folder): a new one, or one optkit wrote (it has the marker),
    replaced with the marker last; the same files are kept as they are."""
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise UsageError(f"{dest} exists and is not a folder optkit wrote; move it away (the model's preprocessor "
                         "files go there)")
    if dest.is_dir():
        if not (dest / MARKER).is_file():
            raise UsageError(f"{dest} exists and was not written by optkit (no {MARKER}); move it away (the model's "
                             "preprocessor files go there)")
        if folder_sha256(dest) == record.sha256:
            return
    commit_folder(tmp, dest, ours=lambda p: (p / MARKER).is_file(), last=MARKER)
