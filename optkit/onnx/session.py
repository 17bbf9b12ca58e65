"""Running ONNX models on onnxruntime's CPU provider: quiet sessions, input signatures, batched runs.
The runtime (`optkit.runtimes.onnx`) and the passes that check their own outputs share these."""
from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

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


class OrtSettings(BaseModel):
    """onnxruntime session options beyond the intra-op threads (MeasureSettings.threads): what `optkit tune`
    searches and what a recipe's `measure.session` sets. None: onnxruntime's default."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    inter_op_threads: int | None = Field(default=None, ge=1, le=256)
    execution_mode: Literal["sequential", "parallel"] | None = None
    graph_optimization: Literal["disable", "basic", "extended", "all"] | None = None
    cpu_mem_arena: bool | None = None
    mem_pattern: bool | None = None

    def snippet(self, threads: int | None) -> str:
        """The Python lines that make the same onnxruntime SessionOptions."""
        lines = ["import onnxruntime as ort", "", "so = ort.SessionOptions()"]
        if threads:
            lines.append(f"so.intra_op_num_threads = {threads}")
        if self.inter_op_threads:
            lines.append(f"so.inter_op_num_threads = {self.inter_op_threads}")
        if self.execution_mode:
            lines.append(f"so.execution_mode = ort.ExecutionMode.{_EXECUTION[self.execution_mode]}")
        if self.graph_optimization:
            lines.append(f"so.graph_optimization_level = ort.GraphOptimizationLevel."
                         f"{_OPTIMIZATION[self.graph_optimization]}")
        if self.cpu_mem_arena is not None:
            lines.append(f"so.enable_cpu_mem_arena = {self.cpu_mem_arena}")
        if self.mem_pattern is not None:
            lines.append(f"so.enable_mem_pattern = {self.mem_pattern}")
        return "\n".join(lines) + "\n"


_EXECUTION = {"sequential": "ORT_SEQUENTIAL", "parallel": "ORT_PARALLEL"}
_OPTIMIZATION = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
                 "all": "ORT_ENABLE_ALL"}


def session_options(threads: int | None = None, optimize: bool = True, ort_settings: OrtSettings | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = quiet_ort()
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    o = ort_settings
    if o is not None:
        if o.inter_op_threads:
            so.inter_op_num_threads = o.inter_op_threads
        if o.execution_mode:
            so.execution_mode = getattr(ort.ExecutionMode, _EXECUTION[o.execution_mode])
        if o.graph_optimization:
            so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _OPTIMIZATION[o.graph_optimization])
        if o.cpu_mem_arena is not None:
            so.enable_cpu_mem_arena = o.cpu_mem_arena
        if o.mem_pattern is not None:
            so.enable_mem_pattern = o.mem_pattern
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


CPU = ("CPUExecutionProvider",)


def ort_session(model: str | Path | bytes, *, threads: int | None = None, optimize: bool = True,
                ort_settings: OrtSettings | None = None, providers=CPU,
                optimization: Literal["basic", "extended"] | None = None, optimized_path: str | Path | None = None,
                profile_prefix: str | Path | None = None):
    """The one place optkit opens an onnxruntime session: telemetry off, onnxruntime's own log quiet (--debug
    shows it), the options of `session_options` (threads, optimize, OrtSettings), the providers asked for (CPU
    unless named: a name or a (name, options) pair each). `optimization` sets the graph optimization level and
    `optimized_path` saves the optimized model there (onnxruntime's offline optimization); `profile_prefix`
    turns onnxruntime's profiler on, writing under that prefix. `model` is a path or the model's bytes.
    onnxruntime's exceptions come through as they are (`session` turns them into a UsageError naming the file)."""
    import onnxruntime as ort

    ort.disable_telemetry_events()
    so = session_options(threads, optimize, ort_settings)
    if optimization:
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _OPTIMIZATION[optimization])
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = str(profile_prefix)
    if not isinstance(model, bytes):
        model = str(model)
    return ort.InferenceSession(model, sess_options=so, providers=list(providers))


def session(path: str | Path, threads: int | None = 1, optimize: bool = True, *,
            ort_settings: OrtSettings | None = None, providers=CPU):
    """An onnxruntime session (CPU unless providers are named); a UsageError naming the file when onnxruntime
    cannot load it."""
    log.debug("onnxruntime session: %s (threads %s, optimize %s)", path, threads, optimize)
    try:
        return ort_session(path, threads=threads, optimize=optimize, ort_settings=ort_settings,
                           providers=providers)
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
    by_name = {o.name: o for o in sess.get_outputs()}
    outputs = [spec_of(by_name[n]) for n in names] if all(n in by_name and by_name[n].shape is not None
                                                          for n in names) else None
    return run_batched(lambda f: sess.run(names, f), input_specs(sess), feeds, batch, outputs=outputs)


@functools.cache
def warm_onnxruntime() -> None:
    """Load and initialise onnxruntime (libraries, default allocators) with a one-node model, once per
    process, so that memory measured afterwards is the model's own, wherever the measurement runs."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "warm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    sess = ort_session(model.SerializeToString(), threads=1)
    sess.run(None, {"x": np.zeros(1, np.float32)})
