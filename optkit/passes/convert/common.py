"""What convert.torch and convert.tf share: opset choice, validation inputs, the tolerance check."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from optkit.core.batching import call_as_samples, count
from optkit.core.errors import PassError, UsageError, ValidationError
from optkit.core.registry import MAX_BATCH, MAX_SAMPLES, PassConfig, PassContext, cli
from optkit.core.shapes import TensorSpec
from optkit.core.text import first_line
from optkit.measure.datasets import Dataset
from optkit.measure.fidelity import compare_outputs, step_errors
from optkit.measure.inputs import synthesize
from optkit.onnx.graph import all_nodes
from optkit.onnx.session import ort_session

# int8 outputs (int8 dtype, or dequantized from int8): judged in quantization steps of the output, because the
# int8 kernels of onnxruntime and TFLite round differently at every requantization (TFLite in fixed point, ties
# away from zero; onnxruntime in float, ties to even) and the differences add up with depth. An error has two
# parts, judged apart:
#   - systematic (`gain`, `offset` of fidelity.step_errors): what a wrong output scale or zero point gives, on
#     every element. Rounding gives none at any depth: measured on full-int8 MobileNetV2s from
#     tf.keras.applications (96x96 alpha 0.35, 48 requantizations deep; 224x224 alpha 1.0, 47 deep), their
#     optkit and plain tf2onnx conversions against the TFLite interpreter on 100 real ImageNet images, |gain| at
#     most 0.003 and |offset| at most 0.001 step; trained_lstm_int8.tflite (its LSTM runs in float in ONNX) on 300
#     MNIST images: gain 0.0001, offset 0.0000. The same files with the output scale 10% off give gain 0.097 to
#     0.102, with the zero point off by one offset 0.999. GAIN_MAX and OFFSET_MAX sit between.
#   - noise (median, p90, max of |error| in steps), which grows with the requantizations on the way from the
#     input (`depth`). On the MobileNetV2s above: depth 48 median 0, p90 1, p99 6, max 21; depth 47 median 1,
#     p90 2, p99 3, max 7; issue 31's from PyTorch (53 quantized layers, as reported there): median 1, p90 3,
#     p99 5, max 6, top-1 agreement 0.96 on real images, as plain tf2onnx's; the shallower CNN of
#     tests/test_tflite_int8.py median 0, p90 1, max 3; the LSTM max 11 (on 300 images).
# Where plain tf2onnx converts the file (tf2onnx's graph before optkit gives it TFLite's interface, with no
# handler of optkit's), its distance from TFLite on the same inputs says what a faithful conversion gives: the
# noise limits are its figures plus REFERENCE_MARGIN (never under the base limits), the systematic ones its
# |gain| / |offset| plus GAIN_MAX / OFFSET_MAX. Otherwise the base noise limits hold up to DEPTH_BASE
# requantizations and grow as sqrt(depth / DEPTH_BASE) beyond (independent rounding differences add as a random
# walk): at depth 48 median 2.4, p90 6.1, max 78. Measured on the graph's own arithmetic (QDQ nodes unfused, the
# same on every CPU: tf.py's _validate), a random-weight MobileNetV2 at depth 47 is off by p90 5 steps (pooled
# features) and 3 (logits), as plain tf2onnx's conversion is.
STEP_MEDIAN_MAX = 1      # median |error| in steps, base (measured: 0 on shallow models)
STEP_P90_MAX = 2.5       # 90th percentile, base (measured: at most 1 shallow); p90, not p99, so a few-element output is judged
STEP_MAX = 32            # any single element, base (measured: at most 11)
DEPTH_BASE = 8           # requantizations the base noise limits hold for
REFERENCE_MARGIN = {"median": 1, "p90": 1, "max": 4}   # steps over plain tf2onnx's figures
GAIN_MAX = 0.03          # |gain|: an output scale 3% off (measured: at most 0.003; 10% off gives 0.1)
OFFSET_MAX = 0.5         # |offset| in steps: half a zero point (measured: at most 0.001; one off gives 1.0)
SE_MULTIPLE = 3          # gain and offset are judged past their limit by more than 3 standard errors
CLEAR_MARGIN = 8         # a sample's top class is clear when it leads the runner-up by more than this many steps
                         # (shallow; deep files: `clear_margin`)
CLEAR_AGREEMENT_MIN = 0.98   # top-1 agreement on the clear samples (measured: 1.0); under 50 of them, no flip
                             # beyond those plain tf2onnx's conversion flips too

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


class CheckConfig(PassConfig):
    """How every converter checks its result against its source."""

    atol: float | None = Field(default=None, ge=0, le=1e9, description="Absolute tolerance (default per dtype).",
                               json_schema_extra=cli("--atol", group="budgets"))
    rtol: float | None = Field(default=None, ge=0, le=1e6, description="Relative tolerance (default per dtype).",
                               json_schema_extra=cli("--rtol", group="budgets"))
    samples: int = Field(default=64, ge=1, le=MAX_SAMPLES, description="Validation samples taken from the data.",
                         json_schema_extra=cli("--samples", group="evaluation"))


class SynthConfig(CheckConfig):
    """A converter that checks on synthesized inputs when no data is given."""

    batch: int = Field(default=2, ge=1, le=MAX_BATCH, description="batch of synthesized validation inputs",
                       json_schema_extra=cli(recipe_only="validation detail: the batch of synthesized inputs "
                                                         "(--data feeds real ones)"))


class ExportConfig(CheckConfig):
    """What every converter to ONNX takes."""

    opset: int | None = Field(default=None, ge=7, le=1000, description="ONNX opset (default: the newest the exporter "
                                                               "and onnxruntime both support).",
                              json_schema_extra=cli("--opset"))
    external_data: Literal["auto", "always", "never"] = Field(
        default="auto", description="ONNX external data: auto (only over 2 GB), always or never.",
        json_schema_extra=cli("--external-data"))


class ConvertConfig(ExportConfig, SynthConfig):
    static_batch: bool = Field(default=False, description="Keep the batch axis (the first) fixed; by default it "
                                                          "is dynamic, as exporters such as Optimum make it.",
                               json_schema_extra=cli("--static-batch"))


_ORT_MAX: int | None = None


def ort_max_opset() -> int:
    """The newest default-domain opset this onnxruntime loads (probed with a one-node model)."""
    global _ORT_MAX
    if _ORT_MAX is not None:
        return _ORT_MAX
    import onnx
    from onnx import TensorProto, helper

    for opset in range(onnx.defs.onnx_opset_version(), 6, -1):
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = min(model.ir_version, 10)
        try:
            ort_session(model.SerializeToString())
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
             steps: dict[str, float] | None = None, depths: dict[str, int] | None = None,
             plain: list[np.ndarray] | None = None) -> dict:
    """Compare ONNX outputs to the source framework's; raise ValidationError (exit 3) past tolerance.

    `steps` gives the quantization step of outputs that are dequantized int8; int8 / uint8 outputs have a step
    of 1. Unless atol or rtol is given, those are judged in steps (`check_steps`) rather than by a float atol,
    with limits from plain tf2onnx's outputs on the same inputs (`plain`, in output order) where given, else
    from the output's requantization depth (`depths`).
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
        step = (steps or {}).get(name) or (1.0 if dtype in ("int8", "uint8") else None)
        if step and config.atol is None and config.rtol is None:
            k = names.index(name)
            limits = check_steps(name, r, o, step, source, figures, depth=(depths or {}).get(name),
                                 plain=None if plain is None else np.asarray(plain[k]).reshape(r.shape))
            per[name].update(steps=step, atol=limits["max"] * step, rtol=0.0, dtype=dtype)
            continue
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


