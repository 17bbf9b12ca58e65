"""The per-user cache folder: $OPTKIT_CACHE_DIR, else $XDG_CACHE_HOME/optkit, else ~/.cache/optkit."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("OPTKIT_CACHE_DIR")
    if base:
        return Path(base).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "optkit"
