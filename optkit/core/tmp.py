"""optkit's own temporary folders, so that nothing a library writes to $TMPDIR outlives the command.

Libraries write there on their own: torch's compilers keep caches in $TMPDIR/torchinductor_<user> (and Triton's
next to them), TensorFlow's autograph writes __autograph_generated_file*.py, onnxruntime's profiler its trace.
`point_to(folder)` makes a folder this process's temporary folder (tempfile's, $TMPDIR for the processes it
starts, and those caches unless the user set them); `own_tempdir()` makes one that is removed when the process
exits; an isolated child (core.isolate) is given one by its parent, which removes it on every exit path.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# caches that live in $TMPDIR unless their own variable says where: kept in optkit's folder, removed with it
CACHES = {"TORCHINDUCTOR_CACHE_DIR": "torchinductor", "TRITON_CACHE_DIR": "triton"}

MARK = "OPTKIT_TMPDIR"  # the folder optkit made for this process: what it set there is its own, not the user's
_owned: tuple[int, Path] | None = None  # (the process, its folder): a forked child does not own its parent's


def make(prefix: str = "optkit-tmp-") -> Path:
    """A new private folder in the current temporary folder."""
    return Path(tempfile.mkdtemp(prefix=prefix))


def point_to(folder: Path) -> None:
    """Make `folder` this process's temporary folder (and that of the processes it starts); the caches of
    CACHES go in it unless the user named their own folder for them."""
    global _owned
    folder = Path(folder)
    for var, name in CACHES.items():
        if not os.environ.get(var) or _ours(os.environ[var]):
            os.environ[var] = str(folder / name)
    os.environ["TMPDIR"] = os.environ[MARK] = str(folder)
    tempfile.tempdir = str(folder)
    _owned = (os.getpid(), folder)


def own_tempdir() -> Path:
    """This process's own temporary folder, made on the first call and removed when the process exits
    (Ctrl-C and SIGTERM included: optkit raises them as exceptions, so the interpreter exits normally)."""
    if _owned is not None and _owned[0] == os.getpid():
        return _owned[1]
    folder = make("optkit-")
    point_to(folder)
    pid = os.getpid()
    atexit.register(_remove, folder, pid)
    return folder


def _ours(path: str) -> bool:
    """A cache variable that points into a folder optkit made (set by this process or an optkit parent)."""
    mark = os.environ.get(MARK)
    return bool(mark) and Path(path).is_relative_to(mark)


def _remove(folder: Path, pid: int) -> None:
    if os.getpid() == pid:  # never from a forked child that inherited the handler
        shutil.rmtree(folder, ignore_errors=True)


def remove(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
