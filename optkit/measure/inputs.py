"""Model inputs: synthesized from the signature (deterministic), or taken from data."""
from __future__ import annotations

import re

import numpy as np

from optkit.core.errors import UsageError
from optkit.core.shapes import check_unused, format_shape, resolve_shape, rungs
from optkit.core.text import first_line

SAMPLE_RATE = re.compile(r"^sr$|sample_?rate|sampling_?rate", re.I)  # speech models: 16 kHz is the usual rate


def synthesize(specs: list, shapes: dict[str, list[int]] | None = None, batch: int = 1, seed: int = 0,
               values: dict[str, float] | None = None, rung: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for one call that honour each input's dtype and what the model says about its values.

    Dynamic dims come from `shapes`, else `batch` for batch dims and the ladder's `rung` for the others
    (core.shapes). `values` sets inputs outright (`--value sr=16000`; scalars are filled with it). Integer inputs
    stay inside their `value_range` (token ids inside the embedding table), masks are all ones, other
    integers are 0 or 1 (safe as ids, masks and indices) and a scalar integer is 1 (a size, step or count; 0 divides) or 16000 when named as a sample rate.
    """
    shapes, values = shapes or {}, values or {}
    names = [s.name for s in specs]
    check_unused(shapes, names)
    check_unused(values, names, flag="--value")
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        shape = resolve_shape(spec.name, spec.shape, shapes, len(specs), default_batch=batch, rung=rung)
        dtype = input_dtype(spec)
        value = values.get(spec.name, values.get("") if len(specs) == 1 else None)
        if value is not None:
            feeds[spec.name] = np.full(shape, value, dtype=dtype)
        elif dtype == np.object_:  # onnxruntime takes string tensors as object arrays
            feeds[spec.name] = np.full(shape, "a", dtype=object)
        elif spec_mask(spec):
            feeds[spec.name] = np.ones(shape, dtype=dtype)
        elif dtype == np.bool_:
            feeds[spec.name] = np.asarray(rng.random(shape) < 0.5)  # an array even for a scalar input
        elif np.issubdtype(dtype, np.integer) and getattr(spec, "value_range", None):
            low, high = spec.value_range
            feeds[spec.name] = rng.integers(low, max(high, low + 1), size=shape).astype(dtype)
        elif np.issubdtype(dtype, np.integer) and not shape:
            feeds[spec.name] = np.array(16000 if SAMPLE_RATE.search(spec.name) else 1, dtype=dtype)
        elif np.issubdtype(dtype, np.integer):
            feeds[spec.name] = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            feeds[spec.name] = rng.random(shape, dtype=np.float32).astype(dtype)
    return feeds


def spec_mask(spec) -> bool:
    return bool(getattr(spec, "mask", False))


def probe(specs: list, run, shapes: dict[str, list[int]] | None = None, values: dict[str, float] | None = None,
          seed: int = 0) -> tuple[dict[str, list[int]], str]:
    """Concrete shapes for inputs whose dims nobody set: the ladders' rungs are tried in order until `run`
    (one call of the model) accepts the synthesized inputs. Returns (shapes for every input, how they were
    found). A UsageError names what the user must give when no rung runs."""
    shapes, values = dict(shapes or {}), values or {}
    open_dims = [s for s in specs if s.shape is not None and s.name not in shapes and "" not in shapes
                 and any(not (isinstance(d, int) and d > 0) for d in s.shape)]
    unset_scalars = [s.name for s in specs if s.shape == [] and s.name not in values]
    if not open_dims and not unset_scalars:
        return shapes, "fixed by the model" if not shapes else "given"
    first_error = None
    for rung in range(rungs(open_dims)):
        feeds = synthesize(specs, shapes, 1, seed, values, rung=rung)
        try:
            run(feeds)
        except Exception as e:  # noqa: BLE001 - the runtime refuses these dims: try the next rung
            first_error = first_error or e
            continue
        found = {s.name: list(feeds[s.name].shape) for s in open_dims}
        return shapes | found, ("probed" if rung else "from the dim names") if open_dims else "fixed by the model"
    dims = ", ".join(f"{s.name} {format_shape(s.shape)}" for s in open_dims)
    reason = first_line(first_error)[:160] if first_error else "no shape ran"
    if unset_scalars:
        raise UsageError(f"the model does not run on synthesized inputs ({reason}); it has scalar input(s) "
                         f"{', '.join(unset_scalars)} whose value cannot be guessed: give them in the data or with "
                         f"--value {unset_scalars[0]}=V")
    raise UsageError(f"no shape tried for the dynamic dims of {dims} runs ({reason}); give data or set them with "
                     f"--shape NAME=DIMS")


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
