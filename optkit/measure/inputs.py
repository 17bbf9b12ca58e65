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
