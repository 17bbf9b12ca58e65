"""The per-user cache folder: $OPTKIT_CACHE_DIR, else $XDG_CACHE_HOME/optkit, else ~/.cache/optkit.

Only an absolute location is used: a relative $XDG_CACHE_HOME is ignored (the XDG base-directory specification
calls it invalid), and a home folder that is unset, empty or relative (HOME= gives "/", HOME=x the current
folder) is taken from the password database instead; where none is absolute, NoCacheDir (an OSError) says to set
$OPTKIT_CACHE_DIR, so nothing is written into whatever folder the command runs in, nor at the file system's root.
$OPTKIT_CACHE_DIR is the user's own choice and is used as given (made absolute against the current folder)."""
from __future__ import annotations

import os
from pathlib import Path


class NoCacheDir(OSError):
    """No absolute per-user cache folder can be found."""


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
