"""The runtime contract: load one format, describe its inputs and outputs, run it."""
from __future__ import annotations

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

    @classmethod
    def warm(cls) -> None:
        """Load the runtime itself (libraries, allocators), so memory measured afterwards is the model's own."""


def open_session(artifact: Artifact, provider: str = "cpu", threads: int | None = None,
                 ort_settings=None) -> Session:
    """Load `artifact` on its own runtime; `ort_settings` (onnx.session.OrtSettings) apply to ONNX models."""
    fmt = artifact.format
    log.debug("opening %s (%s) on %s", artifact.path, fmt.value, provider)
    cls = session_class(fmt)
    if fmt == Format.ONNX:
        return cls(artifact, provider=provider, threads=threads, ort_settings=ort_settings)
    if ort_settings is not None and ort_settings.model_dump(exclude_none=True):
        raise UsageError(f"onnxruntime session options apply to ONNX models; {artifact.path} is {fmt.value}")
    if provider not in ("cpu", "auto") and fmt != Format.TRT_ENGINE:
        raise UsageError(f"--provider {provider} applies to ONNX models; {artifact.path} is {fmt.value}")
    if fmt == Format.TRT_ENGINE:
        return cls(artifact)
    return cls(artifact, threads=threads)


def warm_runtime(fmt: Format) -> None:
    """Start the runtime that runs `fmt` before a memory baseline is taken (TensorFlow's import alone is
    hundreds of MiB, which is not a TFLite model's memory)."""
    session_class(fmt).warm()


def session_class(fmt: Format) -> type[Session]:
    if fmt == Format.ONNX:
        from optkit.runtimes.onnx import OnnxSession

        return OnnxSession
    if fmt == Format.TFLITE:
        from optkit.runtimes.tflite import TFLiteSession

        return TFLiteSession
    if fmt in (Format.TORCHSCRIPT, Format.TORCH_EXPORT, Format.TORCH_MODULE):
        from optkit.runtimes.torch import TorchSession

        return TorchSession
    if fmt in (Format.KERAS, Format.TF_SAVEDMODEL):
        from optkit.runtimes.tf import TFSession

        return TFSession
    if fmt == Format.TRT_ENGINE:
        from optkit.runtimes.tensorrt import TensorRTSession

        return TensorRTSession
    raise UsageError(f"no runtime for format {fmt.value}")
