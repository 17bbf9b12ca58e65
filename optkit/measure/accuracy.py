"""Accuracy: a task metric over labelled data, and the model outputs it was computed from."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from optkit.core.batching import run_batched
from optkit.core.errors import PassError, UsageError
from optkit.measure.textmetrics import TEXT_METRICS, Rows, rows_of

LABELLED = ("top1", "top5", "accuracy", "mse", "mae", "cosine", *TEXT_METRICS)
ROWS = 4096  # top-k sorts this many rows at a time


def _topk(k: int) -> Callable:
    def metric(logits: np.ndarray, labels: np.ndarray) -> float:
        logits, labels = logits.reshape(len(logits), -1), labels.reshape(-1, 1)
        hits = 0
        for s in range(0, len(logits), ROWS):  # rows at a time: the sort's indices are 2x the logits
            top = np.argsort(-logits[s:s + ROWS], axis=1, kind="stable")[:, :k]  # ties: lowest index, like argmax
            hits += int((top == labels[s:s + ROWS]).any(axis=1).sum())
        return float(hits / len(logits)) if len(logits) else float("nan")
    return metric


def _mse(pred, target):
    return float(np.mean((pred.reshape(target.shape) - target) ** 2))


def _mae(pred, target):
    return float(np.mean(np.abs(pred.reshape(target.shape) - target)))


def _cosine(pred, target):
    p = pred.reshape(len(pred), -1).astype(np.float64)
    t = target.reshape(len(target), -1).astype(np.float64)
    num = (p * t).sum(1)
    den = np.linalg.norm(p, axis=1) * np.linalg.norm(t, axis=1)
    return float(np.mean(np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)))


BUILTIN = {"top1": _topk(1), "top5": _topk(5), "accuracy": _topk(1), "mse": _mse, "mae": _mae, "cosine": _cosine,
           **{m: None for m in TEXT_METRICS}}   # text metrics: measure.textmetrics, from per-row parts
CLASS_METRICS = ("top1", "top5", "accuracy")


def resolve_metric(name: str) -> Callable:
    """A built-in metric, or a user function named `module:function` / `file.py:function` (runs user code)."""
    if name in BUILTIN:
        return BUILTIN[name]
    if ":" not in name:
        raise UsageError(f"unknown metric {name!r}; use one of {', '.join(BUILTIN)} or module:function")
    target, attr = name.rsplit(":", 1)
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise UsageError(f"metric file {path} not found")
            spec = importlib.util.spec_from_file_location(f"optkit_user_metric_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except ImportError as e:
        raise UsageError(f"cannot import metric module {target!r}: {e}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UsageError(f"metric {name!r}: {target} has no function {attr!r}")
    return fn


def run_over(session, feeds: dict[str, np.ndarray], batch: int | None = None, progress=None) -> list[np.ndarray]:
    """Run a session over all samples, in batches the model accepts; outputs concatenated on axis 0."""
    return run_batched(session.run, session.inputs, feeds, batch or 64, progress, outputs=session.outputs)


def compute(metric: str, outputs: list[np.ndarray], labels: np.ndarray | None,
            names: list[str] | None = None, classes: list[str] | None = None) -> dict:
    """The metric on outputs[0] (a text metric on every output it needs: measure.textmetrics; `classes` names
    f1's per-class figures). Non-finite outputs fail (exit 3); labels that do not fit the metric and the output
    (class range, one-hot, shape) are a usage error (exit 2)."""
    fn = resolve_metric(metric)
    if labels is None:
        raise UsageError(f"metric {metric!r} needs labels, and the data has none (add a 'labels' array)")
    out = np.asarray(outputs[0])
    name = repr(names[0]) if names else "0"
    if out.dtype.kind in "fc":
        bad = int(out.size - np.count_nonzero(np.isfinite(out)))
        if bad:
            raise PassError(f"model output {name} has {bad} non-finite values (NaN or Inf) out of {out.size}; "
                            f"no {metric} figure is computed from them")
    if metric in TEXT_METRICS:
        rows = rows_of(metric, outputs, labels, classes)
        value = {metric: rows.value(), **(rows.extra or {})}
    else:
        if metric in BUILTIN:
            labels = check_labels(metric, out, np.asarray(labels), name)
        value = fn(out, labels)
    values = {k: float(v) for k, v in value.items()} if isinstance(value, dict) else {metric: float(value)}
    for k, v in values.items():
        if not np.isfinite(v):
            raise PassError(f"metric {metric!r} gave {v} for {k!r}; a non-finite figure cannot be compared")
    return values


def per_sample(metric: str, outputs: list[np.ndarray], labels: np.ndarray | None) -> np.ndarray | None:
    """A built-in metric of each sample on its own (their mean is the metric), for paired comparisons of two
    models on the same samples; None for a metric of the user's own, which need not be a mean over samples."""
    if metric not in BUILTIN or labels is None:
        return None
    if metric in TEXT_METRICS:
        return rows_of(metric, outputs, labels).per_row
    out = np.asarray(outputs[0])
    labels = check_labels(metric, out, np.asarray(labels))
    fn = BUILTIN[metric]
    return np.array([fn(out[i:i + 1], labels[i:i + 1]) for i in range(len(out))], dtype=np.float64)


def check_labels(metric: str, out: np.ndarray, labels: np.ndarray, name: str = "0") -> np.ndarray:
    """The labels a built-in metric can score against `out`; one-hot [N, C] labels become class indices.
    `name` is how messages call the output: "'logits'" or "0"."""
    n = len(out)
    if len(labels) != n:
        raise UsageError(f"{len(labels)} labels for {n} model outputs")
    classes = int(np.prod(out.shape[1:], dtype=np.int64)) if out.ndim >= 2 else 1
    if metric in CLASS_METRICS:
        k = 5 if metric == "top5" else 1
        if out.ndim < 2 or classes < 2:
            raise UsageError(f"metric {metric} needs class scores [N, C] but output {name} has shape "
                             f"{list(out.shape)}; use mse or mae for a regression output")
        if k > classes:
            raise UsageError(f"metric top5 needs at least 5 classes but output {name} has {classes}; use top1")
        if labels.ndim == 2 and labels.shape[1] == classes and classes > 1:
            onehot = np.isin(labels, (0, 1)).all() and (labels.sum(axis=1) == 1).all()
            if not onehot:
                raise UsageError(f"labels have shape {list(labels.shape)} but are not one-hot (one 1 per row); "
                                 f"{metric} needs class indices [N] or one-hot rows")
            labels = labels.argmax(axis=1)
        if labels.ndim > 1 and all(d == 1 for d in labels.shape[1:]):
            labels = labels.reshape(n)
        if labels.ndim != 1:
            raise UsageError(f"labels have shape {list(labels.shape)}; {metric} needs class indices [N] "
                             f"(or one-hot [N, {classes}])")
        if labels.dtype.kind == "b":
            labels = labels.astype(np.int64)
        if labels.dtype.kind == "f" and not np.array_equal(labels, np.round(labels)):
            raise UsageError(f"labels are {labels.dtype.name}, not whole class indices; {metric} needs integers "
                             f"in 0..{classes - 1}")
        if labels.dtype.kind not in "iuf":
            raise UsageError(f"labels are {labels.dtype.name}; {metric} needs integer class indices")
        lo, hi = labels.min(), labels.max()
        if lo < 0 or hi >= classes:
            raise UsageError(f"labels range {lo:g}..{hi:g} but the model's output has {classes} classes")
        return labels.astype(np.int64)
    # mse, mae, cosine: targets of the output's shape
    if labels.dtype.kind not in "iuf":
        raise UsageError(f"labels are {labels.dtype.name}; metric {metric} needs numeric targets")
    if labels.size != out.size:
        if labels.ndim == 1 and labels.dtype.kind in "iu" and classes > 1:
            raise UsageError(f"metric {metric} compares the output with targets of its shape, but the labels are "
                             f"class indices [{n}] and output {name} is {list(out.shape)}; use --metric top1")
        raise UsageError(f"metric {metric}: labels have shape {list(labels.shape)} but output {name} has "
                         f"{list(out.shape)}; give targets with the output's shape")
    return labels


def metric_rows(metric: str, outputs: list[np.ndarray], labels) -> Rows | None:
    """A text metric's per-row parts (measure.textmetrics.Rows), for the paired bootstrap of a difference; None
    for a metric that has a per-sample loss (its paired test needs no resampling) or none of optkit's."""
    if metric not in TEXT_METRICS or labels is None:
        return None
    rows = rows_of(metric, outputs, labels)
    return None if rows.per_row is not None else rows
