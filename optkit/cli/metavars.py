"""What an option's value is, as --help shows it (`MODEL`, `PATH`, `FILE`, `N`, `FLOAT`, choices as `[a|b|c]`), and
positionals shown as `MODEL`, not typer's `{model} <str>`.

One rule for every option: a Config field's own `cli(metavar=...)` wins; then its choices; then what the name says
it takes (NAMES); then its type (`N`, `FLOAT`, `TEXT`). cli/flags.py asks it for a pass's derived options (which
know their choices), cli/options.py for the shared ones, and `conventional` fills in the command's hand-written
options and arguments when cli/main.py loads a command. Only typer is imported: `--help` stays fast.
"""
from __future__ import annotations

from typing import Any, Optional

import typer

# what a value named so holds (a Config key, a shared option's attribute or a command's parameter name)
NAMES: dict[str, str] = {
    **dict.fromkeys(("model", "reference", "compare", "model_dir"), "MODEL"),
    **dict.fromkeys(("output", "report", "html", "trace", "baseline", "junit", "markdown", "history", "weights",
                     "figures", "tuned", "capacity", "timing_cache", "path"), "FILE"),
    **dict.fromkeys(("data", "calibration_data", "eval_data", "train", "calib", "labels", "tensorboard", "logdir",
                     "workspace"), "PATH"),
    **dict.fromkeys(("input_name", "scores_output", "signature", "study", "nodes_include", "nodes_exclude",
                     "op_types_include", "op_types_exclude", "layers", "exclude", "check_outputs", "name", "tag"),
                    "NAME"),
    **dict.fromkeys(("url", "storage", "storage_uri"), "URL"),
    **dict.fromkeys(("shape", "profile"), "NAME=DIMS"),
    **dict.fromkeys(("value", "dims"), "NAME=N"),
    "dynamic": "NAME:DIM", "columns": "ROLE=COL,...", "space": "DIM=A,B,...", "slo": "EXPR",
    "block_size": "RxC", "version": "VERSION", "to": "TARGET", "registry": "URI", "m_by_n": "M:N", "max_memory_mb": "SIZE", "time_budget": "DURATION", "cut": "WHERE",
    "objective": "[throughput|latency|cost]", "metric": "METRIC", "preprocess": "SPEC", "manifests": "NAMES",
    "color": "[rgb|bgr|gray]", "layout": "[nchw|nhwc]", "provider": "[cpu|cuda|tensorrt]",
    "sessions": "[shared|per-thread]", "precision": "[fp32|fp16|bf16|int8]",
    "fmt": "[console|md|html|junit|json]", "gates": "GATE", "recipe": "RECIPE",
}
_BY_TYPE = {"int": "N", "float": "FLOAT", "str": "TEXT", "list": "TEXT"}


def of(name: str, kind: str, choices: Optional[list[Any]] = None, given: Optional[str] = None) -> Optional[str]:
    """The metavar of one option: `given` (the Config's), its choices, its name, its type; None for a flag."""
    if kind == "bool":
        return None
    if given:
        return given
    if choices:
        return "[" + "|".join(str(c) for c in choices) + "]"
    if kind in ("int", "float"):
        return _BY_TYPE[kind]
    return NAMES.get(name) or _BY_TYPE.get(kind, "TEXT")


def _kind(annotation: Any) -> str:
    import typing

    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    inner = args[0]
    if typing.get_origin(inner) in (list, tuple):
        return "list"
    return getattr(inner, "__name__", "str") if inner in (int, float, bool, str) else "str"


def for_annotation(name: str, annotation: Any) -> Optional[str]:
    """The metavar of a shared option (cli/options.py), from its attribute name and annotation."""
    return of(name, _kind(annotation))


class Positional(typer.core.TyperArgument):
    """An argument shown as click shows one: `MODEL` in the usage line (`[MODEL]` when optional) and in its help
    row, without typer's `{model}` and `<str>`."""

    def _usage_display_name(self) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")

    def display_type_rich(self, ctx) -> Optional[str]:
        return None


def conventional(command) -> None:
    """Give a loaded command (and a group's commands) conventional metavars: each argument becomes a Positional
    named for what it takes, each option without a metavar gets one from its name and type."""
    for sub in getattr(command, "commands", {}).values():
        conventional(sub)
    for param in command.params:
        if isinstance(param, typer.core.TyperArgument):
            if param.metavar is None:
                param.metavar = NAMES.get(param.name, param.name.upper())
            param.__class__ = Positional
        elif isinstance(param, typer.core.TyperOption) and param.metavar is None and not (param.is_flag or param.count):
            param.metavar = of(param.name.removeprefix("cfg_"), _kind(param.type_descriptor.annotation))
