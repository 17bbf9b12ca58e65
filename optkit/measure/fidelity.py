"""Fidelity: how close a model's outputs are to a reference model's on the same inputs."""
from __future__ import annotations

import numpy as np

from optkit.core.errors import PassError, UsageError

# The cosine reported when either side holds NaN or Inf: below every threshold, so no check passes on it.
NONFINITE_COSINE = -1.0


def attention_mask(specs: list, feeds: dict[str, np.ndarray]) -> np.ndarray | None:
    """The [samples, sequence] mask the model was fed, when one of its inputs is an attention mask (an int or
    bool input the graph or its name marks as a mask): positions where it is 0 are padding."""
    for spec in specs:
        arr = feeds.get(spec.name)
        is_mask = getattr(spec, "mask", False) or "mask" in spec.name.lower()
        if is_mask and arr is not None and arr.ndim == 2 and arr.dtype.kind in "biu":
            return arr
    return None


def check_names(only: list[str] | None, names: list[str]) -> list[str]:
    """The outputs a check judges: `only` (each must name an output), else all."""
    if not only:
        return list(names)
    missing = [n for n in only if n not in names]
    if missing:
        raise UsageError(f"--check-output {missing[0]!r} names no output; the model's outputs are "
                         f"{', '.join(names)}")
    return list(only)


def compare_outputs(ref: list[np.ndarray], out: list[np.ndarray], names: list[str],
                    mask: np.ndarray | None = None, only: list[str] | None = None) -> dict:
    """Per output and overall: max/mean abs error, max rel error, cosine, top-1 agreement (for [N, C] outputs).

    `nonfinite` / `reference_nonfinite` count NaN and Inf values in `out` / `ref`. Where there are any, the
    errors are inf, the cosine is NONFINITE_COSINE (-1.0) and rows holding them never count as agreeing.
    `mask` ([samples, sequence], from `attention_mask`) drops padded positions from every output whose two
    leading dims are the mask's. The overall figures cover the `only` outputs (all when None); every output
    is reported, with `checked` saying which ones the overall figures judge.
    """
    if len(ref) != len(out):
        raise PassError(f"the models disagree on the number of outputs: {len(ref)} vs {len(out)}")
    checked = set(check_names(only, list(names)))
    per = {}
    for name, a, b in zip(names, ref, out):
        a, b = np.asarray(a), np.asarray(b)
        masked = 0
        if mask is not None and a.ndim >= 2 and a.shape[:2] == mask.shape and b.shape == a.shape:
            keep = np.asarray(mask) != 0
            masked = int(keep.size - keep.sum())
            a, b = a[keep], b[keep]
        if a.dtype.kind not in "biufc" or b.dtype.kind not in "biufc":  # strings: equal or not
            same = a.shape == b.shape and bool(np.all(a == b))
            per[name] = {"nonfinite": 0, "reference_nonfinite": 0, "max_abs_error": 0.0 if same else float("inf"),
                         "mean_abs_error": 0.0 if same else float("inf"), "max_rel_error": 0.0 if same else float("inf"),
                         "cosine": 1.0 if same else NONFINITE_COSINE, "worst_index": []}
            continue
        a, b = a.astype(np.float64), b.astype(np.float64)
        if a.shape != b.shape:
            if a.size != b.size:
                raise PassError(f"output {name!r} has shape {list(b.shape)}, the reference {list(a.shape)}")
            b = b.reshape(a.shape)
        fa, fb = np.isfinite(a), np.isfinite(b)
        bad_a, bad_b = int(a.size - fa.sum()), int(b.size - fb.sum())
        entry = {"nonfinite": bad_b, "reference_nonfinite": bad_a}
        if bad_a or bad_b:
            worst = int(np.argmin(fa & fb))  # the first position where either side is NaN or Inf
            entry.update(max_abs_error=float("inf"), mean_abs_error=float("inf"), max_rel_error=float("inf"),
                         cosine=NONFINITE_COSINE)
        else:
            diff = np.abs(a - b)
            worst = int(diff.argmax()) if diff.size else 0
            entry.update(
                max_abs_error=float(diff.max()) if diff.size else 0.0,
                mean_abs_error=float(diff.mean()) if diff.size else 0.0,
                max_rel_error=float((diff / np.maximum(np.abs(a), 1e-6)).max()) if diff.size else 0.0,
                cosine=_cosine(a.ravel(), b.ravel()),
            )
        entry["worst_index"] = [int(i) for i in np.unravel_index(worst, a.shape)] if a.size else []
        if a.ndim >= 2 and a.shape[-1] > 1:
            rows_ok = (fa & fb).all(-1)
            entry["top1_agreement"] = float(((a.argmax(-1) == b.argmax(-1)) & rows_ok).mean())
        if masked:
            entry["masked_positions"] = masked
        entry["checked"] = name in checked
        per[name] = entry
    judged = [e for n, e in per.items() if n in checked]
    return {
        "max_abs_error": max(e["max_abs_error"] for e in judged),
        "mean_abs_error": float(np.mean([e["mean_abs_error"] for e in judged])),
        "cosine": min(e["cosine"] for e in judged),
        "top1_agreement": min((e["top1_agreement"] for e in judged if "top1_agreement" in e), default=None),
        "nonfinite": sum(e["nonfinite"] for e in judged),
        "reference_nonfinite": sum(e["reference_nonfinite"] for e in judged),
        "outputs": per,
    }


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    cos = float(np.dot(a, b) / (na * nb))
    return cos if np.isfinite(cos) else NONFINITE_COSINE  # norms overflowing float64
