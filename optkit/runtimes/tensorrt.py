"""TensorRT engines: load a serialized engine, run it on the GPU, time it with CUDA events.

CUDA memory, streams, events and graphs go through cuda-python (`cuda.bindings.runtime`, or the older
`cuda.cudart`) and, where that is missing, through torch.cuda. Set OPTKIT_TRT_CUDA_GRAPHS=1 (or pass
`cuda_graphs=True`) to replay execution from a CUDA graph; the session's provider then reads
"tensorrt+cuda-graph" so reports say how the figure was made.

Nothing here is imported by `optkit --help`: tensorrt and CUDA are imported when a session opens.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from optkit.core.artifact import Artifact
from optkit.core.errors import DependencyError, PassError, UsageError
from optkit.core.shapes import TensorSpec
from optkit.core.text import first_line
from optkit.runtimes.base import Session

log = logging.getLogger(__name__)

TRT_INSTALL = "pip install 'optkit[trt]' (tensorrt and cuda-python; needs an NVIDIA GPU and driver)"


# -- hardware ---------------------------------------------------------------------------------------------
def gpu_problem() -> str | None:
    """None when an NVIDIA GPU looks usable here, else why not. Cheap: imports no framework."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return f"no NVIDIA GPU is visible (CUDA_VISIBLE_DEVICES={visible!r}); TensorRT needs an NVIDIA GPU"
    dev = Path("/dev")
    if any(dev.glob("nvidia[0-9]*")) or Path("/dev/dxg").exists():  # Linux, WSL2
        return None
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir() and any(gpus.iterdir()):
        return None
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and "GPU" in out.stdout:
                return None
        except (OSError, subprocess.SubprocessError):
            pass
    return "no NVIDIA GPU is visible here (no /dev/nvidia*, nvidia-smi finds none); TensorRT needs an NVIDIA GPU " \
           "with its driver"


def import_tensorrt():
    """Import tensorrt, or raise DependencyError (exit 4) saying what to install."""
    try:
        import tensorrt as trt
    except ImportError:
        raise DependencyError(f"TensorRT is not installed: {TRT_INSTALL}") from None
    except Exception as e:  # a broken install (missing libnvinfer) raises OSError / RuntimeError
        raise DependencyError(f"TensorRT cannot be loaded ({type(e).__name__}: {first_line(e)}); "
                              f"reinstall it: {TRT_INSTALL}") from None
    problem = gpu_problem()
    if problem:
        raise DependencyError(problem)
    return trt


def make_logger(trt, severity: str = "WARNING"):
    """A TensorRT logger that keeps what it hears, so a failure can be told in one line."""

    class _Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.errors: list[str] = []
            self.warnings: list[str] = []
            self.min = getattr(trt.ILogger.Severity, severity)

        def log(self, sev, msg):  # noqa: D401 - TensorRT's callback
            if sev in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                self.errors.append(str(msg).strip())
            elif sev == trt.ILogger.Severity.WARNING:
                self.warnings.append(str(msg).strip())
            log.debug("tensorrt: %s", msg)

    return _Logger()


def trt_nptype(trt, dtype) -> np.dtype:
    try:
        return np.dtype(trt.nptype(dtype))
    except TypeError:
        raise UsageError(f"the engine has a {dtype} input or output, which numpy cannot hold (e.g. bfloat16 I/O); "
                         "build it with float32/float16 inputs and outputs") from None


