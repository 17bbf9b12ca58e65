"""Running ONNX models on onnxruntime's CPU provider: quiet sessions, input signatures, batched runs.
The runtime (`optkit.runtimes.onnx`) and the passes that check their own outputs share these."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from optkit.core import logs
from optkit.core.batching import run_batched
from optkit.core.errors import UsageError
from optkit.core.shapes import TensorSpec
from optkit.core.text import first_line
from optkit.onnx import io as onnx_io
from optkit.onnx.graph import input_hints

log = logging.getLogger(__name__)

DTYPES = {
    "tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
    "tensor(bfloat16)": "bfloat16",
    "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(int16)": "int16", "tensor(uint16)": "uint16",
    "tensor(int32)": "int32", "tensor(int64)": "int64", "tensor(uint32)": "uint32", "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
}


def quiet_ort() -> int:
    """onnxruntime's failures come back as exceptions that optkit turns into its one line; its own log lines
    (run-time errors go through the default logger, not the session's) show only with --debug. Call it before
    any onnxruntime helper creates a session of its own."""
    import onnxruntime as ort

    severity = 2 if logs.debugging() else 4
    ort.set_default_logger_severity(severity)
    return severity


def session_options(threads: int | None = None, optimize: bool = True):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = quiet_ort()
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return so


def check_feedable(specs: list) -> None:
    """A UsageError for inputs onnxruntime's Python API cannot take from numpy: bfloat16 (numpy has no such
    type; onnxruntime refuses float32, uint16 and ml_dtypes arrays for it). optkit synthesizes float32 for
    bfloat16 inputs of TensorFlow and torch models, which do take it."""
    for spec in specs:
        if str(spec.dtype) in ("bfloat16", "tensor(bfloat16)"):
            raise UsageError(f"input {spec.name!r} has type bfloat16, which onnxruntime cannot be fed from Python "
                             "(numpy has no bfloat16); export the model with float32 or float16 inputs, casting "
                             "to bfloat16 inside the graph")


def spec_of(arg) -> TensorSpec:
    shape = [d if isinstance(d, int) and d > 0 else (d if isinstance(d, str) else None) for d in (arg.shape or [])]
    return TensorSpec(arg.name, shape, DTYPES.get(arg.type, arg.type))


def session(path: str | Path, threads: int | None = 1, optimize: bool = True):
    """An onnxruntime CPU session; a UsageError naming the file when onnxruntime cannot load it."""
    import onnxruntime as ort

    log.debug("onnxruntime session: %s (threads %s, optimize %s)", path, threads, optimize)
    try:
        return ort.InferenceSession(str(path), sess_options=session_options(threads, optimize),
                                    providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises several exception types for unreadable models
        raise UsageError(f"cannot load {path} with onnxruntime: {first_line(e)}") from None


def input_specs(sess, path: str | Path | None = None) -> list[TensorSpec]:
    """The session's inputs, with what the graph says about their values (see `with_hints`); a UsageError
    for those onnxruntime cannot be fed (bfloat16)."""
    specs = with_hints([spec_of(i) for i in sess.get_inputs()], path or getattr(sess, "_model_path", None))
    check_feedable(specs)
    return specs


def with_hints(specs: list[TensorSpec], path: str | Path | None) -> list[TensorSpec]:
    """The specs with the value ranges and masks `graph.input_hints` reads from the model file."""
    if not path or not any(s.dtype.startswith(("int", "uint", "bool")) for s in specs):
        return specs
    try:
        hints = input_hints(onnx_io.load(path, external_data=False))
    except UsageError:
        return specs
    for spec in specs:
        hint = hints.get(spec.name, {})
        spec.value_range = hint.get("value_range")
        spec.mask = hint.get("mask", False)
    return specs


def run_all(sess, feeds: dict[str, np.ndarray], names: list[str] | None = None, batch: int = 64
            ) -> list[np.ndarray]:
    """Run a session over every sample, in batches the model accepts (see core.batching.run_batched)."""
    names = names or [o.name for o in sess.get_outputs()]
    return run_batched(lambda f: sess.run(names, f), input_specs(sess), feeds, batch)
