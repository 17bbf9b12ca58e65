"""A command's options that are declared elsewhere: a pass's flags, derived from its Config (through the generated
cli/flagspec.py), and the shared option groups of cli/options.py.

    @app.command("simplify")
    @flags.pass_options("simplify.onnx")
    @flags.groups("data", "measure", "output", "print_recipe")
    def simplify_cmd(model: str = ..., *, config: dict, shared: options.Shared):

`pass_options` adds one option per Config field that has a flag (core.registry.cli) and hands the command body
`config`: only the options the user gave, keyed by the Config's names, so every default stays the Config's (and a
printed recipe holds only what was asked for). `groups` adds the shared options of those groups (options.GROUPS,
or single options by name: options.OPTIONS) and hands the body `shared`, an options.Shared. The two stack in
either order; the added options follow the command's own, in help sections (GROUP_ORDER), the shared ones first
in each. Only typer and plain data are imported: `--help` stays fast.
"""
from __future__ import annotations

import inspect
from typing import Any, Optional

from optkit.cli import flagspec, metavars, options

# Help order of the sections: the command's and the pass's own options first, what is written and printed last.
GROUP_ORDER = ("", "data", "evaluation", "budgets", "measurement", "output")
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


def _option(spec: dict[str, Any]) -> tuple[Any, Any]:
    """(annotation, typer option) for one field; every option defaults to None (not given), or is required."""
    kind = spec["type"]
    names = (*((spec["short"],) if spec.get("short") else ()),
             spec["flag"] + (f"/{spec['secondary']}" if spec.get("secondary") else ""))
    if spec.get("required"):
        return _TYPES.get(kind, str), options.option(..., names, help=spec["help"].rstrip(),
                                                     metavar=metavars.of(spec["key"], kind, spec.get("choices"),
                                                                         spec.get("metavar")))
    bounds: dict[str, Any] = {}
    if kind == "int" and not spec.get("negative_is_none") and "sets" not in spec:
        # click has no open bound here, and it calls nan "more than" a float's bound: the Config refuses floats
        bounds = {"min": spec.get("min", spec.get("min_open")), "max": spec.get("max", spec.get("max_open"))}
    if kind == "list":
        annotation: Any = Optional[list[str]]
    elif "sets" in spec or kind == "bool":
        annotation = Optional[bool]
    else:
        annotation = Optional[_TYPES[kind]]
    shown = metavars.of(spec["key"], "bool" if "sets" in spec else kind, spec.get("choices"), spec.get("metavar"))
    return annotation, options.option(None, names, help=_help(spec), metavar=shown, **bounds)


def param_name(spec: dict[str, Any]) -> str:
    return "cfg_" + spec["key"]


def pass_options(*pass_names: str, exclude: tuple[str, ...] = (), only: Optional[tuple[str, ...]] = None):
    """Decorate a command (under @app.command) with the pass's derived flags; its body gets `config`.

    A command that runs one of several passes (prune: prune.keras or prune.torch) takes the union of their flags;
    `keys(pass_name)` says which of the given ones the chosen pass takes. `only` takes just those Config keys
    (trt check: the build's --shape)."""
    specs, seen = [], set()
    for pass_name in pass_names:
        for s in fields(pass_name):
            if s.get("flag") and s["key"] not in exclude and s["key"] not in seen and (only is None or s["key"] in only):
                specs.append(s)
                seen.add(s["key"])
    return _extend("specs", specs)


def package_options(targets: list[dict[str, Any]] = (), helps: dict[str, str] | None = None):
    """Decorate `optkit package`'s build command with PackageConfig's derived flags (flagspec.PACKAGE) and the
    targets' own (`targets`: derived from each target's Config when the command is loaded, by the same
    core.fieldspec, since plugins register at runtime); `helps` replaces a shared flag's help (--to's choices).
    Its body gets `config`: the options the user gave, under their Config keys (--to and -o are required)."""
    shared = [{**s, "help": (helps or {}).get(s["key"], s["help"])} for s in flagspec.PACKAGE]
    return derived_options([*shared, *targets])


def derived_options(specs: list[dict[str, Any]]):
    """Decorate a command with options derived from Config fields (core.fieldspec.field_spec dicts) at runtime;
    its body gets `config`, as with pass_options."""
    return _extend("specs", [s for s in specs if s.get("flag")])


def package_option(key: str, help: str | None = None):
    """One of PackageConfig's flags on another package command (serve-version's --version, --tag, --registry),
    not given by default; `help` where the command means something else by it."""
    spec = next(s for s in flagspec.PACKAGE if s["key"] == key)
    return options.option(None, (spec["flag"],), help=help or spec["help"])


def groups(*names: str):
    """Decorate a command (under @app.command) with shared option groups (cli/options.py); its body gets `shared`."""
    return _extend("shared", options.expand(names))


def _extend(kind: str, added: list):
    """Add options to a command: "specs" (derived, the body's `config`) or "shared" (the body's `shared`). A command
    already extended is rebuilt from its own function with everything added so far, so the help order holds."""
    def decorate(fn):
        base = getattr(fn, "__optkit_command__", fn)
        plan = {**getattr(fn, "__optkit_plan__", {"specs": [], "shared": []})}
        plan[kind] = plan[kind] + [a for a in added if a not in plan[kind]]  # an option named twice: once
        return _build(base, plan)

    return decorate


def _build(fn, plan: dict[str, list]):
    specs, shared = plan["specs"], plan["shared"]
    sig = inspect.signature(fn, eval_str=True)
    own = [p for p in sig.parameters.values() if p.name not in ("config", "shared")]
    for name, needed in (("config", specs), ("shared", shared)):
        if needed and name not in sig.parameters:
            raise TypeError(f"{fn.__qualname__} takes no keyword-only `{name}` for the options it is given")
    names = {p.name for p in own}
    clash = names & {o.param for o in shared}
    if clash:
        raise TypeError(f"{fn.__qualname__}: its own parameters {sorted(clash)} clash with shared options")
    added = []  # (section, shared first, order, parameter)
    for i, o in enumerate(shared):
        opt = options.option(o.default, o.flags, help=o.help, min=o.min)
        added.append((GROUP_ORDER.index(o.group), 0, i, inspect.Parameter(
            o.param, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=o.annotation)))
    for i, spec in enumerate(specs):
        annotation, opt = _option(spec)
        added.append((GROUP_ORDER.index(spec.get("group", "")), 1, i, inspect.Parameter(
            param_name(spec), inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=annotation)))
    # typer wants one ordering: positional-or-keyword first, keyword-only after
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + [a[-1] for a in sorted(added, key=lambda a: a[:3])]

    def command(**kwargs):
        if specs:
            kwargs["config"] = collect(specs, kwargs)
        if shared:
            kwargs["shared"] = options.Shared(**{o.param: kwargs.pop(o.param) for o in shared})
        return fn(**kwargs)

    command.__name__, command.__qualname__, command.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    command.__module__ = fn.__module__
    command.__signature__ = sig.replace(parameters=params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__optkit_command__, command.__optkit_plan__ = fn, plan
    return command


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