# -- CUDA: memory, streams, events, graphs ----------------------------------------------------------------
class _CudaPython:
    """cuda-python's runtime API (`cuda.bindings.runtime`, or `cuda.cudart` before cuda-python 12.6)."""

    name = "cuda-python"

    def __init__(self, cudart):
        self.rt = cudart
        self.stream = self._ok(cudart.cudaStreamCreate())
        self._graph_exec = None

    def _ok(self, result):
        err, *values = result if isinstance(result, tuple) else (result,)
        if int(getattr(err, "value", err)) != 0:
            _, name = self.rt.cudaGetErrorName(err)
            raise PassError(f"CUDA call failed: {name.decode() if isinstance(name, bytes) else name}")
        return values[0] if len(values) == 1 else (values or None)

    @property
    def handle(self) -> int:
        return int(self.stream)

    def malloc(self, nbytes: int) -> int:
        return int(self._ok(self.rt.cudaMalloc(max(nbytes, 1))))

    def free(self, ptr: int) -> None:
        self.rt.cudaFree(ptr)

    def upload(self, ptr: int, arr: np.ndarray) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._ok(self.rt.cudaMemcpyAsync(ptr, arr.ctypes.data, arr.nbytes, kind, self.stream))

    def download(self, arr: np.ndarray, ptr: int) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._ok(self.rt.cudaMemcpyAsync(arr.ctypes.data, ptr, arr.nbytes, kind, self.stream))

    def sync(self) -> None:
        self._ok(self.rt.cudaStreamSynchronize(self.stream))

    def event_timer(self) -> Callable[[Callable[[], object]], float]:
        start = self._ok(self.rt.cudaEventCreate())
        end = self._ok(self.rt.cudaEventCreate())

        def time_one(fn):
            self._ok(self.rt.cudaEventRecord(start, self.stream))
            fn()
            self._ok(self.rt.cudaEventRecord(end, self.stream))
            self._ok(self.rt.cudaEventSynchronize(end))
            return float(self._ok(self.rt.cudaEventElapsedTime(start, end))) / 1e3

        return time_one

    def capture(self, enqueue: Callable[[int], object]) -> None:
        mode = self.rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        self._ok(self.rt.cudaStreamBeginCapture(self.stream, mode))
        try:
            enqueue(self.handle)
        finally:
            graph = self._ok(self.rt.cudaStreamEndCapture(self.stream))
        self._graph_exec = self._ok(self.rt.cudaGraphInstantiate(graph, 0))

    def replay(self) -> None:
        self._ok(self.rt.cudaGraphLaunch(self._graph_exec, self.stream))

    def drop_graph(self) -> None:
        if self._graph_exec is not None:
            self.rt.cudaGraphExecDestroy(self._graph_exec)
            self._graph_exec = None

    def close(self) -> None:
        self.drop_graph()
        self.rt.cudaStreamDestroy(self.stream)


class _TorchCuda:
    """torch.cuda, when cuda-python is not installed but a CUDA build of torch is."""

    name = "torch.cuda"

    def __init__(self, torch):
        self.torch = torch
        self.s = torch.cuda.Stream()
        self._blocks: dict[int, Any] = {}
        self._graph = None

    @property
    def handle(self) -> int:
        return int(self.s.cuda_stream)

    def malloc(self, nbytes: int) -> int:
        t = self.torch.empty(max(nbytes, 1), dtype=self.torch.uint8, device="cuda")
        self._blocks[t.data_ptr()] = t
        return t.data_ptr()

    def free(self, ptr: int) -> None:
        self._blocks.pop(ptr, None)

    def _view(self, ptr: int, nbytes: int):
        return self._blocks[ptr][:nbytes]

    def upload(self, ptr: int, arr: np.ndarray) -> None:
        src = self.torch.from_numpy(arr.reshape(-1).view(np.uint8))
        with self.torch.cuda.stream(self.s):
            self._view(ptr, arr.nbytes).copy_(src, non_blocking=False)

    def download(self, arr: np.ndarray, ptr: int) -> None:
        dst = self.torch.from_numpy(arr.reshape(-1).view(np.uint8))
        with self.torch.cuda.stream(self.s):
            dst.copy_(self._view(ptr, arr.nbytes), non_blocking=False)

    def sync(self) -> None:
        self.s.synchronize()

    def event_timer(self):
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)

        def time_one(fn):
            start.record(self.s)
            fn()
            end.record(self.s)
            end.synchronize()
            return start.elapsed_time(end) / 1e3

        return time_one

    def capture(self, enqueue: Callable[[int], object]) -> None:
        g = self.torch.cuda.CUDAGraph()
        with self.torch.cuda.graph(g, stream=self.s):
            enqueue(self.handle)
        self._graph = g

    def replay(self) -> None:
        with self.torch.cuda.stream(self.s):
            self._graph.replay()

    def drop_graph(self) -> None:
        self._graph = None

    def close(self) -> None:
        self._blocks.clear()
        self._graph = None


def cuda_backend():
    """cuda-python if installed, else torch.cuda, else DependencyError (exit 4)."""
    for mod in ("cuda.bindings.runtime", "cuda.cudart"):
        try:
            import importlib

            return _CudaPython(importlib.import_module(mod))
        except ImportError:
            continue
    try:
        import torch

        if torch.cuda.is_available():
            return _TorchCuda(torch)
    except ImportError:
        pass
    raise DependencyError("running a TensorRT engine needs cuda-python (pip install cuda-python) or a CUDA build "
                          "of torch, and an NVIDIA GPU")


