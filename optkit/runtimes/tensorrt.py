"""TensorRT engines (TensorRT 10.x and 11.x): load a serialized engine, run it on the GPU, time it with CUDA events.

CUDA memory, streams, events and graphs go through cuda-python (`cuda.bindings.runtime`, or the older
`cuda.cudart`) and, where that is missing, through torch.cuda. Host buffers are pinned (page-locked), as in
NVIDIA's samples, so copies are DMA transfers without a staging copy. Shape-tensor inputs
(`engine.is_shape_inference_io`) and host-located tensors are bound to host memory, as TensorRT requires;
outputs whose shape depends on the data get an IOutputAllocator (as Polygraphy's TrtRunner does).

Set OPTKIT_TRT_CUDA_GRAPHS=1 (or pass `cuda_graphs=True`) to replay execution from a CUDA graph; the first replay
after each (re)binding is compared with a plain run, and the session's provider reads "tensorrt+cuda-graph" so
reports say how the figure was made. Engines with data-dependent output shapes run without a graph.

Nothing here is imported by `optkit --help`: tensorrt and CUDA are imported when a session opens.
"""
from __future__ import annotations

import ctypes
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from optkit.core.artifact import Artifact
from optkit.core.errors import DependencyError, PassError, UsageError
from optkit.core.shapes import TensorSpec
from optkit.core.text import first_line
from optkit.runtimes.base import Session
from optkit.runtimes.trt_cuda import cuda_backend, make_output_allocator

log = logging.getLogger(__name__)

TRT_INSTALL = "pip install 'optkit[trt]' (tensorrt and cuda-python; needs an NVIDIA GPU and driver)"
TRT_ORT_INSTALL = ("pip install 'optkit[trt-ort]', then pip uninstall -y onnxruntime onnxruntime-gpu && "
                   "pip install 'onnxruntime-gpu[cuda,cudnn]~=1.31.1' (the CPU onnxruntime shares its files; README: TensorRT)")


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


def ort_tensorrt_status() -> dict[str, Any]:
    """Whether the installed onnxruntime can run models on TensorRT (and CUDA), without opening a session or
    initialising CUDA: the providers it was built with (get_available_providers), then whether its TensorRT
    provider library loads (it needs the libnvinfer of the TensorRT major onnxruntime-gpu was built against)."""
    import onnxruntime as ort

    providers = list(ort.get_available_providers())
    out: dict[str, Any] = {"version": ort.__version__, "providers": providers,
                           "cuda": "CUDAExecutionProvider" in providers, "tensorrt": False}
    if "TensorrtExecutionProvider" not in providers:
        out["why"] = f"onnxruntime {ort.__version__} has no TensorRT provider (the CPU build): {TRT_ORT_INSTALL}"
        return out
    libs = sorted(Path(ort.__file__).parent.glob("capi/*onnxruntime_providers_tensorrt*"))
    if not libs:
        out["why"] = "onnxruntime lists the TensorRT provider but its library is missing: reinstall onnxruntime-gpu"
        return out
    try:
        ctypes.CDLL(str(libs[0]))
    except OSError as e:
        out["why"] = (f"onnxruntime's TensorRT provider cannot load ({first_line(e)}); put the CUDA, cuDNN and "
                      "TensorRT libraries it links (onnxruntime-gpu 1.31: CUDA 13, cuDNN 9, libnvinfer.so.10) on the "
                      "library path (LD_LIBRARY_PATH)")
        return out
    out["tensorrt"] = True
    return out


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


def load_plugins(trt, logger) -> None:
    """Register TensorRT's standard plugins (EfficientNMS_TRT, ROIAlign_TRT, ...) as trtexec and Polygraphy do, so
    the parser can import plugin ops and engines that hold them deserialize."""
    init = getattr(trt, "init_libnvinfer_plugins", None)
    if init is not None:
        init(logger, "")


def trt_nptype(trt, dtype) -> np.dtype:
    try:
        return np.dtype(trt.nptype(dtype))
    except TypeError:
        raise UsageError(f"the engine has a {dtype} input or output, which numpy cannot hold (e.g. bfloat16 I/O); "
                         "build it with float32/float16 inputs and outputs") from None



def profile_shape(dims, profile: list[list[int]] | None) -> list[int | None]:
    """An engine tensor's shape as optkit's inputs see it: a dynamic dim (-1) is None, unless the optimization
    profile fixes it (MIN == MAX), in which case it reads as that size, so data is fed in batches the engine takes."""
    lo, _, hi = profile or [list(dims)] * 3
    return [int(d) if d >= 0 else (int(lo[i]) if lo[i] == hi[i] else None) for i, d in enumerate(dims)]


