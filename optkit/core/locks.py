"""Folder locks for outputs several runs may write at once: an exclusive flock on the folder itself (no lock file:
nothing is written for it). A flock dies with its process, so a killed holder blocks nobody.

    with locked_output(out_dir, on_wait=lambda: print("waiting ...")):
        ...  # out_dir checked again and written here

`locked_output` holds the folder's lock, or its parent's while the folder is new (whoever creates it holds the
level above), and moves down to the folder's own lock once another run has created it.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from optkit.core.errors import UsageError


def lock_folder(folder: Path, on_wait: Callable[[], None] | None = None) -> int:
    """An fd holding an exclusive flock on `folder`; waits for another holder (`on_wait` is called once first)."""
    import fcntl

    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise UsageError(f"cannot lock {folder}: {e.strerror or e}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def locked_output(folder: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the lock guarding the output folder `folder`: its own, or its parent's while it does not exist."""
    folder = Path(folder)
    waited = [False]

    def wait() -> None:
        if not waited[0] and on_wait is not None:
            on_wait()
        waited[0] = True

    fd = None
    if not os.path.lexists(folder):
        fd = lock_folder(folder.parent, wait)
        if os.path.lexists(folder):      # created while we waited: its own lock guards it now
            os.close(fd)
            fd = None
    try:
        if fd is None:
            fd = lock_folder(folder, wait)
        yield
    finally:
        if fd is not None:
            os.close(fd)
