"""Nothing half-written, nothing destroyed: outputs are regular files built next to their destination and
renamed into place; an output that is a folder, a device, a link or an input of the same command is refused.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from optkit.core import interrupts
from optkit.core.errors import UsageError
from optkit.core.formats import split_factory

_UMASK = os.umask(0)
os.umask(_UMASK)
_NAME_MAX = 255


def check_output_path(dest: str | os.PathLike, *, inputs: Iterable = (), what: str = "output") -> Path:
    """Fail early (exit 2, nothing touched) unless `dest` is a new or existing regular file we may replace.

    Refused: an existing folder, device, FIFO, socket or symbolic link; a missing or non-writable parent
    folder; a name too long for the file system; and any of `inputs` (the same file through links too).
    """
    dest = Path(dest)
    if str(dest) in ("", ".", "..") or dest.name in ("", ".", ".."):
        raise UsageError(f"{what} {str(dest)!r} is a folder, not a file name; name the file to write")
    if len(os.fsencode(dest.name)) > _NAME_MAX:
        raise UsageError(f"{what} file name is {len(os.fsencode(dest.name))} bytes long; the limit is {_NAME_MAX}")
    parent = dest.parent
    if not parent.exists():
        raise UsageError(f"{what} folder {parent} does not exist; create it first")
    if not parent.is_dir():
        raise UsageError(f"{what} {dest}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{what} folder {parent} is not writable")
    if dest.is_symlink():
        raise UsageError(f"{what} {dest} is a symbolic link; name the real file instead")
    if dest.exists():
        mode = dest.stat().st_mode
        if stat.S_ISDIR(mode):
            raise UsageError(f"{what} {dest} is an existing folder; optkit writes files only, name a file in it")
        if not stat.S_ISREG(mode):
            raise UsageError(f"{what} {dest} exists and is not a regular file (a device, FIFO or socket)")
    for src in inputs:
        if src is not None and _same_file(dest, src):
            raise UsageError(f"{what} {dest} is also an input of this command ({src}); choose another path")
    return dest


def check_outputs(outputs: dict[str, str | os.PathLike | None], inputs: Iterable = ()) -> None:
    """check_output_path for each named output (e.g. {"-o": out, "--report": rep}), and no two the same."""
    inputs = [p for p in inputs if p is not None]
    seen: dict[Path, str] = {}
    for flag, dest in outputs.items():
        if dest is None:
            continue
        check_output_path(dest, inputs=inputs, what=flag)
        key = Path(os.path.abspath(dest))
        if key in seen:
            raise UsageError(f"{flag} and {seen[key]} name the same file {dest}; give each its own path")
        seen[key] = flag


def check_side_output(dest: str | os.PathLike, *, ours: Callable[[Path], bool], inputs: Iterable = (),
                      what: str = "output") -> Path:
    """check_output_path for a file optkit writes without being asked for it by name (a model kept aside, a
    study database): it may replace an existing file only when `ours(dest)` recognises optkit's own."""
    dest = check_output_path(dest, inputs=inputs, what=what)
    if dest.exists() and not ours(dest):
        raise UsageError(f"{what} would be written to {dest}, which exists and was not written by optkit; "
                         "move it away or choose another output name")
    return dest


def _same_file(dest: Path, src) -> bool:
    src = str(src)
    factory = split_factory(src)
    if factory and not Path(src).exists():
        src = factory[0]
    try:
        if dest.exists() and Path(src).exists() and os.path.samefile(dest, src):
            return True
    except OSError:
        pass
    return os.path.realpath(dest) == os.path.realpath(src)


def tmp_prefix(dest: Path) -> str:
    """The name prefix of a temporary beside `dest`, cut so that it stays a legal name when dest's is."""
    return f".{dest.name[:200]}.tmp-"


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to `dest`; rename it onto `dest` only if the block succeeds.

    A file replaces an existing regular file; a folder (directory=True) is only ever created, never replaces.
    The temporary is removed on every exit path, interrupts included.
    """
    dest = Path(dest)
    check_output_path(dest)
    if directory and dest.exists():
        raise UsageError(f"{dest} already exists; optkit does not replace folders")
    prefix = tmp_prefix(dest)
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=dest.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=prefix, dir=dest.parent, suffix=dest.suffix[:20])
        os.close(fd)
        tmp = Path(name)
        normal_mode(tmp)
    try:
        yield tmp
        interrupts.check()  # a library may have swallowed Ctrl-C: never commit a result after one
        if directory:
            os.rename(tmp, dest)  # fails rather than replace a folder that appeared meanwhile
        else:
            check_output_path(dest)  # it may have become a folder or link while we worked
            os.replace(tmp, dest)
    finally:
        remove(tmp)


def normal_mode(path: Path) -> None:
    """The permissions the user's umask gives a new file or folder: mkstemp makes 0600 files and mkdtemp 0700
    folders, which a result (or a package a server reads as another user) must not keep."""
    os.chmod(path, (0o777 if Path(path).is_dir() else 0o666) & ~_UMASK)


def remove(path: Path) -> None:
    """Remove a temporary file or folder of our own; missing is fine."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def write_text(dest: str | os.PathLike, text: str) -> Path:
    with atomic_path(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(dest)
