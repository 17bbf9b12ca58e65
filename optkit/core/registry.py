"""The pass contract (Pass, its Config and context), the registry passes add themselves to, and config checks.

Which passes exist is not known here: optkit.passes lists the built-in ones and loads plugins.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict
from pydantic import ValidationError as PydanticValidationError

from optkit.core.artifact import Artifact
from optkit.core.errors import DependencyError, UsageError
from optkit.core.formats import Format

# What each extra needs importable, and how to install it.
EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "torch": (("torch", "onnxscript"), "pip install 'optkit[torch]'"),
    "tf": (("tensorflow", "tf_keras", "tf2onnx"), "pip install 'optkit[tf]'"),
    "tfmot": (("tensorflow", "tf_keras", "tensorflow_model_optimization"), "pip install 'optkit[tf]'"),
    "simplify": (("onnxslim",), "pip install 'optkit[simplify]'"),
    "quantize": (("onnxconverter_common",), "pip install 'optkit[quantize]'"),
    "tune": (("optuna",), "pip install 'optkit[tune]'"),
    "trt": (("tensorrt",), "pip install 'optkit[trt]' (needs an NVIDIA GPU and driver)"),
}


class PassConfig(BaseModel):
    """Base for pass configs: unknown keys are an error, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class PassContext:
    """What a pass may use besides its input and config."""

    output: Path                       # where the result must end up (written atomically by the pass)
    aside: Path | None = None          # where a result refused by a budget is kept (default: OUT.REJECTED.*)
    shapes: dict[str, list[int]] = field(default_factory=dict)  # --shape overrides for dynamic dims
    values: dict[str, float] = field(default_factory=dict)      # --value: what scalar inputs are fed
    data: dict[str, Any] = field(default_factory=dict)          # "calibration", "eval", "train" datasets
    seed: int = 0
    notes: list[str] = field(default_factory=list)     # said in the report (fallbacks, upgrades)
    warnings: list[str] = field(default_factory=list)  # said loudly in the report
    measurements: dict[str, Any] = field(default_factory=dict)  # a pass may add figures (e.g. fidelity)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def warn(self, text: str) -> None:
        self.warnings.append(text)


class Pass:
    """One transformation: artifact -> new artifact. Subclasses set the class attributes and `run`."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    accepts: ClassVar[tuple[Format, ...]]
    produces: ClassVar[Format]
    extra: ClassVar[str | None] = None
    Config: ClassVar[type[PassConfig]] = PassConfig

    def run(self, artifact: Artifact, config: PassConfig, ctx: PassContext) -> Artifact:
        raise NotImplementedError

    @classmethod
    def missing(cls) -> str | None:
        """None when the pass can run here, else the install hint."""
        return missing_extra(cls.extra)


def missing_extra(extra: str | None) -> str | None:
    if not extra:
        return None
    modules, hint = EXTRAS[extra]
    if all(importlib.util.find_spec(m) is not None for m in modules):
        return None
    return hint


def require_extra(extra: str, what: str) -> None:
    hint = missing_extra(extra)
    if hint:
        raise DependencyError(f"{what} needs the '{extra}' extra, which is not installed: {hint}")


_REGISTRY: dict[str, type[Pass]] = {}
_LOADED = False


def register(cls: type[Pass]) -> type[Pass]:
    """Class decorator used by built-in and plugin passes."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise UsageError(f"two passes are named {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def registered() -> dict[str, type[Pass]]:
    """The passes registered so far (optkit.passes.all_passes loads the built-in ones and plugins first)."""
    return dict(sorted(_REGISTRY.items()))


def build_config(cls: type[Pass], config: dict[str, Any], unknown: str = "unknown option"):
    """Validate a pass config; a typo or a wrong type is a usage error naming the key. ConfigError carries
    the key's path, so a recipe can point at its line."""
    try:
        return cls.Config(**config)
    except PydanticValidationError as e:
        err = e.errors()[0]
        raise ConfigError(cls.name, tuple(err["loc"]), config_message(err, unknown)) from None


class ConfigError(UsageError):
    def __init__(self, pass_name: str, loc: tuple, message: str):
        self.pass_name, self.loc, self.detail = pass_name, loc, message
        super().__init__(f"{pass_name}: {'.'.join(str(p) for p in loc) or 'config'}: {message}")


def config_message(err: dict, unknown: str = "unknown option") -> str:
    """pydantic's error, as one plain phrase."""
    if err["type"] == "extra_forbidden":
        return unknown
    if err["type"] == "missing":
        return "missing (required)"
    msg = err["msg"].removeprefix("Value error, ")
    return msg[0].lower() + msg[1:] if msg and not msg[1:2].isupper() else msg  # an acronym (SLO) stays


def check_pass(cls: type[Pass], fmt, where: str = "") -> None:
    """The pass is installed here (exit 4) and accepts `fmt` (exit 2); `where` names what gives that format."""
    missing = cls.missing()
    if missing:
        raise DependencyError(f"pass {cls.name} is unavailable here: {missing}")
    check_accepts(cls, fmt, where)


def check_accepts(cls: type[Pass], fmt, where: str = "") -> None:
    if fmt not in cls.accepts:
        raise UsageError(f"pass {cls.name} accepts {', '.join(f.value for f in cls.accepts)}, "
                         f"not {fmt.value}" + (f" ({where})" if where else ""))
