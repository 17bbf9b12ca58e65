"""convert.hf's validation: the ONNX file against the source model on real inputs, each output judged on its own
scale, over the positions the attention mask keeps, with a tolerance that comes from the model's own float noise.

The noise: the source model run in float32 and in float64 on the same inputs; the largest |float32 - float64|
over an output's kept positions is what float32 rounding alone moves that output by on this model. An exported
graph computes the same arithmetic in another order (fused kernels, other reductions), so its distance from the
float32 source is of the same order: measured on all-MiniLM-L6-v2 and the seeded models of every task in
tests/test_hf_convert.py, at most NOISE_MEASURED times the noise. An output is damaged when its max |diff| passes
NOISE_MULTIPLE times the noise (never under FLOOR_ULPS float32 steps of the output's largest value, for an output
float32 computes exactly), or when a logit's top-1 flips where the float64 source's lead is clear of twice the
tolerance. Padded positions are excluded: what a model gives there means nothing.
"""
from __future__ import annotations

import numpy as np

from optkit.core.errors import ValidationError

NOISE_MEASURED = 2.5      # measured: max |onnx - float32| / max |float32 - float64| (the module docstring)
NOISE_MULTIPLE = 16       # the tolerance: this many times the model's own float32 noise
FLOOR_ULPS = 8            # and at least this many float32 steps (2^-23) of the output's largest value
FP64_MAX_BYTES = 8 << 30  # a float64 copy of a larger model is not made: the fixed rule below is used instead
FIXED_RELATIVE = 1e-4     # without a float64 run: the tolerance is this fraction of the output's largest value


def run(module, batches: list[dict[str, np.ndarray]], names: list[str], dtype: str = "float32") -> list[list]:
    """The module's outputs on each batch (float inputs cast to `dtype`)."""
    import torch

    out = []
    with torch.inference_mode():
        for b in batches:
            args = [torch.from_numpy(np.ascontiguousarray(b[n])) for n in names]
            args = [a.to(getattr(torch, dtype)) if a.is_floating_point() else a for a in args]
            res = module(*args)
            res = res if isinstance(res, tuple) else (res,)
            out.append([r.detach().to(torch.float64).numpy() for r in res])
    return out


def float64_reference(module, batches, names) -> list[list] | None:
    """The module in float64 on the same batches (restored to float32 after), or None for a model too large."""
    size = sum(p.numel() * p.element_size() for p in module.parameters())
    if 2 * size > FP64_MAX_BYTES:
        return None
    module.double()
    try:
        return run(module, batches, names, "float64")
    finally:
        module.float()


