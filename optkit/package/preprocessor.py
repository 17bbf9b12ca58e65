"""A package version carries its model's preprocessor (tokenizer / image processor) where the server's users look
for it: the folder core.preprocessor.resolve finds for the model (missing or changed: exit 2) is copied into the
version as `tokenizer/` (an image processor: `image_processor/`) beside `model.onnx`, and the version's model.onnx
names that folder in its metadata, so `optkit eval REPO/NAME/N/model.onnx` and
`AutoTokenizer.from_pretrained("REPO/NAME/N/tokenizer")` both find it. After writing, the copy is checked against
the sha256 the model records; the lineage names it, its sha256 and the Hugging Face folder the model came from
(each of its files' sha256)."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from optkit.core import preprocessor
from optkit.core.errors import PassError
from optkit.core.preprocessor import Record

FOLDERS = {"tokenizer": "tokenizer", "image-processor": "image_processor"}
MODEL_FILE = "model.onnx"   # the file Triton's onnxruntime backend and MLflow's onnx flavor load


@dataclass(frozen=True)
class Carried:
    folder: Path      # the model's own preprocessor folder, checked
    record: Record    # what the model records of it
    name: str         # its folder inside the version


def find(model: str) -> Carried | None:
    """The model's preprocessor folder, checked (exit 2 when missing or changed); None when it has none."""
    folder = preprocessor.resolve(model)
    record = preprocessor.read_record(model) if folder is not None else None
    if record is None:   # a Hugging Face folder is no package target's input (refused before this)
        return None
    return Carried(folder=Path(folder), record=record, name=FOLDERS.get(record.kind, "preprocessor"))


def write(carried: Carried, vdir: Path) -> None:
    """Copy the folder into the version and point the version's model.onnx (where there is one) at it."""
    dest = vdir / carried.name
    dest.mkdir()
    for f in preprocessor.files_of(carried.folder):
        shutil.copyfile(f, dest / f.name)
    model = vdir / MODEL_FILE
    if model.is_file() and preprocessor.read_record(model) is not None:
        preprocessor.restamp(model, carried.record.moved(carried.name))


def check(carried: Carried, vdir: Path) -> None:
    """Read back: the copy is the folder the model records, and the version's model.onnx finds it."""
    dest = vdir / carried.name
    got = preprocessor.folder_sha256(dest) if dest.is_dir() else "missing"
    if got != carried.record.sha256:
        raise PassError(f"{dest} does not read back as the model's preprocessor folder (sha256 {got[:12]}, the "
                        f"model records {carried.record.sha256[:12]}) (nothing was written)")
    model = vdir / MODEL_FILE
    if model.is_file() and preprocessor.read_record(model) is not None:
        found = preprocessor.resolve(model)
        if found is None or Path(found).resolve() != dest.resolve():
            raise PassError(f"{model} does not name its preprocessor folder {dest} (nothing was written)")


def lineage_entry(carried: Carried | None) -> dict | None:
    """The lineage's `preprocessor`: the folder in the version, its sha256 and kind, and the source folder."""
    if carried is None:
        return None
    rec = carried.record
    return {"path": carried.name, "sha256": rec.sha256, "kind": rec.kind, "source": rec.source}
