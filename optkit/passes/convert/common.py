"""What convert.torch and convert.tf share: opset choice, validation inputs, the tolerance check."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from optkit.core.batching import call_as_samples, count
from optkit.core.errors import PassError, UsageError, ValidationError
from optkit.core.registry import PassConfig, PassContext, cli
from optkit.core.shapes import TensorSpec
from optkit.core.text import first_line
from optkit.measure.datasets import Dataset
from optkit.measure.fidelity import compare_outputs
from optkit.measure.inputs import synthesize
from optkit.onnx.graph import all_nodes

# int8 outputs (dequantized): how many quantization steps ONNX may differ by, where runtimes round differently.
STEP_TOLERANCE = 2

# Default tolerances (atol, rtol) per output dtype: an element fails when |onnx - source| > atol + rtol * |source|.
# Quantized outputs may move by one step where the runtimes round differently.
DEFAULT_TOLERANCE = {
    "float64": (1e-6, 1e-5),
    "float32": (1e-4, 1e-3),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
    "int8": (1, 0.0),
    "uint8": (1, 0.0),
    "int16": (1, 0.0),
}


class ConvertConfig(PassConfig):
    opset: int | None = Field(default=None, ge=7, description="ONNX opset (default: the newest the exporter "
                                                               "and onnxruntime both support).",
                              json_schema_extra=cli("--opset"))
    atol: float | None = Field(default=None, ge=0, description="Absolute tolerance (default per dtype).",
                               json_schema_extra=cli("--atol", group="budgets"))
    rtol: float | None = Field(default=None, ge=0, description="Relative tolerance (default per dtype).",
                               json_schema_extra=cli("--rtol", group="budgets"))
    samples: int = Field(default=64, ge=1, description="Validation samples taken from the data.",
                         json_schema_extra=cli("--samples", group="evaluation"))
    batch: int = Field(default=2, ge=1, description="batch of synthesized validation inputs",
                       json_schema_extra=cli(recipe_only="validation detail: the batch of synthesized inputs "
                                                         "(--data feeds real ones)"))
    static_batch: bool = Field(default=False, description="Keep the batch axis (the first) fixed; by default it "
                                                          "is dynamic, as exporters such as Optimum make it.",
                               json_schema_extra=cli("--static-batch"))
    external_data: Literal["auto", "always", "never"] = Field(
        default="auto", description="ONNX external data: auto (only over 2 GB), always or never.",
        json_schema_extra=cli("--external-data"))


_ORT_MAX: int | None = None


def ort_max_opset() -> int:
    """The newest default-domain opset this onnxruntime loads (probed with a one-node model)."""
    global _ORT_MAX
    if _ORT_MAX is not None:
        return _ORT_MAX
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    for opset in range(onnx.defs.onnx_opset_version(), 6, -1):
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = min(model.ir_version, 10)
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001 - any failure means "not this opset"
            continue
        _ORT_MAX = opset
        return opset
    _ORT_MAX = 13
    return _ORT_MAX


def choose_opset(requested: int | None, exporter_max: int, exporter: str) -> int:
    newest = min(exporter_max, ort_max_opset())
    if requested is None:
        return newest
    if requested > exporter_max:
        raise UsageError(f"opset (--opset) {requested} is newer than {exporter} supports (up to {exporter_max})")
    if requested > ort_max_opset():
        raise UsageError(f"opset (--opset) {requested} is newer than this onnxruntime loads (up to {ort_max_opset()})")
    return requested


def tolerance(dtype: str, atol: float | None, rtol: float | None) -> tuple[float, float]:
    d_atol, d_rtol = DEFAULT_TOLERANCE.get(dtype, (0.0, 0.0))
    return (d_atol if atol is None else atol), (d_rtol if rtol is None else rtol)


def validation_feeds(ctx: PassContext, specs: list, config: ConvertConfig,
                     quantize: dict | None = None) -> tuple[dict[str, np.ndarray], np.ndarray | None, str]:
    """Inputs for validation: sample data when given (a deterministic subset), else synthesized ones.

    `quantize` maps an integer input's name to (scale, zero_point): float data is quantized for it.
    """
    data = ctx.data.get("eval") or ctx.data.get("calibration")
    if data is not None:
        ds = data.subset(config.samples, ctx.seed)
        if len(ds.arrays) == 1 and len(specs) == 1 and specs[0].name not in ds.arrays:
            ds = Dataset({"": next(iter(ds.arrays.values()))}, ds.labels, ds.source, ds.classes)
        float_specs = [TensorSpec(s.name, s.shape, "float32") if quantize and s.name in quantize else s for s in specs]
        feeds = ds.bind(float_specs)
        for name, (scale, zero) in (quantize or {}).items():
            if name in feeds and np.issubdtype(feeds[name].dtype, np.floating):
                info = np.iinfo(np.dtype(next(s.dtype for s in specs if s.name == name)))
                q = np.round(feeds[name] / scale) + zero
                feeds[name] = np.clip(q, info.min, info.max).astype(info.dtype)
        return feeds, ds.labels, f"{len(ds)} samples from {ds.source}"
    feeds = call_as_samples(specs, synthesize(specs, ctx.shapes, batch=config.batch, seed=ctx.seed,
                                              values=ctx.values))
    n = count(feeds)
    return feeds, None, f"{n} synthesized samples (seed {ctx.seed})"


def validate(ref: list[np.ndarray], out: list[np.ndarray], names: list[str], dtypes: list[str],
             config: ConvertConfig, source: str, labels: np.ndarray | None = None,
             steps: dict[str, float] | None = None) -> dict:
    """Compare ONNX outputs to the source framework's; raise ValidationError (exit 3) past tolerance.

    `steps` gives the quantization step of outputs that are dequantized int8: their default atol is
    STEP_TOLERANCE steps, and a sample whose top class stands clear of the runner-up by more than that must
    keep it (top-1 agreement).
    """
    if len(ref) != len(out):
        raise ValidationError(f"the ONNX model has {len(out)} outputs but the {source} model has {len(ref)}")
    ref = [np.asarray(r) for r in ref]
    out = [np.asarray(o).reshape(r.shape) if np.asarray(o).size == r.size else np.asarray(o)
           for r, o in zip(ref, out)]
    for name, r, o in zip(names, ref, out):
        if r.shape != o.shape:
            raise ValidationError(f"output {name!r}: the ONNX model gives shape {list(o.shape)}, "
                                  f"the {source} model {list(r.shape)}")
    finite = [(np.nan_to_num(r.astype(np.float64)), np.nan_to_num(o.astype(np.float64))) for r, o in zip(ref, out)]
    figures = compare_outputs([f[0] for f in finite], [f[1] for f in finite], names)
    per = figures["outputs"]
    for name, r, o, dtype in zip(names, ref, out, dtypes):
        atol, rtol = tolerance(dtype, config.atol, config.rtol)
        stepped = bool(steps and name in steps and config.atol is None)
        if stepped:
            atol, rtol = steps[name] * (STEP_TOLERANCE + 0.01), (0.0 if config.rtol is None else rtol)
            per[name]["steps"] = steps[name]
            _check_top1(name, r, o, atol, source, figures)
        a = r.astype(np.float64)
        b = o.astype(np.float64)
        diff = np.abs(a - b)
        nan_mismatch = np.isnan(a) != np.isnan(b)
        diff = np.where(np.isnan(a) & np.isnan(b), 0.0, np.where(nan_mismatch, np.inf, diff))
        excess = diff - (atol + rtol * np.abs(np.nan_to_num(a)))
        per[name].update({"atol": atol, "rtol": rtol, "dtype": dtype})
        if excess.size and excess.max() > 0:
            idx = np.unravel_index(int(np.argmax(excess)), a.shape)
            where = "[" + ",".join(str(int(i)) for i in idx) + "]"
            raise ValidationError(
                f"output {name!r} differs from the {source} model past tolerance: at {where} the source gives "
                f"{_num(a[idx])} and ONNX {_num(b[idx])} (|diff| {_num(diff[idx])} > atol {atol:g} + rtol {rtol:g}"
                f"*|ref|); max abs error {_num(per[name]['max_abs_error'])}, max rel error "
                f"{_num(per[name]['max_rel_error'])}; nothing written (loosen atol / rtol, --atol / --rtol, if this is expected)",
                details={"validation": figures},
            )
    if labels is not None and len(ref) >= 1 and ref[0].ndim >= 2 and len(labels) == len(ref[0]):
        figures["source_top1"] = float((ref[0].reshape(len(ref[0]), -1).argmax(-1) == labels).mean())
        figures["onnx_top1"] = float((out[0].reshape(len(out[0]), -1).argmax(-1) == labels).mean())
    return figures


def _check_top1(name: str, ref: np.ndarray, out: np.ndarray, atol: float, source: str, figures: dict) -> None:
    """Class scores (a last axis over 1) keep their top class wherever the source's is clear by over 2 atol."""
    if ref.ndim < 2 or ref.shape[-1] < 2 or ref.shape != out.shape:
        return
    r = ref.reshape(-1, ref.shape[-1]).astype(np.float64)
    o = out.reshape(-1, out.shape[-1]).astype(np.float64)
    top = np.sort(r, axis=1)
    clear = (top[:, -1] - top[:, -2]) > 2 * atol
    agree = r.argmax(1) == o.argmax(1)
    figures["outputs"][name]["top1_agreement"] = float(agree.mean())
    flipped = int(np.count_nonzero(clear & ~agree))
    if flipped:
        raise ValidationError(f"output {name!r}: {flipped} of {len(r)} samples change their top class although "
                              f"the {source} model's is clear by over {2 * atol:.3g}; nothing written",
                              details={"validation": figures})


def _num(x) -> str:
    x = float(x)
    if math.isinf(x) or math.isnan(x):
        return str(x)
    return f"{x:.6g}"


def unsupported_nodes(model) -> list[tuple[str, str, str]]:
    """(domain, op_type, node name) of nodes that are not standard ONNX operators (e.g. left unconverted)."""
    import onnx

    known_domains = {"", "ai.onnx", "ai.onnx.ml", "com.microsoft"}
    bad = []
    for node in all_nodes(model.graph):
        if node.domain not in known_domains:
            if not any(f.name == node.op_type and f.domain == node.domain for f in model.functions):
                bad.append((node.domain, node.op_type, node.name))
        elif node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
            bad.append((node.domain, node.op_type, node.name))
    return bad


def check_model(path: Path) -> None:
    """onnx.checker with full shape inference; a failure is exit 3."""
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as e:  # noqa: BLE001 - checker raises several types
        raise PassError(f"the exported ONNX model fails onnx.checker: {first_line(e)}") from None
