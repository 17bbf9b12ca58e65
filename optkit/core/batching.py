"""Samples on a batch axis: splitting feeds into the calls a model accepts, and joining what comes back."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from optkit.core.errors import UsageError


def fixed_batch(specs: list) -> int | None:
    """The batch size the model fixes on its first dim (all inputs), or None when it is dynamic."""
    dims = {s.shape[0] if s.shape is not None and s.shape and isinstance(s.shape[0], int) and s.shape[0] > 0
            else None for s in specs}
    return dims.pop() if len(dims) == 1 else None


def stackable(specs: list) -> bool:
    """Whether samples can be stacked on a first (batch) axis: every input has one, and it is dynamic on all
    of them or fixed to one size. Scalars, shape tensors and mixed fixed first dims are fed whole instead."""
    firsts = set()
    for s in specs:
        if s.shape is None:
            continue
        if not s.shape:
            return False
        d = s.shape[0]
        firsts.add(d if isinstance(d, int) and d > 0 else None)
    return len(firsts) <= 1


def count(feeds: dict[str, np.ndarray]) -> int:
    return len(next(iter(feeds.values()))) if feeds else 0


def batches(feeds: dict[str, np.ndarray], batch: int):
    """Yield (start, feeds) slices of `batch` samples."""
    for start in range(0, count(feeds), batch):
        yield start, {k: v[start:start + batch] for k, v in feeds.items()}


def trim(specs: list, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feeds cut to a whole number of the model's fixed batches (unchanged for a dynamic batch)."""
    fixed = fixed_batch(specs) if stackable(specs) else None
    n = count(feeds)
    if not fixed or n % fixed == 0:
        return feeds
    if n < fixed:
        raise UsageError(f"no sample to run: {n} samples for a model with a fixed batch of {fixed}")
    return {k: v[:n - n % fixed] for k, v in feeds.items()}


def join(parts: list) -> np.ndarray:
    """One output from its per-batch parts: concatenated on the batch axis, stacked when they are scalars,
    flattened when their shapes differ past the batch axis (a sequence length, say)."""
    parts = [np.asarray(p) for p in parts]
    try:
        return np.concatenate(parts, axis=0) if parts[0].ndim else np.stack(parts)
    except ValueError:
        return np.concatenate([p.ravel() for p in parts])


def run_batched(run: Callable[[dict], list], specs: list, feeds: dict[str, np.ndarray], batch: int | None = 64,
                progress: Callable[[int], None] | None = None) -> list[np.ndarray]:
    """Run `run(feeds) -> outputs` over every sample, in slices the model accepts; outputs joined on axis 0.

    Feeds with no batch axis to split on (scalars, shape tensors, mixed fixed first dims) are one whole call.
    A model that fixes its batch takes slices of exactly that size; samples that would not fill the last one
    are an error, never dropped in silence (`trim` first to drop them on purpose)."""
    if not stackable(specs):
        return [np.asarray(x) for x in run(feeds)]
    fixed = fixed_batch(specs)
    n = count(feeds)
    if fixed and n % fixed:
        raise UsageError(f"the model fixes batch size {fixed} but the data has {n} samples")
    step = fixed or batch or n or 1
    chunks = []
    for start, part in batches(feeds, step):
        chunks.append(run(part))
        if progress:
            progress(min(start + step, n))
    if not chunks:
        raise UsageError("no sample to run")
    return [join([c[i] for c in chunks]) for i in range(len(chunks[0]))]
