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
    (core.shapes). `values` sets scalar inputs (`--value sr=16000`). Integer inputs stay inside their
    `value_range` (token ids inside the embedding table), masks are all ones, other integers are 0 or 1 (safe
    as ids, masks and indices), and a scalar named as a sample rate is 16000. Any other scalar (a threshold, a
    trip count, a flag) has no value optkit could guess: it is named in a UsageError.
    """
    shapes, values = shapes or {}, values or {}
    names = [s.name for s in specs]
    check_unused(shapes, names)
    check_values(specs, values)
    unknown = [s for s in specs if not guessable(s, values)]
    if unknown:
        s = unknown[0]
        raise UsageError(f"input {s.name!r} is a {s.dtype} scalar whose value optkit cannot guess (a threshold, a "
                         f"count or a flag changes what the model computes); give it in the data or with "
                         f"--value {s.name}=V")
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
        elif not shape:
            feeds[spec.name] = np.array(16000, dtype=dtype)  # a sample rate: the only scalar guessed (guessable)
        elif np.issubdtype(dtype, np.integer):
            feeds[spec.name] = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            feeds[spec.name] = rng.random(shape, dtype=np.float32).astype(dtype)
    return feeds


def is_scalar(spec) -> bool:
    """A rank-0 input, or one of fixed size 1 ([1], [1,1]): a setting, not data."""
    return spec.shape is not None and all(isinstance(d, int) and d == 1 for d in spec.shape)


def guessable(spec, values: dict) -> bool:
    """Whether a synthesized value of `spec` is meaningful: every non-scalar is (random data of its dtype);
    a scalar only when given, when the model bounds it (an index) or marks it a mask, or when it is named as
    a sample rate."""
    dtype = input_dtype(spec)  # a type optkit cannot feed is named as such first
    if spec.shape != [] or spec.name in values or ("" in values and len(values) == 1):
        return True
    if spec_mask(spec) or getattr(spec, "value_range", None) or str(spec.dtype) in ("string", "tensor(string)"):
        return True
    return bool(SAMPLE_RATE.search(spec.name)) and np.issubdtype(dtype, np.number)


def check_values(specs: list, values: dict) -> None:
    """`--value` names inputs of the model, and only scalar ones (data goes in --data)."""
    check_unused(values, [s.name for s in specs], flag="--value")
    for spec in specs:
        if (spec.name in values or ("" in values and len(specs) == 1)) and not is_scalar(spec):
            raise UsageError(f"--value {spec.name}: input {spec.name!r} is not a scalar (it takes "
                             f"{format_shape(spec.shape)}); --value sets scalar inputs, give tensors with --data")


def spec_mask(spec) -> bool:
    return bool(getattr(spec, "mask", False))


def probe(specs: list, run, shapes: dict[str, list[int]] | None = None, values: dict[str, float] | None = None,
          seed: int = 0, advice: str = "give data or set them with --shape NAME=DIMS") -> tuple[dict[str, list[int]], str]:
    """Concrete shapes for inputs whose dims nobody set: the ladders' rungs are tried in order until `run`
    (one call of the model) accepts the synthesized inputs. Returns (shapes for every input, how they were
    found). A UsageError names what the user must give when no rung runs (`advice`: the command's own flags)."""
    shapes, values = dict(shapes or {}), values or {}
    open_dims = [s for s in specs if s.shape is not None and s.name not in shapes and "" not in shapes
                 and any(not (isinstance(d, int) and d > 0) for d in s.shape)]
    if not open_dims:
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
    raise UsageError(f"no shape tried for the dynamic dims of {dims} runs ({reason}); {advice}")


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