def step_limits(depth: int | None, plain: dict | None) -> dict:
    """What int8 rounding explains (constants and their measurements above): from plain tf2onnx's step figures
    where given, else from the requantization depth."""
    base = {"median": STEP_MEDIAN_MAX, "p90": STEP_P90_MAX, "max": STEP_MAX}
    if plain and "median" in plain:
        limits = {k: max(v, plain[k] + REFERENCE_MARGIN[k]) for k, v in base.items()}
        return {**limits, "gain": abs(plain.get("gain") or 0.0) + GAIN_MAX,
                "offset": abs(plain.get("offset") or 0.0) + OFFSET_MAX, "from": "plain tf2onnx's conversion"}
    grow = math.sqrt(max(depth or 0, DEPTH_BASE) / DEPTH_BASE)
    return {**{k: v * grow for k, v in base.items()}, "gain": GAIN_MAX, "offset": OFFSET_MAX,
            "from": f"a depth of {depth} requantizations" if depth else "int8 rounding"}


def clear_margin(depth: int | None, plain: dict | None) -> float:
    """How far a sample's top class must lead for noise not to explain a flip: CLEAR_MARGIN on shallow models,
    twice plain tf2onnx's p99 error where given (two elements moving apart), else grown with the depth as the
    noise limits are (and to twice the output's own p99 where that is more: check_steps)."""
    if plain and "p99" in plain:
        return max(CLEAR_MARGIN, 2 * plain["p99"])
    return CLEAR_MARGIN * math.sqrt(max(depth or 0, DEPTH_BASE) / DEPTH_BASE)


