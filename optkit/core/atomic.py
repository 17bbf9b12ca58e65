"""Nothing half-written: outputs are built next to their destination and renamed into place."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from optkit.core.errors import UsageError

_UMASK = os.umask(0)
os.umask(_UMASK)


def check_output_path(dest: str | os.PathLike, *, inputs: tuple = ()) -> Path:
    """Fail early (exit 2) when `dest` cannot be written or would overwrite an input."""
    dest = Path(dest)
    if not dest.parent.exists():
        raise UsageError(f"output folder {dest.parent} does not exist; create it first")
    for src in inputs:
        if src is not None and Path(src).exists() and dest.exists() and dest.resolve() == Path(src).resolve():
            raise UsageError(f"output {dest} is the input model; choose another output path")
    return dest


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to `dest`; rename it onto `dest` only if the block succeeds."""
    dest = Path(dest)
    check_output_path(dest)
    prefix = f".{dest.name}.tmp-"
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=dest.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=prefix, dir=dest.parent, suffix=dest.suffix)
        os.close(fd)
        tmp = Path(name)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; give results normal permissions
    try:
        yield tmp
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        remove(tmp)
        raise


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def write_text(dest: str | os.PathLike, text: str) -> Path:
    with atomic_path(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(dest)
