"""Accuracy: a task metric over labelled data, and the model outputs it was computed from."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from optkit.core.errors import UsageError
from optkit.measure.inputs import batches, fixed_batch

LABELLED = ("top1", "top5", "mse", "mae", "cosine")


def _topk(k: int) -> Callable:
    def metric(logits: np.ndarray, labels: np.ndarray) -> float:
        logits = logits.reshape(len(logits), -1)
        top = np.argsort(-logits, axis=1)[:, :k]
        return float((top == labels.reshape(-1, 1)).any(axis=1).mean())
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


BUILTIN = {"top1": _topk(1), "top5": _topk(5), "mse": _mse, "mae": _mae, "cosine": _cosine}


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
    """Run the model over all samples, in batches the model accepts; outputs concatenated on axis 0."""
    fixed = fixed_batch(session.inputs)
    step = fixed or batch or 64
    n = len(next(iter(feeds.values())))
    if fixed and n % fixed:
        raise UsageError(f"the model fixes batch size {fixed} but the data has {n} samples")
    chunks: list[list[np.ndarray]] = []
    for start, part in batches(feeds, step):
        chunks.append(session.run(part))
        if progress:
            progress(min(start + step, n))
    return [np.concatenate([c[i] for c in chunks], axis=0) for i in range(len(chunks[0]))]


def compute(metric: str, outputs: list[np.ndarray], labels: np.ndarray | None) -> dict:
    fn = resolve_metric(metric)
    if labels is None:
        raise UsageError(f"metric {metric!r} needs labels, and the data has none (add a 'labels' array)")
    value = fn(outputs[0], labels)
    if isinstance(value, dict):
        return {k: float(v) for k, v in value.items()}
    return {metric: float(value)}
