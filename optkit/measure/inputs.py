"""Model inputs: synthesized from the signature (deterministic), or taken from data."""
from __future__ import annotations

import numpy as np

from optkit.core.shapes import check_unused, resolve_shape


def synthesize(specs: list, shapes: dict[str, list[int]] | None = None, batch: int = 1, seed: int = 0,
               ) -> dict[str, np.ndarray]:
    """Random inputs that honour each input's dtype; dynamic dims come from `shapes` (batch for dim 0)."""
    shapes = shapes or {}
    check_unused(shapes, [s.name for s in specs])
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        shape = resolve_shape(spec.name, spec.shape, shapes, len(specs), default_batch=batch)
        dtype = np.float32 if spec.dtype == "bfloat16" else np.dtype(spec.dtype)
        if dtype == np.bool_:
            feeds[spec.name] = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer):
            feeds[spec.name] = rng.integers(0, 2, size=shape).astype(dtype)  # safe as ids, masks and indices
        else:
            feeds[spec.name] = rng.random(shape, dtype=np.float32).astype(dtype)
    return feeds


def batches(arrays: dict[str, np.ndarray], batch: int):
    """Yield (start, feeds) slices of `batch` samples."""
    n = len(next(iter(arrays.values())))
    for start in range(0, n, batch):
        yield start, {k: v[start:start + batch] for k, v in arrays.items()}


def fixed_batch(specs: list) -> int | None:
    """The batch size the model fixes on its first dim (all inputs), or None when it is dynamic."""
    dims = {s.shape[0] if s.shape is not None and s.shape and isinstance(s.shape[0], int) and s.shape[0] > 0 else None for s in specs}
    return dims.pop() if len(dims) == 1 else None
