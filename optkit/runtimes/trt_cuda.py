"""CUDA for the TensorRT runtime: memory (device and pinned host), streams, events and graphs through cuda-python
(`cuda.bindings.runtime`, or the older `cuda.cudart`) or, where that is missing, torch.cuda (`cuda_backend`); and
the IOutputAllocator that gives outputs whose shape depends on the data their memory. Imported when a TensorRT
session opens, never by `optkit --help`: cuda-python and torch are imported inside `cuda_backend`."""
from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

from optkit.core.errors import DependencyError, PassError


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

    def host_alloc(self, nbytes: int) -> tuple[int, np.ndarray]:
        """Pinned (page-locked) host memory: its address and a uint8 numpy view of it."""
        ptr = int(self._ok(self.rt.cudaMallocHost(max(nbytes, 1))))
        return ptr, np.frombuffer((ctypes.c_ubyte * max(nbytes, 1)).from_address(ptr), np.uint8)[:nbytes]

    def host_free(self, ptr: int) -> None:
        self.rt.cudaFreeHost(ptr)

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
        try:
            self._graph_exec = self._ok(self.rt.cudaGraphInstantiate(graph, 0))
        finally:
            self.rt.cudaGraphDestroy(graph)

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

    def host_alloc(self, nbytes: int) -> tuple[int, np.ndarray]:
        t = self.torch.empty(max(nbytes, 1), dtype=self.torch.uint8, pin_memory=True)
        self._blocks[t.data_ptr()] = t
        return t.data_ptr(), t.numpy()[:nbytes]

    def host_free(self, ptr: int) -> None:
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


# -- data-dependent output shapes -------------------------------------------------------------------------
def make_output_allocator(trt, cuda):
    """A trt.IOutputAllocator that gives TensorRT device memory for outputs whose shape depends on the data, and
    keeps the shape it is told (the way Polygraphy's TrtRunner runs such engines)."""

    class _OutputAllocator(trt.IOutputAllocator):
        def __init__(self):
            trt.IOutputAllocator.__init__(self)
            self.ptrs: dict[str, int] = {}
            self.sizes: dict[str, int] = {}
            self.shapes: dict[str, tuple] = {}

        def reallocate_output(self, tensor_name, memory, size, alignment):  # noqa: ARG002 - TensorRT's callback
            if self.sizes.get(tensor_name, -1) < size:
                if tensor_name in self.ptrs:
                    cuda.free(self.ptrs[tensor_name])
                self.ptrs[tensor_name] = cuda.malloc(max(int(size), 1))
                self.sizes[tensor_name] = int(size)
            return self.ptrs[tensor_name]

        def reallocate_output_async(self, tensor_name, memory, size, alignment, stream):  # noqa: ARG002
            return self.reallocate_output(tensor_name, memory, size, alignment)

        def notify_shape(self, tensor_name, shape):
            self.shapes[tensor_name] = tuple(shape)

        def release(self) -> None:
            for ptr in self.ptrs.values():
                cuda.free(ptr)
            self.ptrs.clear()
            self.sizes.clear()

    return _OutputAllocator()
