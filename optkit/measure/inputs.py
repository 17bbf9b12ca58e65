"""Model inputs: synthesized from the signature (deterministic), or taken from data."""
from __future__ import annotations

import numpy as np

from optkit.core.errors import UsageError
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
        dtype = input_dtype(spec)
        if dtype == np.object_:  # onnxruntime takes string tensors as object arrays
            feeds[spec.name] = np.full(shape, "a", dtype=object)
        elif dtype == np.bool_:
            feeds[spec.name] = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer) and not shape:  # a scalar int is a size, step or count: 0 divides
            feeds[spec.name] = np.array(1, dtype=dtype)
        elif np.issubdtype(dtype, np.integer):
            feeds[spec.name] = rng.integers(0, 2, size=shape).astype(dtype)  # safe as ids, masks and indices
        else:
            feeds[spec.name] = rng.random(shape, dtype=np.float32).astype(dtype)
    return feeds


def input_dtype(spec) -> np.dtype:
    """The numpy dtype to feed an input; a UsageError for types onnxruntime's Python API cannot be fed."""
    name = str(spec.dtype)
    if name == "bfloat16":
        return np.dtype(np.float32)  # TensorFlow and torch take float32 for their bfloat16 inputs
    if name in ("string", "tensor(string)"):
        return np.dtype(object)
    try:
        dtype = np.dtype(name)
    except Exception:  # noqa: BLE001  numpy raises TypeError or ValueError for seq(...), map(...), tensor(int4)
        dtype = None
    if dtype is None or dtype.kind not in "biuf":
        raise UsageError(f"input {spec.name!r} has type {name}, which optkit cannot feed (it feeds numeric, bool "
                         "and string tensors); export the model with float, int or bool inputs instead")
    return dtype


def batches(arrays: dict[str, np.ndarray], batch: int):
    """Yield (start, feeds) slices of `batch` samples."""
    n = len(next(iter(arrays.values())))
    for start in range(0, n, batch):
        yield start, {k: v[start:start + batch] for k, v in arrays.items()}


def fixed_batch(specs: list) -> int | None:
    """The batch size the model fixes on its first dim (all inputs), or None when it is dynamic."""
    dims = {s.shape[0] if s.shape is not None and s.shape and isinstance(s.shape[0], int) and s.shape[0] > 0 else None for s in specs}
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


def join(parts: list) -> np.ndarray:
    """One output from its per-batch parts: concatenated on the batch axis, stacked when they are scalars,
    flattened when their shapes differ past the batch axis (a sequence length, say)."""
    parts = [np.asarray(p) for p in parts]
    try:
        return np.concatenate(parts, axis=0) if parts[0].ndim else np.stack(parts)
    except ValueError:
        return np.concatenate([p.ravel() for p in parts])
