"""OpenVINO on the CPU: ONNX models read directly and OpenVINO IR (.xml + .bin).

Settings, stated in every report (`describe`): the LATENCY hint, one stream, the threads asked for
(INFERENCE_NUM_THREADS; default OpenVINO's), and f32 inference precision: OpenVINO's CPU default is bf16 on CPUs
with bf16 instructions, which would change an FP32 model's arithmetic. A model with dynamic dims is reshaped to
the shapes it is fed and compiled for them (the last MAX_SHAPES kept; past that, the dynamic model serves).
"""
from __future__ import annotations

import logging
import platform
from collections import OrderedDict
from pathlib import Path

import numpy as np

from optkit.core.artifact import Artifact
from optkit.core.errors import DependencyError, PassError, UsageError
from optkit.core.formats import Format
from optkit.core.shapes import TensorSpec
from optkit.core.text import first_line
from optkit.onnx import io as onnx_io
from optkit.onnx.session import with_hints
from optkit.runtimes.base import Session

log = logging.getLogger(__name__)

INSTALL = "pip install 'optkit[openvino]'"
MAX_SHAPES = 8
X86 = ("x86_64", "amd64", "i386", "i686", "x86")


def import_openvino(asked: str = "--runtime openvino", instead: str = "--runtime onnxruntime"):
    """openvino, or exit 4 with the one command that installs it (or why it cannot run here); `asked` is what the
    user asked for that needs it, `instead` what runs without it."""
    if platform.machine().lower() not in X86:
        raise DependencyError(f"OpenVINO is run by optkit on x86-64 CPUs only; this machine is {platform.machine()}: "
                              f"use {instead}")
    try:
        import openvino
    except ImportError:
        raise DependencyError(f"{asked} needs OpenVINO: {INSTALL}") from None
    return openvino


def version() -> str:
    return import_openvino().get_version().split("-")[0]


def save_ir(onnx_path: str | Path, dest: str | Path, shown: str | Path | None = None) -> None:
    """An ONNX file as OpenVINO IR at `dest` (.xml, .bin beside it), FP32 weights kept (no fp16 compression);
    `shown` is the model's name in the error (the user's file where onnx_path is a temporary copy)."""
    ov = import_openvino("writing OpenVINO IR (NAME.xml)", "an ONNX output (NAME.onnx)")
    try:
        ov.save_model(ov.convert_model(str(onnx_path)), str(dest), compress_to_fp16=False)
    except Exception as e:  # noqa: BLE001 - OpenVINO's frontends raise their own types
        raise PassError(f"OpenVINO cannot convert {shown or onnx_path}: {said(e)[:300]}") from None


def said(e: Exception) -> str:
    """What OpenVINO says failed: its converter's summary lines (the operations it has no rule for), else its
    last line of words, not the 'Exception from core.cpp:84:' / 'Check ... failed at file.cpp' lines its errors
    start with (the first line of 'an .xml with a truncated .bin' is 'Exception from src/inference/src/cpp/
    core.cpp:84:', its last 'Incorrect weights in bin file!')."""
    lines = [ln.strip(" -") for ln in str(e).splitlines() if ln.strip()]
    if "Summary:" in lines:
        return "; ".join(lines[lines.index("Summary:") + 1:]) or first_line(e)
    words = [ln for ln in lines if not ln.startswith(("Check '", "Exception from "))]
    return words[-1] if words else first_line(e)



def compile_settings(threads: int | None, profile: bool = False) -> dict:
    """The CPU plugin's settings optkit runs a model with (and records)."""
    cfg = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_PRECISION_HINT": "f32"}
    if threads:
        cfg["INFERENCE_NUM_THREADS"] = str(threads)
    if profile:
        cfg["PERF_COUNT"] = "YES"
    return cfg


def read_model(core, artifact: Artifact):
    try:
        return core.read_model(artifact.path)
    except Exception as e:  # noqa: BLE001 - OpenVINO's frontends raise their own types
        raise UsageError(f"OpenVINO cannot read {artifact.path}: {said(e)[:300]}") from None


def _onnx_specs(path: str) -> list[TensorSpec] | None:
    """The ONNX graph's inputs with their dim names (OpenVINO drops them), which the shape ladders read."""
    from onnx import helper

    graph = onnx_io.load(path, external_data=False).graph
    consts = {i.name for i in graph.initializer}
    specs = []
    for i in graph.input:
        if i.name in consts:
            continue
        t = i.type.tensor_type
        shape = [d.dim_value if d.dim_value > 0 else (d.dim_param or None) for d in t.shape.dim] \
            if t.HasField("shape") else None
        specs.append(TensorSpec(i.name, shape, _dtype_name(helper.tensor_dtype_to_np_dtype(t.elem_type))))
    return with_hints(specs, path)


