"""A pass command's flags, derived from the pass's Config (through the generated cli/flagspec.py).

    @app.command("simplify")
    @flags.pass_options("simplify.onnx")
    def simplify_cmd(model: str = ..., *, config: dict, ...):

adds one option per Config field that has a flag (core.registry.cli) and hands the command body `config`: only
the options the user gave, keyed by the Config's names, so every default stays the Config's (and a printed
recipe holds only what was asked for). Only typer and the generated data are imported: `--help` stays fast.
"""
from __future__ import annotations

import inspect
from typing import Any, Optional

import typer

from optkit.cli import flagspec

# Help order of the groups: the pass's own options first.
GROUP_ORDER = ("", "data", "evaluation", "budgets", "measurement")
_TYPES = {"str": str, "int": int, "float": float, "bool": bool}


def fields(pass_name: str) -> list[dict[str, Any]]:
    """The pass's Config fields as flagspec holds them (an unknown pass is a KeyError: regenerate flagspec)."""
    return flagspec.PASSES[pass_name]


def field(pass_name: str, key: str) -> dict[str, Any]:
    for spec in fields(pass_name):
        if spec["key"] == key:
            return spec
    raise KeyError(f"{pass_name} has no option {key!r}")


def default(pass_name: str, key: str) -> Any:
    """The Config's default of one field."""
    return field(pass_name, key)["default"]


def keys(pass_name: str) -> set[str]:
    """The Config keys of one pass."""
    return {spec["key"] for spec in fields(pass_name)}


def _help(spec: dict[str, Any]) -> str:
    text = spec["help"].rstrip()
    dflt = spec["default"]
    if "default" in text or "sets" in spec or dflt in (None, [], False, ""):
        return text
    if spec["type"] == "bool":
        shown = spec["flag"] if dflt else spec.get("secondary")
        return f"{text} (default: {shown})" if shown else text
    return f"{text} (default: {dflt})"


def _option(spec: dict[str, Any], required: bool = False) -> tuple[Any, Any]:
    """(annotation, typer.Option) for one field; every option defaults to None (not given), or is required."""
    kind = spec["type"]
    names = [spec["flag"] + (f"/{spec['secondary']}" if spec.get("secondary") else "")]
    if spec.get("short"):
        names.insert(0, spec["short"])
    if required and spec.get("required"):
        return _TYPES.get(kind, str), typer.Option(..., *names, help=spec["help"].rstrip())
    kwargs: dict[str, Any] = {"help": _help(spec)}
    if spec.get("metavar"):
        kwargs["metavar"] = spec["metavar"]
    if kind == "list":
        return Optional[list[str]], typer.Option(None, *names, **kwargs)
    if "sets" in spec or kind == "bool":
        return Optional[bool], typer.Option(None, *names, **kwargs)
    if kind in ("int", "float") and not spec.get("negative_is_none"):
        if "min" in spec:
            kwargs["min"] = spec["min"]
        elif "min_open" in spec:  # click has no open bound here; the Config refuses the bound itself
            kwargs["min"] = spec["min_open"]
        if "max" in spec:
            kwargs["max"] = spec["max"]
    return Optional[_TYPES[kind]], typer.Option(None, *names, **kwargs)


def param_name(spec: dict[str, Any]) -> str:
    return "cfg_" + spec["key"]


def pass_options(*pass_names: str, exclude: tuple[str, ...] = ()):
    """Decorate a command (under @app.command) with the pass's derived flags; its body gets `config`.

    A command that runs one of several passes (prune: prune.keras or prune.torch) takes the union of their flags;
    `keys(pass_name)` says which of the given ones the chosen pass takes."""
    specs, seen = [], set()
    for pass_name in pass_names:
        for s in fields(pass_name):
            if s.get("flag") and s["key"] not in exclude and s["key"] not in seen:
                specs.append(s)
                seen.add(s["key"])
    specs.sort(key=lambda s: GROUP_ORDER.index(s.get("group", "")))
    return _decorator(specs)


def package_options():
    """Decorate `optkit package`'s build command with PackageConfig's derived flags (flagspec.PACKAGE); its body
    gets `config`: the options the user gave, under PackageConfig's keys (--to and -o are required)."""
    return _decorator([s for s in flagspec.PACKAGE if s.get("flag")], required=True)


def _decorator(specs: list[dict[str, Any]], required: bool = False):
    def decorate(fn):
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "config"]
        extra = []
        for spec in specs:
            annotation, opt = _option(spec, required)
            extra.append(inspect.Parameter(param_name(spec), inspect.Parameter.KEYWORD_ONLY, default=opt,
                                           annotation=annotation))
        # typer wants one ordering: positional-or-keyword first, keyword-only after
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + extra

        def command(**kwargs):
            return fn(config=collect(specs, kwargs), **kwargs)

        command.__name__, command.__qualname__, command.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        command.__module__ = fn.__module__
        command.__signature__ = sig.replace(parameters=params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


def collect(specs: list[dict[str, Any]], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop the derived options out of kwargs; return those the user gave, under the Config's keys."""
    config: dict[str, Any] = {}
    for spec in specs:
        value = kwargs.pop(param_name(spec), None)
        if value is None or (isinstance(value, (list, tuple)) and not value):
            continue
        if "sets" in spec:
            if value:
                config[spec["key"]] = spec["sets"]
            continue
        if spec.get("negative_is_none") and value < 0:
            value = None
        config[spec["key"]] = list(value) if isinstance(value, tuple) else value
    return config


def package_option(key: str, help: str | None = None):
    """One of PackageConfig's flags on another package command (serve-version's --version, --tag, --registry),
    not given by default; `help` where the command means something else by it."""
    spec = next(s for s in flagspec.PACKAGE if s["key"] == key)
    return typer.Option(None, spec["flag"], help=help or spec["help"])
