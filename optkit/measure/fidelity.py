"""Fidelity: how close a model's outputs are to a reference model's on the same inputs."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from optkit.core.errors import PassError, UsageError, ValidationError

# The cosine reported when either side holds NaN or Inf: below every threshold, so no check passes on it.
NONFINITE_COSINE = -1.0


@dataclass(frozen=True)
class Padding:
    """The [samples, sequence] attention mask the model was fed (0: padding), and the outputs it applies to:
    those whose second dim is the sequence (dynamic, and named like the mask's when both are named). A
    [batch, 8] output is never masked because 8 happens to be the sequence length."""
    mask: np.ndarray
    outputs: frozenset[str] | None = None     # None: every output whose two leading dims are the mask's

    def first(self, n: int) -> Padding:
        return Padding(self.mask[:n], self.outputs)

    def keep(self, name: str, shape: tuple) -> np.ndarray | None:
        """The positions of output `name` to judge ([samples, sequence] booleans), or None: judge them all."""
        if self.outputs is not None and name not in self.outputs:
            return None
        if len(shape) < 2 or tuple(shape[:2]) != self.mask.shape:
            return None
        keep = self.mask != 0
        if not keep.any():
            raise UsageError(f"the attention mask masks every position of output {name!r}: nothing is left to "
                             "compare; give data with real (unpadded) tokens")
        return keep


def attention_mask(specs: list, feeds: dict[str, np.ndarray], outputs: list | None = None) -> Padding | None:
    """The padding of the inputs fed, when one of them is an attention mask (an int or bool input the graph or
    its name marks as a mask). With the model's output specs, only outputs with a sequence axis are masked."""
    for spec in specs:
        arr = feeds.get(spec.name)
        is_mask = getattr(spec, "mask", False) or "mask" in spec.name.lower()
        if is_mask and arr is not None and arr.ndim == 2 and arr.dtype.kind in "biu":
            return Padding(np.asarray(arr), None if outputs is None else _sequence_outputs(spec, outputs))
    return None


def refuse_nonfinite_reference(path, outputs: list, names: list[str], specs: list, feeds: dict[str, np.ndarray],
                               given: str, only: list[str] | None = None, data_only: bool = False) -> None:
    """A model whose own outputs hold NaN/Inf on the inputs given leaves nothing to check a result against.
    When an input explains it (a mask that hides every position of those samples) the data is the problem: a
    UsageError (exit 2) naming the input. Otherwise the model computes NaN on ordinary inputs: ValidationError
    (exit 3), unless `data_only` (the caller says it its own way)."""
    for name, out in zip(names, outputs):
        out = np.asarray(out)
        if (only and name not in only) or out.dtype.kind not in "fc" or not out.size:
            continue
        bad = _nonfinite(out)
        if not bad:
            continue
        culprit = _culprit(specs, feeds, out)
        if culprit is None and data_only:
            return
        what = f"{path} itself gives {bad} NaN/Inf values out of {out.size} in output {name!r} on {given}"
        if culprit is not None:
            raise UsageError(f"{what} ({culprit}), so there is nothing to check against; nothing was written. "
                             "Give data on which its outputs are finite")
        raise ValidationError(f"{what}, so there is nothing to check against; nothing was written. Give data on "
                              "which its outputs are finite")


def _culprit(specs: list, feeds: dict[str, np.ndarray], out: np.ndarray) -> str | None:
    """Which input explains non-finite outputs: a mask that hides every position of the samples that gave them."""
    n = len(next(iter(feeds.values()))) if feeds else 0
    rows = ~np.isfinite(out.reshape(n, -1)).all(axis=1) if n and out.ndim and out.shape[0] == n else None
    for spec in specs:
        arr = feeds.get(spec.name)
        is_mask = getattr(spec, "mask", False) or "mask" in spec.name.lower()
        if not is_mask or arr is None or arr.ndim < 2 or len(arr) != n:
            continue
        empty = ~np.asarray(arr).reshape(n, -1).any(axis=1)
        hit = int(empty[rows].sum()) if rows is not None else int(empty.sum())
        if hit:
            return f"input {spec.name!r} masks every position in {hit} of {n} samples"
    return None


def _sequence_outputs(mask_spec, outputs: list) -> frozenset[str]:
    seq = mask_spec.shape[1] if len(mask_spec.shape) > 1 else None
    names = set()
    for out in outputs:
        shape = list(out.shape or [])
        if len(shape) < 2 or isinstance(shape[1], int):
            continue
        if isinstance(seq, str) and isinstance(shape[1], str) and shape[1] != seq:
            continue
        names.add(out.name)
    return frozenset(names)


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
                    mask: Padding | None = None, only: list[str] | None = None) -> dict:
    """Per output and overall: max/mean abs error, max rel error, cosine, top-1 agreement (for [N, C] outputs).

    `nonfinite` / `reference_nonfinite` count NaN and Inf values in `out` / `ref`. Where there are any, the
    errors are inf, the cosine is NONFINITE_COSINE (-1.0) and rows holding them never count as agreeing.
    `mask` (from `attention_mask`) drops padded positions from the outputs with a sequence axis; NaN and Inf
    are counted over every position, padded or not. The overall figures cover the `only` outputs (all when None); every output
    is reported, with `checked` saying which ones the overall figures judge.
    """
    if len(ref) != len(out):
        raise PassError(f"the models disagree on the number of outputs: {len(ref)} vs {len(out)}")
    checked = set(check_names(only, list(names)))
    per = {}
    for name, a, b in zip(names, ref, out):
        a, b = np.asarray(a), np.asarray(b)
        masked, nonfinite = 0, None
        keep = mask.keep(name, a.shape) if mask is not None and b.shape == a.shape else None
        if keep is not None:
            masked = int(keep.size - keep.sum())
            if a.dtype.kind in "fc" or b.dtype.kind in "fc":  # padded NaN still fails
                nonfinite = (_nonfinite(a) - _nonfinite(a[keep]), _nonfinite(b) - _nonfinite(b[keep]))
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
        if nonfinite is not None:
            bad_a, bad_b = bad_a + nonfinite[0], bad_b + nonfinite[1]
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


