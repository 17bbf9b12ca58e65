"""The TFLite interpreter (LiteRT's when installed, else TensorFlow's)."""
from __future__ import annotations

import warnings

import numpy as np

from optkit.core.artifact import Artifact
from optkit.core.errors import UsageError
from optkit.core.registry import require_extra
from optkit.core.shapes import TensorSpec
from optkit.core.text import first_line
from optkit.runtimes.base import Session
from optkit.runtimes.tf import import_tf, native_stderr_silenced


def interpreter_class():
    try:
        from ai_edge_litert.interpreter import Interpreter
        return Interpreter
    except ImportError:
        pass
    require_extra("tf", "running a TFLite model")

    tf = import_tf()
    warnings.filterwarnings("ignore", message=".*tf.lite.Interpreter is deprecated.*")
    return tf.lite.Interpreter


class TFLiteSession(Session):
    runtime = "tflite"

    @classmethod
    def warm(cls, fmt=None) -> None:
        interpreter_class()

    def __init__(self, artifact: Artifact, threads: int | None = None):
        Interpreter = interpreter_class()

        try:
            with native_stderr_silenced():  # the XNNPACK delegate announces itself on stderr
                self.interp = Interpreter(model_path=artifact.path, num_threads=threads)
                self.interp.allocate_tensors()
        except (ValueError, RuntimeError) as e:
            raise UsageError(f"cannot load {artifact.path} as TFLite: {first_line(e)}") from None
        self.threads = threads
        self.input_details = self.interp.get_input_details()
        self.output_details = self.interp.get_output_details()
        names = _signature_names(self.interp)
        # Quantized (int8/uint8) inputs and outputs are exposed as real values: run() quantizes at the boundary.
        self.inputs = [TensorSpec(names.get(d["index"], d["name"]), _shape(d), _real_dtype(d)) for d in self.input_details]
        self.outputs = [TensorSpec(names.get(d["index"], d["name"]), _shape(d), _real_dtype(d)) for d in self.output_details]
        self._feed_names = [s.name for s in self.inputs]
        self._shapes = {d["index"]: tuple(d["shape"]) for d in self.input_details}

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        resized = False
        for d, name in zip(self.input_details, self._feed_names):
            x = feeds[name]
            if tuple(x.shape) != self._shapes[d["index"]]:
                self.interp.resize_tensor_input(d["index"], x.shape)
                self._shapes[d["index"]] = tuple(x.shape)
                resized = True
        if resized:
            self.interp.allocate_tensors()
        for d, name in zip(self.input_details, self._feed_names):
            self.interp.set_tensor(d["index"], quantize(feeds[name], d))
        # Stateful ops (LSTM) keep their state in variable tensors between invokes; each call is an
        # independent sample, so results must not depend on what ran before.
        self.interp.reset_all_variables()
        self.interp.invoke()
        return [dequantize(self.interp.get_tensor(d["index"]), d) for d in self.output_details]

    def op_histogram(self) -> dict[str, int]:
        from collections import Counter

        return dict(Counter(op["op_name"] for op in self.interp._get_ops_details()).most_common())

    def parameter_count(self) -> int:
        """Elements of constant tensors: op inputs that no op produces and that are not model inputs."""
        ops = self.interp._get_ops_details()
        produced = {i for op in ops for i in op["outputs"]} | {d["index"] for d in self.input_details}
        constants = {i for op in ops for i in op["inputs"] if i >= 0 and i not in produced}
        shapes = {d["index"]: d["shape"] for d in self.interp.get_tensor_details()}
        return int(sum(np.prod(shapes[i]) for i in constants if i in shapes))

    def quantization(self) -> dict:
        """Scale and zero point of quantized inputs and outputs (int8 I/O models)."""
        return {d["name"]: d["quantization"] for d in self.input_details + self.output_details if d["quantization"] != (0.0, 0)}


def _is_quantized(d) -> bool:
    return np.dtype(d["dtype"]).kind in "iu" and d["quantization"][0] != 0.0


def _real_dtype(d) -> str:
    return "float32" if _is_quantized(d) else np.dtype(d["dtype"]).name


def quantize(x: np.ndarray, d) -> np.ndarray:
    if not _is_quantized(d) or np.dtype(x.dtype).kind in "iu":
        return x
    # round(x / scale) + zero, in float32, ties to even: as ONNX QuantizeLinear (and TFLite's QUANTIZE but for
    # ties) do; rounding x / scale + zero instead moves inputs that sit on a half step (x / 127.5 - 1 images) by one
    scale, zero = d["quantization"]
    info = np.iinfo(d["dtype"])
    q = np.round(np.asarray(x, np.float32) / np.float32(scale)) + zero
    return np.clip(q, info.min, info.max).astype(d["dtype"])


def dequantize(x: np.ndarray, d) -> np.ndarray:
    if not _is_quantized(d):
        return x
    scale, zero = d["quantization"]
    return ((x.astype(np.float32) - zero) * scale).astype(np.float32)


def _signature_names(interp) -> dict[int, str]:
    """Tensor index -> the clean name from the model's only signature ({} when it has none or several)."""
    sigs = interp.get_signature_list()
    if len(sigs) != 1:
        return {}
    runner = interp.get_signature_runner(next(iter(sigs)))
    names = {d["index"]: name for name, d in runner.get_input_details().items()}
    names.update({d["index"]: name for name, d in runner.get_output_details().items()})
    return names


def _shape(d) -> list:
    sig = d.get("shape_signature")
    sig = sig if sig is not None and len(sig) else d["shape"]
    return [int(x) if x > 0 else None for x in sig]
