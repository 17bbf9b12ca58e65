"""A Hugging Face Hub id (`org/name`) names a model in the local Hugging Face cache; optkit downloads nothing.

`offline()` is called before transformers or huggingface_hub is imported: the Hub's offline mode on (and its
telemetry off, core.telemetry), whatever the environment said, so no library call reaches the network.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from optkit.core.errors import DependencyError, UsageError

# org/name as the Hub spells them; a path with a model file's suffix is a missing file, not an id
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
_FILE_SUFFIXES = (".onnx", ".pt", ".pt2", ".pth", ".keras", ".h5", ".tflite", ".engine", ".plan", ".trt", ".py",
                  ".npz", ".npy", ".yaml", ".yml", ".json")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
           "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1"}


def offline() -> None:
    """The Hub's offline mode, set before transformers / huggingface_hub is imported (they read it at import);
    where one was imported already (the Python API), its constant is set too."""
    os.environ.update(OFFLINE)
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
        constants.HF_HUB_DISABLE_TELEMETRY = True


def is_hub_id(spec: str | os.PathLike) -> bool:
    s = str(spec)
    return (not Path(s).exists() and bool(_ID.match(s)) and not s.lower().endswith(_FILE_SUFFIXES)
            and ".." not in s)


def cache_dir() -> Path:
    """HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub (the Hub library's own rule)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expanduser(os.environ["HF_HUB_CACHE"]))
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(os.path.expanduser(home)) / "hub"


def local_model(spec: str) -> str:
    """`spec` unchanged, unless it is a Hub id that is no path here: then the folder of its snapshot in the
    local cache (the `main` revision); exit 2 naming the command that downloads it when there is none."""
    if not is_hub_id(spec):
        return spec
    offline()
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise DependencyError(f"{spec} names a Hugging Face Hub model; reading one needs the hf extra: "
                              "pip install 'optkit[hf]'") from None
    try:
        folder = snapshot_download(spec, local_files_only=True, cache_dir=str(cache_dir()))
    except Exception:  # noqa: BLE001 - LocalEntryNotFoundError and kin: not in the cache
        folder = None
    if folder is None or not Path(folder).is_dir() or not (Path(folder) / "config.json").exists() and not (
            Path(folder) / "modules.json").exists():
        raise UsageError(f"model {spec} not found: no such file or folder, and the Hugging Face cache "
                         f"({cache_dir()}) has no snapshot of it; download it with `hf download {spec}` (optkit "
                         "downloads nothing)")
    return str(folder)
