"""The built-in passes, and the registry's lookup: built-in passes and plugins (the `optkit.passes` entry
points) are loaded on the first lookup and are then indistinguishable.

A new pass is one module that registers its classes (`@register`) plus its line in BUILTIN_MODULES. The
modules are cheap to import: frameworks are imported inside `run`.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.util
from importlib.metadata import entry_points

from optkit.core.errors import UsageError
from optkit.core.plugins import load_env_plugins
from optkit.core.registry import Pass, register, registered

BUILTIN_MODULES = (
    "optkit.passes.convert",
    "optkit.passes.simplify",
    "optkit.passes.preprocess",
    "optkit.passes.quantize",
    "optkit.passes.prune",
    "optkit.passes.qat",
    "optkit.passes.tflite",
    "optkit.passes.tensorrt",
    "optkit.passes.tune",
    "optkit.passes.profile",
)

_loaded = False


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in BUILTIN_MODULES:
        if importlib.util.find_spec(mod) is not None:
            importlib.import_module(mod)
    for ep in entry_points(group="optkit.passes"):
        obj = ep.load()
        if isinstance(obj, type) and issubclass(obj, Pass):
            register(obj)
    load_env_plugins()  # OPTKIT_PLUGINS: modules the user named (not installed), registering as they import


def all_passes() -> dict[str, type[Pass]]:
    """Every pass, built-in and plugin, by name."""
    _load()
    return registered()


def get_pass(name: str) -> type[Pass]:
    passes = all_passes()
    if name not in passes:
        close = difflib.get_close_matches(name, passes, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "; run `optkit passes` for the list"
        raise UsageError(f"unknown pass {name!r}{hint}")
    return passes[name]