def _dtype_name(dtype) -> str:
    """A tensor's type as a TensorSpec names it: a string tensor is "string" (as onnxruntime's session says), not
    numpy's "object" or "str", which the input synthesizer refuses as a type it cannot feed."""
    dtype = np.dtype(dtype)
    return "string" if dtype.kind in "OUS" else dtype.name


def _port_spec(port) -> TensorSpec:
    ps = port.get_partial_shape()
    shape = None if ps.rank.is_dynamic else [d.get_length() if d.is_static else None for d in ps]
    return TensorSpec(port.get_any_name(), shape, _dtype_name(port.get_element_type().to_dtype()))


class OpenVINOSession(Session):
    runtime = "openvino"

    @classmethod
    def available(cls, fmt: Format | None = None) -> None:
        if fmt == Format.OPENVINO_IR:  # the user gave (or asked for) an .xml, not --runtime openvino
            import_openvino("a model in OpenVINO IR (.xml)", "the ONNX model it was converted from")
        import_openvino()

    @classmethod
    def warm(cls, fmt=None) -> None:
        import_openvino().Core().get_versions("CPU")

    def __init__(self, artifact: Artifact, threads: int | None = None, profile: bool = False):
        self.available(artifact.format)
        ov = import_openvino()
        self.core = ov.Core()
        self.path = artifact.path
        self.model = read_model(self.core, artifact)
        self.threads = threads
        self.config = compile_settings(threads, profile)
        self.outputs = [_port_spec(p) for p in self.model.outputs]
        ports = [_port_spec(p) for p in self.model.inputs]
        self.inputs = (_onnx_specs(artifact.path) if artifact.format == Format.ONNX else None) or ports
        strings = [s.name for s in self.inputs if s.dtype == "string"]
        if strings:
            raise UsageError(f"input {strings[0]!r} is a string tensor, which optkit cannot feed OpenVINO: measure "
                             "the ONNX model on onnxruntime (--runtime onnxruntime)")
        self.dynamic = any(s.dynamic for s in ports)
        self._compiled: OrderedDict[tuple, object] = OrderedDict()   # shapes -> infer request
        self._dynamic_request = None
        self.reshaped: dict[str, list[int]] = {}
        if not self.dynamic:
            self._compiled[()] = self._compile(self.model)

    def _compile(self, model):
        try:
            return self.core.compile_model(model, "CPU", self.config).create_infer_request()
        except Exception as e:  # noqa: BLE001
            raise UsageError(f"OpenVINO cannot compile {self.path}: {said(e)[:300]}") from None

    def request(self, feeds: dict[str, np.ndarray]):
        """The infer request compiled for these feeds' shapes (reshaped and compiled on first sight)."""
        if not self.dynamic:
            return self._compiled[()]
        key = tuple((k, np.shape(v)) for k, v in sorted(feeds.items()))
        req = self._compiled.get(key)
        if req is not None:
            self._compiled.move_to_end(key)
            return req
        if len(self._compiled) >= MAX_SHAPES:  # many shapes (text batched by length): the dynamic model serves
            if self._dynamic_request is None:
                self._dynamic_request = self._compile(self.model)
            return self._dynamic_request
        model = self.model.clone()
        try:
            model.reshape({k: list(np.shape(v)) for k, v in feeds.items()})
        except Exception as e:  # noqa: BLE001
            raise UsageError(f"OpenVINO cannot reshape {self.path} to "
                             f"{ {k: list(np.shape(v)) for k, v in feeds.items()} }: {said(e)[:200]}") from None
        self._compiled[key] = req = self._compile(model)
        self.reshaped = {k: list(np.shape(v)) for k, v in feeds.items()}
        return req

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        request = self.request(feeds)
        try:
            return list(request.infer(feeds, share_inputs=True).to_tuple())
        except Exception as e:  # noqa: BLE001 - OpenVINO's own types; its message's first line says nothing
            raise RuntimeError(said(e)) from None

    def profiling_info(self, feeds: dict[str, np.ndarray]) -> list:
        """The per-layer counters of the last call with these feeds (opened with profile=True)."""
        return self.request(feeds).profiling_info

    def close(self) -> None:
        self._compiled.clear()
        self._dynamic_request = None

    def describe(self) -> dict:
        settings = {k: v for k, v in self.config.items() if k != "PERF_COUNT"}
        settings.setdefault("INFERENCE_NUM_THREADS", "default")
        if self.reshaped:
            settings["reshaped_to"] = dict(self.reshaped)
        return {"name": "openvino", "version": version(), "settings": {"device": "CPU", **settings}}