def rows(arr: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """An output as rows over its last axis, at the kept positions: [B, S, H] -> the kept (b, s) rows;
    [B, S] (a logit per position) -> one row per sample, padded positions -inf; [B, H] -> as it is."""
    if mask is None or arr.ndim < 2 or arr.shape[:2] != mask.shape:
        return arr.reshape(len(arr), -1)
    keep = mask.astype(bool)
    if arr.ndim == 2:
        return np.where(keep, arr, -np.inf)
    return arr[keep]


def judge(names: list[str], batches, got: list[list], ref: list[list], ref64: list[list] | None,
          atol: float | dict | None, rtol: float | None, source: str) -> dict:
    """Figures per output over every batch; ValidationError (exit 3) for an output past its tolerance (`atol`: one
    for every output, or one per output name)."""
    figures = {}
    for k, name in enumerate(names):
        g = [rows(o[k], b.get("attention_mask")) for o, b in zip(got, batches)]
        r = [rows(o[k], b.get("attention_mask")) for o, b in zip(ref, batches)]
        r64 = None if ref64 is None else [rows(o[k], b.get("attention_mask")) for o, b in zip(ref64, batches)]
        figures[name] = _one(name, g, r, r64, atol.get(name) if isinstance(atol, dict) else atol, rtol, source)
    return figures


def _finite(a: np.ndarray) -> np.ndarray:
    return a[np.isfinite(a)] if a.ndim else a


def _one(name, got, ref, ref64, atol, rtol, source) -> dict:
    diff = max(float(np.max(np.abs(g[np.isfinite(r)] - r[np.isfinite(r)]), initial=0.0)) for g, r in zip(got, ref))
    bad = any(np.any(np.isfinite(r) != np.isfinite(g)) or np.any(np.isnan(g)) for g, r in zip(got, ref))
    scale = max(float(np.max(np.abs(_finite(r)), initial=0.0)) for r in ref)
    fig = {"max_abs_error": diff, "max_rel_error": diff / scale if scale else 0.0, "scale": scale, "dtype": "float32",
           "positions": int(sum(len(r) for r in ref))}
    if ref64 is not None:
        noise = max(float(np.max(np.abs(a[np.isfinite(a)] - b[np.isfinite(a)]), initial=0.0))
                    for a, b in zip(ref, ref64))
        tol = max(NOISE_MULTIPLE * noise, FLOOR_ULPS * 2.0 ** -23 * scale)
        fig.update(noise=noise, tolerance_rule=f"{NOISE_MULTIPLE}x the float32-vs-float64 noise of the source "
                                               f"(at least {FLOOR_ULPS} float32 steps of its largest value)")
    else:
        tol = FIXED_RELATIVE * scale
        fig["tolerance_rule"] = f"{FIXED_RELATIVE:g} of the output's largest value (no float64 run: model over " \
                                f"{FP64_MAX_BYTES >> 30} GB)"
    if atol is not None or rtol is not None:
        tol = atol or 0.0
        fig["tolerance_rule"] = "--atol / --rtol as given"
    fig.update(atol=tol, rtol=rtol or 0.0, tolerance=tol)
    cos = [_cosines(g, r) for g, r in zip(got, ref)]
    fig["min_cosine"] = float(min(np.min(c, initial=1.0) for c in cos))
    if name.endswith("logits"):
        agree, flips = _top1(got, ref, ref64 or ref, 2 * tol)
        fig["top1_agreement"] = agree
        fig["clear_flips"] = flips
    else:
        flips = 0
    worst = max(float(np.max(_excess(g, r, tol, rtol or 0.0), initial=-1.0)) for g, r in zip(got, ref))
    if bad or worst > 0 or flips:
        why = ("it gives NaN or infinity where the source does not" if bad else
               f"{flips} top-1 flips where the source's lead is over {2 * tol:.3g}" if flips and worst <= 0 else
               f"max |diff| {diff:.4g} over the unpadded positions, past the tolerance {tol:.3g} "
               f"({fig['tolerance_rule']}; relative error {fig['max_rel_error']:.3g}, min cosine {fig['min_cosine']:.6f})")
        raise ValidationError(f"output {name!r} of the ONNX model differs from {source}: {why}; nothing written"
                              + ("" if atol is not None else " (--atol sets a fixed tolerance if this is expected)"),
                              details={"validation": {"outputs": {name: fig}}})
    return fig


def _excess(g: np.ndarray, r: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """|diff| past atol + rtol |ref| at the kept (finite) positions."""
    keep = np.isfinite(r)
    return np.abs(g[keep] - r[keep]) - (atol + rtol * np.abs(r[keep]))


def _cosines(g: np.ndarray, r: np.ndarray) -> np.ndarray:
    g, r = np.where(np.isfinite(r), g, 0.0), np.where(np.isfinite(r), r, 0.0)
    num = (g * r).sum(-1)
    den = np.linalg.norm(g, axis=-1) * np.linalg.norm(r, axis=-1)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)


def _top1(got, ref, ref64, clear: float) -> tuple[float, int]:
    """Top-1 agreement over rows, and the flips where the float64 source leads by more than `clear`."""
    same = total = flips = 0
    for g, r, r64 in zip(got, ref, ref64):
        if r.shape[-1] < 2:
            continue
        a, b = np.argmax(g, -1), np.argmax(r, -1)
        top2 = np.sort(np.where(np.isfinite(r64), r64, -np.inf), axis=-1)[..., -2:]
        lead = top2[..., 1] - top2[..., 0]
        same += int((a == b).sum())
        total += a.size
        flips += int(((a != b) & (lead > clear)).sum())
    return (same / total if total else 1.0), flips
