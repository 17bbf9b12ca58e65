"""An int8 TFLite's conversion on the fused kernels onnxruntime runs here: the file kept is the int8 one as
converted or retyped as uint8 (retype.to_uint8: the same values), whichever runs exactly on this CPU (on x86
without VNNI the u8 x s8 kernels can saturate), the uint8 one when both are only if faster beyond the noise; and
the per-output lines that say how each int8 output was judged in quantization steps."""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import onnx

from optkit.core.artifact import Artifact
from optkit.core.registry import PassContext
from optkit.core.text import first_line
from optkit.measure.fidelity import step_errors
from optkit.measure.paired import head_to_head
from optkit.onnx import io as onnx_io
from optkit.onnx.session import ort_session
from optkit.passes.convert import retype
from optkit.passes.convert.common import CLEAR_MARGIN

log = logging.getLogger("optkit.passes.convert.tf")

KERNEL_KEYS = ("median", "p90", "p99", "max", "gain", "offset", "top1_agreement_clear", "flipped_clear")
FASTER = 0.97   # the uint8 file is kept when both are exact only if its 95% interval lies below this ratio


def _kernel_errors(figures: dict, source_out: list, fused: list) -> dict[str, dict]:
    """Per output judged in steps, the step error of onnxruntime's fused int8 kernels (a default session)."""
    out = {}
    for k, (name, o) in enumerate(figures["outputs"].items()):
        q = o.get("step_error")
        if q and "median" in q:
            ref = np.asarray(source_out[k])
            e = step_errors(ref, np.asarray(fused[k]).reshape(ref.shape), q["step"],
                            q.get("clear_margin") or CLEAR_MARGIN)
            out[name] = {key: e.get(key) for key in KERNEL_KEYS}
    return out


def _exact(figures: dict, kernels: dict[str, dict]) -> bool:
    """Every output's fused-kernel error within the limits its graph arithmetic was judged by."""
    for name, k in kernels.items():
        lim = figures["outputs"][name]["step_error"]["limits"]
        if "median" in k and (k["median"] > lim["median"] or k["p90"] > lim["p90"] or k["max"] > lim["max"]):
            return False
    return True


def choose_kernels(onnx_path: Path, figures: dict, source_out: list, judged: list, fused: list, run,
                    one_call: dict, ctx: PassContext) -> None:
    """The int8 file as converted or retyped as uint8 (retype.to_uint8: the same values), whichever onnxruntime's
    fused kernels run exactly on this CPU, the uint8 one when both are only if faster beyond the noise; the
    figures of both in figures["kernels"], the kept one's in each output's step_error["kernels"], and a note
    when the kept one's kernels are still off past the limits (the accuracy measured here carries it)."""
    s8 = _kernel_errors(figures, source_out, fused)
    u8, ratio, stored, why = None, None, "int8", ""
    variant = retype.to_uint8(onnx_io.load(onnx_path, external_data=False))
    if variant is not None:
        data = variant.SerializeToString()
        try:
            onnx.checker.check_model(variant)
            same = all(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
                       for a, b in zip(run(ort_session(data, optimization="basic")), judged))
            u8 = _kernel_errors(figures, source_out, run(ort_session(data))) if same else None
            if not same:
                log.debug("the uint8 retyping computes otherwise on the graph's arithmetic: not used")
        except Exception as e:  # noqa: BLE001 - an alternative file; the converted one stands
            log.debug("the uint8 retyping does not run: %s", first_line(e))
    if u8 is not None and _exact(figures, u8):
        if not _exact(figures, s8):
            stored, why = "uint8", "its kernels are exact on this CPU and the int8 file's are not"
        else:
            ratio = _time_uint8(onnx_path, data, one_call)
            if ratio is not None and ratio[2] < FASTER:
                stored, why = "uint8", f"it runs {ratio[0]:.2f}x the int8 file's time (95% CI {ratio[1]:.2f}-{ratio[2]:.2f}x)"
    kept = u8 if stored == "uint8" else s8
    figures["kernels"] = {"stored": stored, "int8": s8, "uint8": u8,
                          "uint8_latency_ratio": None if ratio is None else list(ratio)}
    for name, k in kept.items():
        figures["outputs"][name]["step_error"]["kernels"] = k
    if stored == "uint8":
        onnx_io.save(variant, onnx_path)
        ctx.note(f"int8 graph stored as uint8 (zero points +128: the same values, other onnxruntime kernels): {why} "
                 f"(fused kernels off the TFLite model, as int8: {_kernel_text(s8)}; as uint8: {_kernel_text(u8)})")
    for name, k in kept.items():
        q = figures["outputs"][name]["step_error"]
        if not _exact(figures, {name: k}):
            agree = "" if k.get("top1_agreement_clear") is None else f", top-1 agreement {k['top1_agreement_clear']:.3f}"
            ctx.note(f"int8 output {name!r}: onnxruntime's fused int8 kernels on this CPU are off the TFLite model by "
                     f"median {k['median']:.3g}, p90 {k['p90']:.3g}, max {k['max']:.3g} steps{agree}, where the graph's "
                     f"own arithmetic is off by median {q['median']:.3g}, p90 {q['p90']:.3g}: the conversion is "
                     "faithful, these kernels round otherwise (on x86 CPUs without VNNI, onnxruntime's u8 x s8 kernels "
                     "can saturate); the accuracy measured on this machine carries it")


def _kernel_text(kernels: dict[str, dict]) -> str:
    return ", ".join(f"{n!r} median {k['median']:.3g}, max {k['max']:.3g} steps"
                     for n, k in kernels.items() if "median" in k and k["median"] is not None)


def _time_uint8(onnx_path: Path, data: bytes, one_call: dict) -> tuple[float, float, float] | None:
    """The uint8 file's latency over the int8 file's (measure.paired.head_to_head); None when the timing failed."""
    with tempfile.TemporaryDirectory(prefix="optkit-retype-") as tmp:
        path = Path(tmp) / "uint8.onnx"
        path.write_bytes(data)
        try:
            return head_to_head(Artifact.load(str(onnx_path)), Artifact.load(str(path)), one_call)
        except Exception as e:  # noqa: BLE001 - latency informs the choice; a failure keeps the int8 file
            log.debug("the uint8 file was not timed: %s", first_line(e))
            return None


def note_steps(figures: dict, where: str, ctx: PassContext) -> None:
    """One note per output judged in quantization steps: its step errors, top-1 agreement and the limits."""
    for name, o in figures["outputs"].items():
        q = o.get("step_error")
        if q and "median" in q:
            agree = ("" if q.get("clear_samples") is None else
                     f"; top-1 agreement {q['top1_agreement_clear']:.3f} on the {q['clear_samples']} "
                     f"sample{'s' if q['clear_samples'] != 1 else ''} whose top class is clear by over "
                     f"{q['clear_margin']:g} steps" if q["clear_samples"] else
                     f"; no sample's top class is clear by over {q['clear_margin']:g} steps, so top-1 is not judged")
            lim = q["limits"]
            ctx.note(f"int8 output {name!r} judged in quantization steps ({q['step']:.4g}) on {where}: median "
                     f"{q['median']:.3g}, p99 {q['p99']:.3g}, max {q['max']:.3g} steps, gain {q['gain'] or 0:+.3f}, "
                     f"offset {q['offset']:+.2f}{agree} (limits from {lim['from']}: median {lim['median']:.3g}, "
                     f"p90 {lim['p90']:.3g}, max {lim['max']:.3g}, |gain| {lim['gain']:.3g}, |offset| "
                     f"{lim['offset']:.3g})")
