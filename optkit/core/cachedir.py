"""The per-user cache folder: $OPTKIT_CACHE_DIR, else $XDG_CACHE_HOME/optkit, else ~/.cache/optkit.

Only an absolute location is used: a relative $XDG_CACHE_HOME is ignored (the XDG base-directory specification
calls it invalid), and a home folder that is unset, empty or relative (HOME= gives "/", HOME=x the current
folder) is taken from the password database instead; where none is absolute, NoCacheDir (an OSError) says to set
$OPTKIT_CACHE_DIR, so nothing is written into whatever folder the command runs in, nor at the file system's root.
$OPTKIT_CACHE_DIR is the user's own choice and is used as given (made absolute against the current folder).

A cache decides what optkit does next (which quantize settings are built, which TensorRT engine runs, which stage
output is reused), so one is trusted only when it is the user's own and private: `trusted` ignores (said at -v) a
cache file that is a link or not owned by this user or writable by group or others, and `private_folder` makes a
cache folder 0700 (its missing parents too) or refuses (NotPrivate) one that is a link to, or is, a folder owned
by another user or writable by group or others. Every cache optkit keeps (the int8 kernel table, onnxruntime's
TensorRT engines and timing cache, the TensorRT timing cache, the run workspace's stage cache) goes through them."""
from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600   # what optkit makes; umask only removes bits from these


class NoCacheDir(OSError):
    """No absolute per-user cache folder can be found."""


class NotPrivate(OSError):
    """A cache folder that is not the user's own and private: nothing is written to it."""


def not_private(st: os.stat_result) -> str | None:
    """Why a file or folder with status `st` is not this user's own and private; None when it is."""
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    if os.name == "posix" and st.st_mode & 0o022:
        who = "group and others" if st.st_mode & 0o022 == 0o022 else "group" if st.st_mode & 0o020 else "others"
        return f"writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def trusted(path: str | os.PathLike, what: str, st: os.stat_result | None = None) -> bool:
    """Whether the cache file or folder `path` (its `st` when already opened: fstat) may be read: it exists, is no
    link, and is the user's own and private. Why not is said at -v, naming `what` (the cache) and the path."""
    try:
        st = st or os.lstat(path)
    except OSError:
        return False
    why = "a symbolic link" if stat.S_ISLNK(st.st_mode) else not_private(st)
    if why:
        log.info("%s %s ignored: %s", what, path, why)
    return why is None


def private_folder(folder: str | os.PathLike) -> Path:
    """`folder`, made 0700 with its missing parents, or checked when it exists (links followed): NotPrivate when it
    is not a folder, is owned by another user or writable by group or others."""
    folder = Path(folder)
    missing = []
    for part in (folder, *folder.parents):
        if os.path.lexists(part):
            break
        missing.append(part)
    for part in reversed(missing):
        try:
            os.mkdir(part, PRIVATE_DIR)
        except FileExistsError:  # another process made it meanwhile: checked below like any existing folder
            pass
    st = os.stat(folder)
    why = "not a folder" if not stat.S_ISDIR(st.st_mode) else not_private(st)
    if why:
        raise NotPrivate(f"cache folder {folder} is {why}: not used (make it your own with mode 0700, or remove it)")
    return folder


def cache_dir() -> Path:
    base = os.environ.get("OPTKIT_CACHE_DIR")
    if base:
        return Path(base).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "optkit"
    home = _home()
    if home is None:
        raise NoCacheDir("no per-user cache folder: $HOME is unset or not an absolute path and $XDG_CACHE_HOME is "
                         "not set to one; set OPTKIT_CACHE_DIR")
    return home / ".cache" / "optkit"


def _home() -> Path | None:
    home = os.environ.get("HOME")
    if home and os.path.isabs(home) and home.strip("/"):
        return Path(home)
    try:
        import pwd
    except ImportError:  # not POSIX: the platform's own idea of home (USERPROFILE on Windows)
        try:
            home = str(Path.home())
        except RuntimeError:
            return None
    else:
        try:
            home = pwd.getpwuid(os.getuid()).pw_dir
        except (KeyError, OSError):
            return None
    return Path(home) if home and os.path.isabs(home) and home.strip("/") else None
