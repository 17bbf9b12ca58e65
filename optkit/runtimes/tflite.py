"""The TFLite interpreter (LiteRT's when installed, else TensorFlow's)."""
from __future__ import annotations

import os
import warnings

import numpy as np

from optkit.core.artifact import Artifact
from optkit.core.errors import UsageError
from optkit.core.registry import require_extra
from optkit.runtimes.base import Session, TensorSpec


def interpreter_class():
    try:
        from ai_edge_litert.interpreter import Interpreter
        return Interpreter
    except ImportError:
        pass
    require_extra("tf", "running a TFLite model")
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    warnings.filterwarnings("ignore", message=".*tf.lite.Interpreter is deprecated.*")
    return tf.lite.Interpreter


class TFLiteSession(Session):
    runtime = "tflite"

    def __init__(self, artifact: Artifact, threads: int | None = None):
        Interpreter = interpreter_class()
        try:
            self.interp = Interpreter(model_path=artifact.path, num_threads=threads)
            self.interp.allocate_tensors()
        except (ValueError, RuntimeError) as e:
            raise UsageError(f"cannot load {artifact.path} as TFLite: {str(e).strip().splitlines()[0]}") from None
        self.threads = threads
        self._in = self.interp.get_input_details()
        self._out = self.interp.get_output_details()
        self.inputs = [TensorSpec(d["name"], _shape(d), np.dtype(d["dtype"]).name) for d in self._in]
        self.outputs = [TensorSpec(d["name"], _shape(d), np.dtype(d["dtype"]).name) for d in self._out]
        self._shapes = {d["name"]: tuple(d["shape"]) for d in self._in}

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        resized = False
        for d in self._in:
            x = feeds[d["name"]]
            if tuple(x.shape) != self._shapes[d["name"]]:
                self.interp.resize_tensor_input(d["index"], x.shape)
                self._shapes[d["name"]] = tuple(x.shape)
                resized = True
        if resized:
            self.interp.allocate_tensors()
        for d in self._in:
            self.interp.set_tensor(d["index"], feeds[d["name"]])
        self.interp.invoke()
        return [self.interp.get_tensor(d["index"]) for d in self._out]

    def quantization(self) -> dict:
        """Scale and zero point of quantized inputs and outputs (int8 I/O models)."""
        return {d["name"]: d["quantization"] for d in self._in + self._out if d["quantization"] != (0.0, 0)}


def _shape(d) -> list:
    sig = d.get("shape_signature")
    sig = sig if sig is not None and len(sig) else d["shape"]
    return [int(x) if x > 0 else None for x in sig]