def check_steps(name: str, ref: np.ndarray, out: np.ndarray, step: float, source: str, figures: dict,
                depth: int | None = None, plain: np.ndarray | None = None) -> dict:
    """Judge a quantized output in quantization steps: record the error distribution, its systematic part and
    the top-1 agreement on clear samples in figures["outputs"][name]["step_error"] (with "limits", and plain
    tf2onnx's figures as "plain" where given), and raise ValidationError (exit 3) when int8 rounding cannot
    explain them. Returns the limits."""
    ref_q = step_errors(ref, plain, step, CLEAR_MARGIN) if plain is not None else None
    limits = step_limits(depth, ref_q)
    margin = clear_margin(depth, ref_q)
    q = step_errors(ref, out, step, margin)
    if ref_q is None and "p99" in q and 2 * q["p99"] > margin:
        # no plain conversion to measure the noise on: the output's own p99 stands in for it (a flip counts only
        # where the top class leads by more than two elements moving apart); a wrong scale, zero point or layout
        # is caught by the gain, offset and step limits, not by this
        margin = 2 * q["p99"]
        q = step_errors(ref, out, step, margin)
    if ref_q is not None and margin != CLEAR_MARGIN:
        ref_q = step_errors(ref, plain, step, margin)
    q["limits"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in limits.items()}
    if depth is not None:
        q["depth"] = depth
    if ref_q is not None:
        q["plain"] = {k: ref_q.get(k) for k in ("median", "p90", "p99", "max", "gain", "offset",
                                                 "top1_agreement_clear", "flipped_clear")}
    figures["outputs"][name]["step_error"] = q
    if "median" not in q:
        return limits
    dist = (f"median {q['median']:.3g}, p90 {q['p90']:.3g}, p99 {q['p99']:.3g}, max {q['max']:.3g} steps of "
            f"{step:.4g}; gain {_signed(q['gain'])}, offset {_signed(q['offset'])} steps")
    why = ""
    if _past(q["offset"], q["offset_se"], limits["offset"]):
        why = f"every element is shifted by {q['offset']:+.2f} steps on average (a wrong zero point?)"
    elif _past(q["gain"], q["gain_se"], limits["gain"]):
        why = (f"the output is {abs(q['gain']):.1%} {'larger' if q['gain'] > 0 else 'smaller'} (a wrong scale?)"
               if q["gain"] > -0.5 else f"the output hardly follows the source's (gain {q['gain']:+.2f}; a wrong "
                                        f"layout?)")
    elif q["median"] > limits["median"]:
        why = f"most elements are off by more than {limits['median']:.3g} steps"
    elif q["p90"] > limits["p90"]:
        why = f"over a tenth of the elements are off by more than {limits['p90']:.3g} steps"
    elif q["max"] > limits["max"]:
        why = f"an element is off by more than {limits['max']:.3g} steps"
    elif q.get("top1_agreement_clear") is not None:
        n, flipped = q["clear_samples"], q["flipped_clear"]
        allowed = (int((1 - CLEAR_AGREEMENT_MIN) * n) if n >= 50 else 0) + (ref_q or {}).get("flipped_clear", 0)
        if flipped > allowed:
            why = (f"{flipped} of {n} samples whose top class is clear by over {margin:.3g} steps change it "
                   f"(top-1 agreement {q['top1_agreement_clear']:.3f} there)")
    if why:
        raise ValidationError(
            f"output {name!r} differs from the {source} model by more than int8 rounding explains: {why} ({dist}; "
            f"limits from {limits['from']}); a wrong scale, zero point or layout? nothing written (--atol / --rtol "
            f"judge it by a float tolerance instead)", details={"validation": figures})
    return limits


def _past(value: float | None, se: float | None, limit: float) -> bool:
    """Past its limit beyond the noise; a figure without a standard error (too few distinct values to tell a
    systematic error from rounding, fidelity.step_errors) is left to the median / p90 / max limits."""
    return value is not None and se is not None and abs(value) > limit + SE_MULTIPLE * se


def _signed(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.3g}"


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
