"""OPTKIT_PLUGINS: modules the user names to be imported before optkit looks up passes or package targets.

    OPTKIT_PLUGINS=mycompany.optkit_targets,my_targets optkit package m.onnx --to mine -o repo

Each name is an importable module (on sys.path / PYTHONPATH); importing it registers what it holds
(`@register` for a pass, `register_target(...)` for a package target). It is code the user named, as an
installed entry point is: a module that fails to import is exit 2 with its one line. Installed packages use the
entry-point groups instead (`optkit.passes`, `optkit.package_targets`); this is the way for a module that is not
installed (a test, a script beside a recipe).
"""
from __future__ import annotations

import importlib
import os

from optkit.core.errors import UsageError

ENV = "OPTKIT_PLUGINS"
_loaded: set[str] = set()
_failed: dict[str, UsageError] = {}  # a module that did not import fails every time it is asked for


def load_env_plugins() -> None:
    """Import every module OPTKIT_PLUGINS names (once per process; one that failed fails again)."""
    for name in (n.strip() for n in os.environ.get(ENV, "").split(",")):
        if name in _failed:
            raise _failed[name]
        if not name or name in _loaded:
            continue
        _loaded.add(name)
        try:
            importlib.import_module(name)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - a plugin's own failure (sys.exit() too), shown as one line
            limit = None if isinstance(e, UsageError) else 200  # optkit's own refusal (a clash naming both): whole
            first = (str(e).splitlines() or [""])[0][:limit]
            _failed[name] = UsageError(f"{ENV}: cannot import {name!r} ({type(e).__name__}: {first}); fix it or "
                                       f"take it out of {ENV}")
            raise _failed[name] from None
