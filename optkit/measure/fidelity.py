"""Fidelity: how close a model's outputs are to a reference model's on the same inputs."""
from __future__ import annotations

import numpy as np

from optkit.core.errors import PassError

# The cosine reported when either side holds NaN or Inf: below every threshold, so no check passes on it.
NONFINITE_COSINE = -1.0


def compare_outputs(ref: list[np.ndarray], out: list[np.ndarray], names: list[str]) -> dict:
    """Per output and overall: max/mean abs error, max rel error, cosine, top-1 agreement (for [N, C] outputs).

    `nonfinite` / `reference_nonfinite` count NaN and Inf values in `out` / `ref`. Where there are any, the
    errors are inf, the cosine is NONFINITE_COSINE (-1.0) and rows holding them never count as agreeing.
    """
    if len(ref) != len(out):
        raise PassError(f"the models disagree on the number of outputs: {len(ref)} vs {len(out)}")
    per = {}
    for name, a, b in zip(names, ref, out):
        a, b = np.asarray(a), np.asarray(b)
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
        per[name] = entry
    return {
        "max_abs_error": max(e["max_abs_error"] for e in per.values()),
        "mean_abs_error": float(np.mean([e["mean_abs_error"] for e in per.values()])),
        "cosine": min(e["cosine"] for e in per.values()),
        "top1_agreement": min((e["top1_agreement"] for e in per.values() if "top1_agreement" in e), default=None),
        "nonfinite": sum(e["nonfinite"] for e in per.values()),
        "reference_nonfinite": sum(e["reference_nonfinite"] for e in per.values()),
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
