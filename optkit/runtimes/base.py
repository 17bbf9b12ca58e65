"""The runtime contract: load one format, describe its inputs and outputs, run it."""
from __future__ import annotations

import importlib
import logging
from collections.abc import Callable

import numpy as np

from optkit.core.artifact import Artifact
from optkit.core.errors import UsageError
from optkit.core.formats import Format
from optkit.core.shapes import TensorSpec, format_shape

log = logging.getLogger(__name__)


class Session:
    """A loaded model. Subclasses fill `inputs`, `outputs`, `runtime`, `provider` and implement `run`."""

    runtime: str = ""
    provider: str = "cpu"
    takes_provider = False       # runs on a provider the caller chooses (onnxruntime, TensorRT)
    takes_ort_settings = False   # onnxruntime's session options apply
    threads: int | None = None
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def timer(self) -> Callable[[Callable[[], object]], float] | None:
        """A device timer (seconds for one call) where wall-clock time would be wrong, e.g. CUDA events."""
        return None

    def check_feeds(self, feeds: dict[str, np.ndarray]) -> None:
        names = [s.name for s in self.inputs]
        missing = [n for n in names if n not in feeds]
        extra = [n for n in feeds if n not in names]
        if missing or extra:
            raise UsageError(
                f"inputs do not match the model: it expects {', '.join(names)}"
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; unexpected {', '.join(extra)}" if extra else "")
            )
        for spec in self.inputs:
            arr = feeds[spec.name]
            if spec.shape is not None and (len(arr.shape) != len(spec.shape) or any(
                isinstance(d, int) and d > 0 and d != a for d, a in zip(spec.shape, arr.shape)
            )):
                raise UsageError(
                    f"input {spec.name!r} has shape {format_shape(arr.shape)} but the model expects "
                    f"{format_shape(spec.shape)}"
                )

    def close(self) -> None:
        pass

    def describe(self) -> dict:
        """The runtime and the settings it runs the model with, as reports record them
        ({"name", "version", "settings"})."""
        return {"name": self.runtime, "version": None,
                "settings": {"provider": self.provider, "threads": self.threads}}

    @classmethod
    def open(cls, artifact: Artifact, *, provider: str = "cpu", threads: int | None = None,
             ort_settings=None) -> Session:
        """A session of `artifact` (open_session has checked the provider and options apply)."""
        return cls(artifact, threads=threads)

    @classmethod
    def available(cls, fmt: Format | None = None) -> None:
        """A DependencyError (exit 4, with the install command) where the runtime is not installed or cannot run
        on this machine: checked before any work. `fmt`: the model's format, which the message may name."""

    @classmethod
    def warm(cls, fmt: Format | None = None) -> None:
        """Load the runtime itself (libraries, allocators, and what loading a file of `fmt` imports), so memory
        measured afterwards is the model's own."""


def open_session(artifact: Artifact, provider: str = "cpu", threads: int | None = None,
                 ort_settings=None, runtime: str | None = None) -> Session:
    """Load `artifact` on `runtime` (default: the one registered first for its format); `ort_settings`
    (onnx.session.OrtSettings) apply to onnxruntime, `provider` to runtimes that choose one."""
    fmt = artifact.format
    log.debug("opening %s (%s) on %s, %s", artifact.path, fmt.value, runtime or "its runtime", provider)
    cls = session_class(fmt, runtime)
    if ort_settings is not None and ort_settings.model_dump(exclude_none=True) and not cls.takes_ort_settings:
        raise UsageError(f"onnxruntime session options apply to onnxruntime; {artifact.path} runs on {cls.runtime}")
    if provider not in ("cpu", "auto") and not cls.takes_provider:
        if runtime is not None:
            raise UsageError(f"--provider {provider} is onnxruntime's; --runtime {runtime} runs on the CPU: drop "
                             "one of them")
        raise UsageError(f"--provider {provider} applies to ONNX models; {artifact.path} is {fmt.value}")
    return cls.open(artifact, provider=provider, threads=threads, ort_settings=ort_settings)


def warm_runtime(fmt: Format, runtime: str | None = None) -> None:
    """Start the runtime that runs `fmt` before a memory baseline is taken (TensorFlow's import alone is
    hundreds of MiB, which is not a TFLite model's memory)."""
    session_class(fmt, runtime).warm(fmt)


# (format, runtime name) -> "module:Class" of its Session; the first runtime registered for a format is its default.
# runtimes/__init__.py registers the built-in ones
_RUNTIMES: dict[tuple[Format, str], str] = {}
_DEFAULT: dict[Format, str] = {}


def register_runtime(formats: tuple[Format, ...], session: str, runtime: str, default: bool = True) -> None:
    """Make `session` ("package.module:Class", imported when first used) the runtime `runtime` (its name, as
    --runtime spells it and its Session's `runtime` says) of `formats`, and the default of each where `default`
    (or where it is the first)."""
    for fmt in formats:
        _RUNTIMES[(fmt, runtime)] = session
        if default or fmt not in _DEFAULT:
            _DEFAULT[fmt] = runtime


def runtimes_of(fmt: Format) -> list[str]:
    """The runtimes registered for `fmt`, its default first."""
    names = [r for f, r in _RUNTIMES if f == fmt]
    return sorted(names, key=lambda r: r != _DEFAULT.get(fmt))


def runtime_names() -> list[str]:
    """Every runtime --runtime may name."""
    return sorted({r for _, r in _RUNTIMES})


def takes(fmt: Format, runtime: str | None) -> bool:
    """Whether `runtime` (None: the default) runs models of `fmt`."""
    return runtime is None or (fmt, runtime) in _RUNTIMES


def session_class(fmt: Format, runtime: str | None = None) -> type[Session]:
    if fmt not in _DEFAULT:
        raise UsageError(f"no runtime for format {fmt.value}")
    name = runtime or _DEFAULT[fmt]
    if (fmt, name) not in _RUNTIMES:
        known = runtime_names()
        if name not in known:
            raise UsageError(f"--runtime {name}: no such runtime; give one of {', '.join(known)}")
        raise UsageError(f"--runtime {name} does not run {fmt.value} models; it runs "
                         f"{', '.join(f.value for f, r in _RUNTIMES if r == name)} (this model runs on "
                         f"{', '.join(runtimes_of(fmt))})")
    module, _, cls = _RUNTIMES[(fmt, name)].partition(":")
    return getattr(importlib.import_module(module), cls)
