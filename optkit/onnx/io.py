"""Reading and writing ONNX files: one loader with a clear error, and the staging folder exports are built in."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from optkit.core.artifact import external_data_files
from optkit.core.atomic import check_output_path, tmp_prefix
from optkit.core.errors import UsageError
from optkit.core.text import first_line

TWO_GB = 2 * 1024 ** 3


def load(path: str | Path, *, external_data: bool = True):
    """The model at `path`; a UsageError naming the file when it is not ONNX, is truncated, or its external
    data is missing or escapes its folder."""
    import onnx

    if external_data:  # a missing or escaping .data file is named, not reported as a corrupt model
        external_data_files(path)
    try:
        model = onnx.load(str(path), load_external_data=external_data)
    except Exception as e:  # noqa: BLE001 - protobuf, onnx and the OS raise several types
        raise UsageError(f"cannot read {path} as ONNX: {first_line(e)}; the file is corrupt or truncated") from None
    if not model.graph.node and not model.graph.output:
        raise UsageError(f"cannot read {path} as ONNX: the file holds no graph (corrupt or not ONNX)")
    return model


def save(model, path: str | Path) -> None:
    import onnx

    onnx.save(model, str(path))


class Staging:
    """A private folder next to the destination where an export is built and validated.

    `commit()` moves the model (and its external data, if any) into place; the model file comes last, so an
    interrupted run never leaves a file that looks like a result. Leaving the block without commit removes all.
    """

    def __init__(self, dest: Path):
        self.dest = check_output_path(dest)
        self.dir = Path(tempfile.mkdtemp(prefix=tmp_prefix(self.dest), dir=self.dest.parent))
        self.model = self.dir / self.dest.name

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def finalize(self, external: str, ctx) -> None:
        """Save the staged model as one file, or with external data when asked or when it is over 2 GB."""
        import onnx

        model = onnx.load(str(self.model), load_external_data=True)
        for f in self.dir.iterdir():
            if f != self.model:
                f.unlink() if f.is_file() else shutil.rmtree(f)
        big = model.ByteSize() >= TWO_GB if external == "auto" else external == "always"
        if external == "auto" and not big:
            try:
                data = model.SerializeToString()
            except ValueError:  # protobuf refuses messages over 2 GB
                big = True
            else:
                self.model.write_bytes(data)
                return
        if big:
            location = f"{self.dest.name}.data"
            onnx.save_model(model, str(self.model), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=location, size_threshold=1024)
            ctx.note(f"weights written as external data to {location} (the model is over 2 GB)"
                     if external == "auto" else f"weights written as external data to {location}")
        else:
            onnx.save_model(model, str(self.model))

    def commit(self) -> Path:
        for f in sorted(self.dir.iterdir(), key=lambda p: p == self.model):
            os.replace(f, self.dest.parent / f.name)
        return self.dest


def copy_model(src: str | Path, dest: str | Path, edit=None) -> Path:
    """The model at `src`, external data included, written unchanged to `dest` (atomically): the output of a
    pass that measures a model without changing it (tune, profile). `edit(proto)` may change its metadata first."""
    import onnx

    with Staging(Path(dest)) as staged:
        model = load(src)
        if edit is not None:
            edit(model)
        if model.ByteSize() >= TWO_GB:
            onnx.save_model(model, str(staged.model), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=f"{staged.dest.name}.data", size_threshold=1024)
        else:
            save(model, staged.model)
        return staged.commit()