# -- the session --------------------------------------------------------------------------------------------
class TensorRTSession(Session):
    runtime = "tensorrt"
    provider = "tensorrt"

    def __init__(self, artifact: Artifact, cuda_graphs: bool | None = None):
        trt = import_tensorrt()
        self.trt = trt
        self.logger = make_logger(trt, "ERROR")
        data = Path(artifact.path).read_bytes()
        self.trt_runtime = trt.Runtime(self.logger)
        self.engine = self.trt_runtime.deserialize_cuda_engine(data)
        if self.engine is None:
            why = self.logger.errors[-1] if self.logger.errors else "not a TensorRT engine"
            raise UsageError(f"cannot load {artifact.path} as a TensorRT engine with TensorRT {trt.__version__}: "
                             f"{why}; engines run only on the TensorRT version and GPU they were built with")
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise PassError(f"TensorRT could not create an execution context for {artifact.path} (out of GPU memory?)")
        self.cuda = cuda_backend()
        if cuda_graphs is None:
            cuda_graphs = os.environ.get("OPTKIT_TRT_CUDA_GRAPHS", "0") == "1"
        self.cuda_graphs = cuda_graphs
        if cuda_graphs:
            self.provider = "tensorrt+cuda-graph"
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        mode_in = trt.TensorIOMode.INPUT
        self._in = [n for n in names if self.engine.get_tensor_mode(n) == mode_in]
        self._out = [n for n in names if self.engine.get_tensor_mode(n) != mode_in]
        self._dtype = {n: trt_nptype(trt, self.engine.get_tensor_dtype(n)) for n in names}
        self.inputs = [self._spec(n) for n in self._in]
        self.outputs = [self._spec(n) for n in self._out]
        self.profiles = {n: [list(s) for s in self.engine.get_tensor_profile_shape(n, 0)]
                         for n in self._in if any(d < 0 for d in self.engine.get_tensor_shape(n))}
        self._ptr: dict[str, int] = {}
        self._host: dict[str, np.ndarray] = {}
        self._bound: tuple | None = None
        self._runs_since_bind = 0

    def _spec(self, name: str) -> TensorSpec:
        shape = [d if d >= 0 else None for d in self.engine.get_tensor_shape(name)]
        return TensorSpec(name, shape, self._dtype[name].name)

    def _bind(self, feeds: dict[str, np.ndarray]) -> None:
        self.cuda.sync()
        self.cuda.drop_graph()
        for ptr in self._ptr.values():
            self.cuda.free(ptr)
        self._ptr.clear()
        for name in self._in:
            shape = tuple(feeds[name].shape)
            if not self.context.set_input_shape(name, shape):
                rng = self.profiles.get(name)
                raise UsageError(f"input {name!r} shape {list(shape)} is outside the engine's optimization profile"
                                 + (f" (min {rng[0]}, max {rng[2]})" if rng else f" ({self.inputs[0].shape})"))
            self._ptr[name] = self.cuda.malloc(int(np.prod(shape)) * self._dtype[name].itemsize)
            self.context.set_tensor_address(name, self._ptr[name])
        for name in self._out:
            shape = tuple(self.context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise PassError(f"output {name!r} has a data-dependent shape; optkit's TensorRT runtime needs output "
                                "shapes known from the input shapes")
            self._host[name] = np.empty(shape, dtype=self._dtype[name])
            self._ptr[name] = self.cuda.malloc(self._host[name].nbytes)
            self.context.set_tensor_address(name, self._ptr[name])
        self._bound = tuple((n, feeds[n].shape) for n in self._in)
        self._runs_since_bind = 0

    def _enqueue(self, handle: int) -> None:
        if not self.context.execute_async_v3(handle):
            raise PassError("TensorRT failed to execute the engine" +
                            (f": {self.logger.errors[-1]}" if self.logger.errors else ""))

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self._bound != tuple((n, feeds[n].shape) for n in self._in if n in feeds):
            self.check_feeds(feeds)
            self._bind(feeds)
        for name in self._in:
            arr = np.ascontiguousarray(feeds[name], dtype=self._dtype[name])
            self.cuda.upload(self._ptr[name], arr)
        if self.cuda_graphs and self._runs_since_bind >= 1:
            if self._runs_since_bind == 1:  # one plain run first: TensorRT sets up shape-dependent state
                self.cuda.capture(self._enqueue)
            self.cuda.replay()
        else:
            self._enqueue(self.cuda.handle)
        self._runs_since_bind += 1
        for name in self._out:
            self.cuda.download(self._host[name], self._ptr[name])
        self.cuda.sync()
        return [self._host[n].copy() for n in self._out]

    def timer(self):
        """Device time of one run on the engine's stream (copies in, execution, copies out), by CUDA events."""
        return self.cuda.event_timer()

    def describe(self) -> dict[str, Any]:
        return {"tensorrt": self.trt.__version__, "cuda": self.cuda.name, "cuda_graphs": self.cuda_graphs,
                "profiles": self.profiles}

    def close(self) -> None:
        try:
            self.cuda.sync()
            for ptr in self._ptr.values():
                self.cuda.free(ptr)
            self._ptr.clear()
            self.cuda.close()
        except Exception:  # noqa: BLE001 - closing must not hide the real error
            pass
