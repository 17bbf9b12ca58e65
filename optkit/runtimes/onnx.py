"""onnxruntime: CPU, and the CUDA / TensorRT providers where onnxruntime-gpu is installed."""
from __future__ import annotations

import functools
import logging
import os

from optkit.core.artifact import Artifact
from optkit.core.cachedir import cache_dir, private_folder, trusted
from optkit.core.errors import DependencyError, UsageError
from optkit.onnx.session import (
    OrtSettings,
    check_feedable,
    session,
    spec_of,
    warm_onnxruntime,
    with_hints,
)
from optkit.runtimes.base import Session

log = logging.getLogger(__name__)

PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}


def provider_list(provider: str) -> list:
    """The providers to ask onnxruntime for; TensorRT keeps its engines and timing cache between sessions in a
    folder of the user's own (core.cachedir), used only while every file in it is the user's own and private (an
    engine is code the GPU runs): else engines are built for this session alone, said at -v."""
    names = PROVIDERS[provider]
    if provider != "tensorrt":
        return list(names)
    try:
        cache = private_folder(cache_dir() / "ort-tensorrt")
        entries = list(os.scandir(cache))
    except OSError as e:  # no per-user cache folder, or one not ours or not writable: engines built each session
        log.info("onnxruntime's TensorRT engine cache not used (%s)", e)
        return list(names)
    if not all(trusted(e.path, "onnxruntime TensorRT cache file", e.stat(follow_symlinks=False)) for e in entries):
        log.info("onnxruntime's TensorRT engine cache %s not used: a file in it is not yours alone", cache)
        return list(names)
    cache = str(cache)
    options = {"trt_engine_cache_enable": True, "trt_engine_cache_path": cache,
               "trt_timing_cache_enable": True, "trt_timing_cache_path": cache}
    return [(names[0], options), *names[1:]]


class OnnxSession(Session):
    runtime = "onnxruntime"
    takes_provider = True
    takes_ort_settings = True

    @classmethod
    def open(cls, artifact: Artifact, *, provider: str = "cpu", threads: int | None = None,
             ort_settings: OrtSettings | None = None) -> OnnxSession:
        return cls(artifact, provider=provider, threads=threads, ort_settings=ort_settings)

    @classmethod
    def warm(cls, fmt=None) -> None:
        warm_onnxruntime()

    def __init__(self, artifact: Artifact, provider: str = "cpu", threads: int | None = None,
                 ort_settings: OrtSettings | None = None):
        import onnxruntime as ort

        if provider == "auto":
            provider = "cuda" if "CUDAExecutionProvider" in ort.get_available_providers() else "cpu"
        if provider not in PROVIDERS:
            raise UsageError(f"unknown provider {provider!r}; choose one of {', '.join(PROVIDERS)}")
        wanted = PROVIDERS[provider][0]
        if wanted not in ort.get_available_providers():
            raise DependencyError(
                f"onnxruntime here has no {wanted}; install onnxruntime-gpu (and TensorRT for 'tensorrt') "
                "on a machine with an NVIDIA GPU"
            )
        self.sess = session(artifact.path, threads, ort_settings=ort_settings, providers=provider_list(provider))
        active = self.sess.get_providers()
        if active and active[0] != wanted:  # onnxruntime falls back quietly when CUDA/cuDNN/TensorRT fail to load
            raise DependencyError(
                f"onnxruntime could not start {wanted} (it fell back to {active[0]}); install the CUDA, cuDNN"
                + (" and TensorRT" if provider == "tensorrt" else "") + " libraries onnxruntime-gpu needs"
            )
        self.provider = provider
        self.threads = threads
        self.ort_settings = ort_settings
        self.inputs = with_hints([spec_of(i) for i in self.sess.get_inputs()], artifact.path)
        self.outputs = [spec_of(o) for o in self.sess.get_outputs()]
        self._names = [o.name for o in self.outputs]

        # bound straight to onnxruntime so timing loops add no Python frame of ours
        self.run = functools.partial(self.sess.run, self._names)

    def describe(self) -> dict:
        import onnxruntime as ort

        extra = self.ort_settings.model_dump(exclude_none=True) if self.ort_settings is not None else {}
        return {"name": "onnxruntime", "version": ort.__version__,
                "settings": {"provider": self.provider, "threads": self.threads or "default", **extra}}

    def check_feeds(self, feeds) -> None:
        check_feedable(self.inputs)
        super().check_feeds(feeds)
