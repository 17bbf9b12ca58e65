"""A Config field as the command line spells it: one plain dict (key, flag, type, default, bounds, help, ...).

`python -m optkit.cli.derive` writes these into cli/flagspec.py for the passes, `optkit package` and `optkit
capacity`; a package target's options (its own Config, registered at runtime by a plugin too) are derived by the
same function when `optkit package` is loaded, so a built-in flag and a plugin's are made alike (cli/flags.py).
"""
from __future__ import annotations

import types
import typing
from typing import Any, Literal, Union

from pydantic_core import PydanticUndefined

from optkit.core.registry import cli_meta


def _unwrap(annotation) -> tuple[Any, bool]:
    """(the annotation without Optional, whether None is allowed)."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def field_spec(key: str, field) -> dict[str, Any]:
    meta = cli_meta(field) or {}
    ann, optional = _unwrap(field.annotation)
    origin = typing.get_origin(ann)
    spec: dict[str, Any] = {"key": key, "flag": meta.get("flag")}
    choices = None
    if origin is Literal:
        kind, choices = "str", list(typing.get_args(ann))
    elif origin in (list, tuple) or ann in (list, tuple):
        kind = "list"
    elif ann in (bool, int, float, str):
        kind = ann.__name__
    else:
        kind = "str"
    spec["type"] = meta.get("kind") or kind
    if choices:
        spec["choices"] = choices
    if field.default_factory is not None:
        default = field.default_factory()
    else:
        default = None if field.default is PydanticUndefined else field.default
    spec["default"] = list(default) if isinstance(default, tuple) else default
    spec["required"] = field.is_required()
    spec["optional"] = optional
    for m in field.metadata:
        for attr, name in (("ge", "min"), ("gt", "min_open"), ("le", "max"), ("lt", "max_open")):
            if getattr(m, attr, None) is not None:
                spec[name] = getattr(m, attr)
    spec["help"] = meta.get("help") or field.description or ""
    for k in ("group", "secondary", "sets", "negative_is_none", "metavar", "recipe_only", "short"):
        if k in meta:
            spec[k] = meta[k]
    return spec
