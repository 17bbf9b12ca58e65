"""Files optkit reads back (its own index, lineage, reports, run state): a regular file's bytes, bounded, read
without blocking on a FIFO or device and, unless allowed, without following a link. They are user input."""
from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from optkit.core.errors import UsageError


def read_regular(path: Path, limit: int, *, links: bool = True, hint: str = "") -> bytes:
    """The bytes of the regular file at `path`, at most `limit`; FileNotFoundError when it is missing, else exit 2
    (UsageError) for a link (unless `links`), a FIFO, device or folder (never read: the open does not block), a
    file over `limit` or one that cannot be read. `hint` ends the not-a-regular-file line (what to do)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if links else os.O_NOFOLLOW))
    except FileNotFoundError:
        raise
    except OSError as e:
        if not links and path.is_symlink():
            raise UsageError(f"{path} is a symbolic link; optkit reads only the files it wrote, not what a link "
                             "points at: remove the link") from None
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    try:  # checked before fdopen, which refuses a folder with "3: Is a directory"
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = "a folder, not a file" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise UsageError(f"{path} is {what}" + (f"; {hint}" if hint else ""))
        if st.st_size > limit:
            raise _too_large(path, limit)
        f = os.fdopen(fd, "rb")
    except BaseException:
        with contextlib.suppress(OSError):  # an interrupt inside fdopen: the file object may have closed it
            os.close(fd)
        raise
    with f:
        try:
            raw = f.read(limit + 1)
        except OSError as e:
            raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    if len(raw) > limit:
        raise _too_large(path, limit)
    return raw


def _too_large(path: Path, limit: int) -> UsageError:
    size = f"{limit >> 20:,} MB" if limit >= 1 << 20 else f"{limit >> 10:,} KiB"
    return UsageError(f"{path} is over {size}, larger than any file optkit writes there")
