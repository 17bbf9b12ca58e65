"""Fidelity: how close a model's outputs are to a reference model's on the same inputs."""
from __future__ import annotations

import numpy as np


def compare_outputs(ref: list[np.ndarray], out: list[np.ndarray], names: list[str]) -> dict:
    """Per output and overall: max/mean abs error, max rel error, cosine, top-1 agreement (for [N, C] outputs)."""
    if len(ref) != len(out):
        from optkit.core.errors import PassError

        raise PassError(f"the models disagree on the number of outputs: {len(ref)} vs {len(out)}")
    per = {}
    for name, a, b in zip(names, ref, out):
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            if a.size != b.size:
                from optkit.core.errors import PassError

                raise PassError(f"output {name!r} has shape {list(b.shape)}, the reference {list(a.shape)}")
            b = b.reshape(a.shape)
        diff = np.abs(a - b)
        worst = int(diff.argmax()) if diff.size else 0
        entry = {
            "max_abs_error": float(diff.max()) if diff.size else 0.0,
            "mean_abs_error": float(diff.mean()) if diff.size else 0.0,
            "max_rel_error": float((diff / np.maximum(np.abs(a), 1e-6)).max()) if diff.size else 0.0,
            "cosine": _cosine(a.ravel(), b.ravel()),
            "worst_index": list(np.unravel_index(worst, a.shape)) if diff.size else [],
        }
        entry["worst_index"] = [int(i) for i in entry["worst_index"]]
        if a.ndim >= 2 and a.shape[-1] > 1:
            entry["top1_agreement"] = float((a.argmax(-1) == b.argmax(-1)).mean())
        per[name] = entry
    return {
        "max_abs_error": max(e["max_abs_error"] for e in per.values()),
        "mean_abs_error": float(np.mean([e["mean_abs_error"] for e in per.values()])),
        "cosine": min(e["cosine"] for e in per.values()),
        "top1_agreement": min((e["top1_agreement"] for e in per.values() if "top1_agreement" in e), default=None),
        "outputs": per,
    }


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))
