"""Triton's OpenVINO backend (`package --to triton --backend openvino`, a tune that picked OpenVINO, or a model
that is OpenVINO IR already): the version holds the model as OpenVINO IR (model.xml + model.bin), converted before
anything is written (an IR is copied as it is), and its config carries the settings optkit measures OpenVINO with
(runtimes/openvino.py) as the backend's parameters."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from optkit.core.errors import DependencyError, UsageError
from optkit.core.formats import Format, ir_weights
from optkit.package.signature import DTYPES, Signature, Tensor
from optkit.package.target import Job
from optkit.package.tuned import Tuned
from optkit.runtimes.openvino import compile_settings, import_openvino, said, save_ir

# numpy dtype name -> ONNX elem_type (the signature's), for an IR's ports
ELEM_TYPES = {numpy: elem for elem, (_, numpy) in DTYPES.items()}

IR_FILE = "model.xml"   # the OpenVINO backend's model (model.bin beside it)
# the tensor types Triton's OpenVINO backend maps to OpenVINO's (its ModelConfigDataTypeToOpenVINOElement): no
# TYPE_STRING, TYPE_FP64 nor TYPE_BF16
SERVED_TYPES = {"TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64", "TYPE_INT8", "TYPE_INT16",
                "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32"}
IR_FILES = (IR_FILE, "model.bin")


def backend_rows(tuned: Tuned, backend: str, given: str | None, ir: bool, mapping: list[dict],
                 notes: list[str]) -> None:
    """Which runtime serves one model, and why: the model's format (an IR), the tuned runtime, or --backend
    (`given`) over another (said, with what does not carry over)."""
    picked = tuned.get("runtime") or "onnxruntime"
    if ir and given is None:  # an IR is OpenVINO's whatever a tune says (onnxruntime cannot run one)
        mapping.append({"setting": "model format", "value": Format.OPENVINO_IR.value, "field": "backend",
                        "written": backend})
        return
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


def check(gpu: bool | None, asked: str = "--backend openvino", onnx: str = "give --backend onnxruntime") -> None:
    """What the OpenVINO backend cannot do (exit 2), and OpenVINO missing (exit 4); `onnx`: how to serve on
    onnxruntime instead."""
    if gpu:
        raise UsageError(f"{asked} serves on the CPU: drop --gpu, or {onnx} for a GPU instance")
    import_openvino(asked, "--backend onnxruntime")


def is_ir(job: Job) -> bool:
    return job.artifact is not None and job.artifact.format == Format.OPENVINO_IR


def signature_of_ir(path: str) -> Signature:
    """An IR's served signature from its ports, as read_signature reads an ONNX graph's (exit 2 for one a server
    cannot take; OpenVINO missing: exit 4)."""
    ov = import_openvino("packaging an OpenVINO IR", "the ONNX model it was converted from")
    try:
        model = ov.Core().read_model(path)
    except Exception as e:  # noqa: BLE001 - OpenVINO's frontends raise their own types
        raise UsageError(f"OpenVINO cannot read {path}: {said(e)[:200]}") from None

    def tensor(port, role: str) -> Tensor:
        name = port.get_any_name()
        dtype = port.get_element_type().to_dtype().name
        ps = port.get_partial_shape()
        if dtype not in ELEM_TYPES or ps.rank.is_dynamic:
            raise UsageError(f"{path}: {role} {name!r} is {dtype if dtype not in ELEM_TYPES else 'of unknown rank'}, "
                             "which Triton cannot serve; give the ONNX model it was converted from")
        dims = [d.get_length() if d.is_static else -1 for d in ps]
        return Tensor(name, ELEM_TYPES[dtype], dims, [None] * len(dims))

    inputs = [tensor(p, "input") for p in model.inputs]
    outputs = [tensor(p, "output") for p in model.outputs]
    return Signature(inputs, outputs, all(t.dims and t.dims[0] == -1 for t in inputs + outputs))


def ir_of(job: Job) -> list[Path]:
    """The model (with its scalars lifted, where the target lifted them) as IR in a temporary folder the package
    removes on every exit path: [model.xml, model.bin]. What cannot be served this way is exit 2, OpenVINO
    missing exit 4, a model OpenVINO cannot convert exit 3: all before the repository is touched."""
    asked = "--backend openvino" if job.options.backend == "openvino" else \
        f"{job.model}, an OpenVINO IR," if is_ir(job) else f"the tuned runtime openvino (--tuned {job.tuned.source})"
    provider = job.tuned.get("provider") or "cpu"
    if provider != "cpu":  # a tune on a GPU provider (or a best.json edited to say so) would be served on KIND_GPU
        raise UsageError(f"{asked} serves on the CPU, but --tuned {job.tuned.source} measured provider {provider}: "
                         "give --backend onnxruntime, or tune the model on the CPU")
    try:
        check(job.options.gpu, asked, "package the ONNX model it was converted from" if is_ir(job) and
              not job.options.backend else "give --backend onnxruntime")
    except DependencyError as e:
        tail = "; or give --backend onnxruntime" if not job.options.backend and "pip install" in e.message else ""
        raise DependencyError(e.message + tail) from None
    if job.externals:
        raise UsageError(f"{asked}: {job.model} keeps its weights in external data files; save it with its weights "
                         "inside, or give --backend onnxruntime")
    odd = [t for t in job.sig.inputs + job.sig.outputs if t.triton_type not in SERVED_TYPES]
    if odd:  # the model would not load on Triton's OpenVINO backend
        raise UsageError(f"{asked}: {odd[0].name!r} of {job.model} is {odd[0].triton_type}, which Triton's OpenVINO "
                         "backend cannot serve (it takes bool, integer, FP16 and FP32 tensors); give --backend "
                         "onnxruntime")
    if is_ir(job):  # served as it is
        return [Path(job.model), ir_weights(job.model)]
    tmp = Path(tempfile.mkdtemp(prefix="optkit-ir-"))
    job.temporaries.append(tmp)
    src = Path(job.model)
    if job.state.get("lifted") is not None:
        import onnx

        src = tmp / "lifted.onnx"
        onnx.save(job.state["lifted"], str(src))
    save_ir(src, tmp / IR_FILE, shown=job.model)
    return [tmp / IR_FILE, (tmp / IR_FILE).with_suffix(".bin")]