def graph_mismatch(plain: list[np.ndarray], replayed: list[np.ndarray], names: list[str]) -> str | None:
    """Why a CUDA-graph replay's outputs differ from a plain run's on the same inputs, or None when they agree."""
    for name, a, b in zip(names, plain, replayed):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a64.shape != b64.shape:
            return f"output {name!r} has shape {list(b64.shape)} replayed but {list(a64.shape)} in a plain run"
        if not a64.size:
            continue
        scale = max(float(np.nanmax(np.abs(a64))), 1e-6)
        worst = float(np.nanmax(np.abs(a64 - b64)))
        if np.isnan(a64).sum() != np.isnan(b64).sum() or worst / scale > 1e-3:
            return f"output {name!r} differs by {worst:.3g} ({worst / scale:.1%} of its largest value)"
    return None


# -- the session --------------------------------------------------------------------------------------------
class TensorRTSession(Session):
    runtime = "tensorrt"
    provider = "tensorrt"
    takes_provider = True  # the engine runs where it was built, whatever provider a recipe names

    @classmethod
    def open(cls, artifact: Artifact, **_) -> TensorRTSession:
        return cls(artifact)

    @classmethod
    def warm(cls, fmt=None) -> None:
        import_tensorrt()

    def __init__(self, artifact: Artifact, cuda_graphs: bool | None = None):
        trt = import_tensorrt()
        self.trt = trt
        self.logger = make_logger(trt, "ERROR")
        load_plugins(trt, self.logger)
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
        self.graph_note: str | None = None
        if cuda_graphs:
            self.provider = "tensorrt+cuda-graph"
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        mode_in = trt.TensorIOMode.INPUT
        self._in = [n for n in names if self.engine.get_tensor_mode(n) == mode_in]
        self._out = [n for n in names if self.engine.get_tensor_mode(n) != mode_in]
        self._dtype = {n: trt_nptype(trt, self.engine.get_tensor_dtype(n)) for n in names}
        self._on_host = {n for n in names if self._host_bound(n)}
        self.profiles = {n: [list(s) for s in self.engine.get_tensor_profile_shape(n, 0)]
                         for n in self._in if n not in self._on_host
                         and any(d < 0 for d in self.engine.get_tensor_shape(n))}
        self.inputs = [self._spec(n) for n in self._in]
        self.outputs = [self._spec(n) for n in self._out]
        self._dev: dict[str, int] = {}
        self._pinned: dict[str, tuple[int, np.ndarray]] = {}
        self._host: dict[str, np.ndarray] = {}
        self._dds: set[str] = set()
        self._allocator = None
        self._bound: tuple | None = None
        self._runs_since_bind = 0

    def _host_bound(self, name: str) -> bool:
        """Shape-tensor inputs and tensors TensorRT keeps on the host are bound to host memory."""
        if self.engine.get_tensor_mode(name) == self.trt.TensorIOMode.INPUT and self.engine.is_shape_inference_io(name):
            return True
        return self.engine.get_tensor_location(name) == self.trt.TensorLocation.HOST

    def _spec(self, name: str) -> TensorSpec:
        return TensorSpec(name, profile_shape(self.engine.get_tensor_shape(name), self.profiles.get(name)),
                          self._dtype[name].name)

    # -- buffers ----------------------------------------------------------------------------------------------
    def _pinned_array(self, name: str, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """A pinned host array for `name`, reusing its buffer when it is large enough."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        ptr, buf = self._pinned.get(name, (None, None))
        if buf is None or buf.nbytes < nbytes:
            if ptr is not None:
                self.cuda.host_free(ptr)
            self._pinned[name] = self.cuda.host_alloc(nbytes)
            buf = self._pinned[name][1]
        return buf[:nbytes].view(dtype).reshape(shape)

    def _free_device(self) -> None:
        for ptr in self._dev.values():
            self.cuda.free(ptr)
        self._dev.clear()

    def _key(self, feeds: dict[str, np.ndarray]) -> tuple:
        """What a binding depends on: input shapes, and the values of host-bound (shape-tensor) inputs."""
        return tuple((n, np.shape(feeds[n]), np.asarray(feeds[n]).tobytes() if n in self._on_host else None)
                     for n in self._in if n in feeds)

    def _bind(self, feeds: dict[str, np.ndarray]) -> None:
        self.cuda.sync()
        self.cuda.drop_graph()
        self._free_device()
        for name in self._in:
            self._bind_input(name, np.asarray(feeds[name]))
        self._dds = set()
        for name in self._out:
            self._bind_output(name)
        self._bound = self._key(feeds)
        self._runs_since_bind = 0

    def _bind_input(self, name: str, arr: np.ndarray) -> None:
        shape = tuple(arr.shape)
        if not self.context.set_input_shape(name, shape):
            rng = self.profiles.get(name)
            raise UsageError(f"input {name!r} shape {list(shape)} is outside the engine's optimization profile"
                             + (f" (min {rng[0]}, max {rng[2]})" if rng else f" ({self._spec(name).shape})")
                             + "; build the engine with a profile that covers it (--shape NAME=MIN:OPT:MAX)")
        host = self._pinned_array(name, shape, self._dtype[name])
        if name in self._on_host:  # TensorRT reads shape-tensor values from host memory
            self._check_values(name, arr)
            np.copyto(host, arr, casting="unsafe")
            self.context.set_tensor_address(name, host.ctypes.data)
        else:
            self._dev[name] = self.cuda.malloc(host.nbytes)
            self.context.set_tensor_address(name, self._dev[name])
        self._host[name] = host

    def _check_values(self, name: str, arr: np.ndarray) -> None:
        if not self.engine.is_shape_inference_io(name):
            return
        lo, _, hi = (list(v) for v in self.engine.get_tensor_profile_values(name, 0))
        flat = [int(v) for v in arr.ravel()]
        if len(lo) == len(flat) and any(not a <= v <= b for a, v, b in zip(lo, flat, hi)):
            raise UsageError(f"shape-tensor input {name!r} values {flat} are outside the engine's profile "
                             f"(min {lo}, max {hi})")

    def _bind_output(self, name: str) -> None:
        shape = tuple(self.context.get_tensor_shape(name))
        if any(d < 0 for d in shape):  # known only after the run: TensorRT asks the allocator for memory
            if self._allocator is None:
                self._allocator = make_output_allocator(self.trt, self.cuda)
            self.context.set_output_allocator(name, self._allocator)
            self._dds.add(name)
            return
        host = self._pinned_array(name, shape, self._dtype[name])
        if name in self._on_host:
            self.context.set_tensor_address(name, host.ctypes.data)
        else:
            self._dev[name] = self.cuda.malloc(host.nbytes)
            self.context.set_tensor_address(name, self._dev[name])
        self._host[name] = host

    # -- running ----------------------------------------------------------------------------------------------
    def _enqueue(self, handle: int) -> None:
        if not self.context.execute_async_v3(handle):
            raise PassError("TensorRT failed to execute the engine" +
                            (f": {self.logger.errors[-1]}" if self.logger.errors else ""))

    def _fetch(self) -> list[np.ndarray]:
        """Copy the outputs to their pinned host arrays, wait, and return copies."""
        for name in self._out:
            if name not in self._dds and name not in self._on_host:
                self.cuda.download(self._host[name], self._dev[name])
        self.cuda.sync()
        for name in self._dds:
            shape = self._allocator.shapes[name]
            self._host[name] = self._pinned_array(name, shape, self._dtype[name])
            if self._host[name].nbytes:
                self.cuda.download(self._host[name], self._allocator.ptrs[name])
        if self._dds:
            self.cuda.sync()
        return [self._host[n].copy() for n in self._out]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self._bound != self._key(feeds):
            self.check_feeds(feeds)
            self._bind(feeds)
        for name in self._in:
            if name not in self._on_host:
                np.copyto(self._host[name], feeds[name], casting="unsafe")
                self.cuda.upload(self._dev[name], self._host[name])
        graphs = self.cuda_graphs and not self._dds
        self._runs_since_bind += 1
        if graphs and self._runs_since_bind == 2:  # TensorRT sets up shape-dependent state in the first plain run
            return self._capture_and_check()
        if graphs and self._runs_since_bind > 2:
            self.cuda.replay()
        else:
            self._enqueue(self.cuda.handle)
        return self._fetch()

    def _capture_and_check(self) -> list[np.ndarray]:
        """Capture a CUDA graph, replay it once and compare with a plain run on the same inputs: PassError (exit 3)
        when they differ; a capture TensorRT or CUDA refuses falls back to plain runs, said in describe()."""
        self._enqueue(self.cuda.handle)
        plain = self._fetch()
        try:
            self.cuda.capture(self._enqueue)
        except Exception as e:  # noqa: BLE001 - e.g. an engine with operations CUDA cannot capture
            self.cuda_graphs, self.provider = False, "tensorrt"
            self.graph_note = f"CUDA graph capture failed ({first_line(e)}); timed plain runs instead"
            log.warning("%s", self.graph_note)
            return plain
        self.cuda.replay()
        replayed = self._fetch()
        why = graph_mismatch(plain, replayed, self._out)
        if why:
            raise PassError(f"the CUDA graph replay does not match a plain run of the engine: {why}; time it "
                            "without --cuda-graphs (OPTKIT_TRT_CUDA_GRAPHS=0)")
        return replayed

    def timer(self):
        """Device time of one run on the engine's stream (copies in, execution, copies out), by CUDA events."""
        return self.cuda.event_timer()

    def describe(self) -> dict[str, Any]:
        out = {"tensorrt": self.trt.__version__, "cuda": self.cuda.name, "cuda_graphs": self.cuda_graphs,
               "profiles": self.profiles, "host_inputs": sorted(n for n in self._on_host if n in self._in),
               "data_dependent_outputs": sorted(self._dds), "pinned_host_buffers": True}
        if self.graph_note:
            out["cuda_graph_note"] = self.graph_note
        return out

    def close(self) -> None:
        try:
            self.cuda.sync()
            self.cuda.drop_graph()
            self._free_device()
            if self._allocator is not None:
                self._allocator.release()
            for ptr, _ in self._pinned.values():
                self.cuda.host_free(ptr)
            self._pinned.clear()
            self.cuda.close()
        except Exception:  # noqa: BLE001 - closing must not hide the real error
            pass
