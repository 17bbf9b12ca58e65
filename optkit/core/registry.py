"""The pass contract and registry; third-party passes register through the `optkit.passes` entry points."""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from optkit.core.artifact import Artifact
from optkit.core.errors import DependencyError, UsageError
from optkit.core.formats import Format

# Built-in pass modules. They are cheap to import: frameworks are imported inside `run`.
BUILTIN_MODULES = (
    "optkit.passes.convert",
    "optkit.passes.simplify",
    "optkit.passes.quantize",
    "optkit.passes.prune",
    "optkit.passes.qat",
    "optkit.passes.tflite",
    "optkit.passes.tensorrt",
    "optkit.passes.tune",
    "optkit.passes.profile",
)

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


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for mod in BUILTIN_MODULES:
        if importlib.util.find_spec(mod) is not None:
            importlib.import_module(mod)
    for ep in entry_points(group="optkit.passes"):
        obj = ep.load()
        if isinstance(obj, type) and issubclass(obj, Pass):
            register(obj)


def all_passes() -> dict[str, type[Pass]]:
    _load()
    return dict(sorted(_REGISTRY.items()))


def get_pass(name: str) -> type[Pass]:
    passes = all_passes()
    if name not in passes:
        import difflib

        close = difflib.get_close_matches(name, passes, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "; run `optkit passes` for the list"
        raise UsageError(f"unknown pass {name!r}{hint}")
    return passes[name]