def _nonfinite(a: np.ndarray) -> int:
    return int(a.size - np.isfinite(a).sum()) if a.dtype.kind in "fc" else 0


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    cos = float(np.dot(a, b) / (na * nb))
    return cos if np.isfinite(cos) else NONFINITE_COSINE  # norms overflowing float64


def step_errors(ref: np.ndarray, out: np.ndarray, step: float, clear_margin: float) -> dict:
    """How far a quantized output moved, counted in quantization steps of size `step`: the distribution of
    |out - ref| / step over every element (median, p90, p99, max, and the share of elements off by more than
    one step), and for class scores (a last axis over 1) the top-1 agreement over the samples whose reference
    top class stands clear of the runner-up by more than `clear_margin` steps (`clear_samples` of them; the
    agreement is None when there are none). NaN or Inf on either side count as infinitely many steps.

    The systematic part of the error, what a wrong zero point or scale gives, over the finite elements: `offset`,
    the mean signed error (out - ref) in steps, and `gain`, the least-squares slope of that error against the
    reference value (0.1: out is 10% too large around the mean), each with its standard error (`offset_se`,
    `gain_se`); `gain` is None when the reference is constant."""
    a = np.asarray(ref, dtype=np.float64)
    b = np.asarray(out, dtype=np.float64).reshape(a.shape)
    signed = (b - a) / step
    d = np.abs(signed)
    d = np.where(np.isfinite(d), d, np.inf).ravel()
    figures: dict = {"step": float(step)}
    if d.size:
        figures.update(median=float(np.median(d)), p90=float(np.percentile(d, 90)), p99=float(np.percentile(d, 99)),
                       max=float(d.max()), over_1=float(np.mean(d > 1.01)))
        figures.update(_systematic(a.ravel() / step, signed.ravel()))
    if a.ndim >= 2 and a.shape[-1] > 1 and a.size:
        r, o = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
        top = np.sort(r, axis=1)
        clear = (top[:, -1] - top[:, -2]) / step > clear_margin
        agree = (r.argmax(1) == o.argmax(1)) & np.isfinite(o).all(1)
        figures.update(clear_margin=float(clear_margin), clear_samples=int(clear.sum()),
                       top1_agreement_clear=float(agree[clear].mean()) if clear.any() else None,
                       flipped_clear=int(np.count_nonzero(clear & ~agree)))
    return figures


def _systematic(ref: np.ndarray, err: np.ndarray) -> dict:
    """The mean of `err` and its slope against `ref` (both in steps), with standard errors, over finite pairs.
    Elements of one reference value round alike (the same inputs to the same kernels), so they are not
    independent draws: with fewer than 3 distinct reference values (1 or 2 elements; a constant output) the
    standard errors are None, there being no telling a systematic step from rounding."""
    ok = np.isfinite(ref) & np.isfinite(err)
    r, e = ref[ok], err[ok]
    n = r.size
    if n < 3 or np.unique(r).size < 3:
        return {"offset": float(e.mean()) if n else None, "offset_se": None, "gain": None, "gain_se": None}
    offset = float(e.mean())
    rc, ec = r - r.mean(), e - offset
    spread = float(np.dot(rc, rc))
    gain = float(np.dot(ec, rc) / spread) if spread > 0 else None
    resid = ec - (gain or 0.0) * rc
    noise = float(np.sqrt(np.dot(resid, resid) / (n - 2)))
    return {"offset": offset, "offset_se": float(e.std() / np.sqrt(n)), "gain": gain,
            "gain_se": noise / np.sqrt(spread) if spread > 0 else None}
