"""Triton's OpenVINO backend (`package --to triton --backend openvino`, or a tune that picked OpenVINO): the version
holds the model as OpenVINO IR (model.xml + model.bin), converted before anything is written, and its config
carries the settings optkit measures OpenVINO with (runtimes/openvino.py) as the backend's parameters."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from optkit.core.errors import DependencyError, UsageError
from optkit.package.target import Job
from optkit.package.tuned import Tuned
from optkit.runtimes.openvino import compile_settings, import_openvino, save_ir

IR_FILE = "model.xml"   # the OpenVINO backend's model (model.bin beside it)


def backend_rows(tuned: Tuned, backend: str, given: str | None, mapping: list[dict], notes: list[str]) -> None:
    """Which runtime serves one model, and why: the tuned one, or --backend (`given`) over another (said, with what
    does not carry over)."""
    picked = tuned.get("runtime") or "onnxruntime"
    if given is None or given == picked:
        if backend == "openvino":
            mapping.append({"setting": "runtime", "value": picked, "field": "backend", "written": backend})
        return
    mapping.append({"setting": "--backend", "value": given, "field": "backend", "written": backend})
    if tuned.source is None:
        return
    carried = ("its onnxruntime session settings do not apply: OpenVINO runs with optkit's settings (LATENCY hint, "
               "one stream, f32) and the tuned threads, batch and concurrency" if backend == "openvino" else
               "onnxruntime runs with the tuned threads, batch and concurrency and its own session defaults")
    notes.append(f"--backend {backend}, though --tuned {tuned.source} picked {picked}: its figures were measured on "
                 f"{picked}, not on {backend}; {carried}")


def parameters(tuned: Tuned, mapped) -> dict[str, Any]:
    """The backend's parameters: the OpenVINO CPU properties optkit measures with, the tuned threads among them."""
    threads = tuned.get("threads")
    if threads:
        mapped("threads", threads, "parameters.INFERENCE_NUM_THREADS", str(int(threads)))
    return {k: {"string_value": v} for k, v in compile_settings(int(threads) if threads else None).items()}


def check(gpu: bool | None, asked: str = "--backend openvino") -> None:
    """What the OpenVINO backend cannot do (exit 2), and OpenVINO missing (exit 4)."""
    if gpu:
        raise UsageError(f"{asked} serves on the CPU: drop --gpu, or give --backend onnxruntime for a GPU instance")
    import_openvino(asked, "--backend onnxruntime")


def ir_of(job: Job) -> list[Path]:
    """The model (with its scalars lifted, where the target lifted them) as IR in a temporary folder the package
    removes on every exit path: [model.xml, model.bin]. What cannot be served this way is exit 2, OpenVINO
    missing exit 4, a model OpenVINO cannot convert exit 3: all before the repository is touched."""
    asked = "--backend openvino" if job.options.backend == "openvino" else \
        f"the tuned runtime openvino (--tuned {job.tuned.source})"
    try:
        check(job.options.gpu, asked)
    except DependencyError as e:
        tail = "; or give --backend onnxruntime" if not job.options.backend and "pip install" in e.message else ""
        raise DependencyError(e.message + tail) from None
    if job.externals:
        raise UsageError(f"{asked}: {job.model} keeps its weights in external data files; save it with its weights "
                         "inside, or give --backend onnxruntime")
    tmp = Path(tempfile.mkdtemp(prefix="optkit-ir-"))
    job.temporaries.append(tmp)
    src = Path(job.model)
    if job.state.get("lifted") is not None:
        import onnx

        src = tmp / "lifted.onnx"
        onnx.save(job.state["lifted"], str(src))
    save_ir(src, tmp / IR_FILE, shown=job.model)
    return [tmp / IR_FILE, (tmp / IR_FILE).with_suffix(".bin")]
