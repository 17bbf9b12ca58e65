"""Samples: splitting feeds into the calls a model accepts, and joining what comes back.

Feeds always carry a leading sample axis. How one sample of an input becomes part of a call is its layout:
- "batched": the sample lacks the model's first (batch) axis, so samples stack on it (data [N,3,224,224] for
  an input [batch,3,224,224]); when every input is batched, several samples go in one call;
- "whole": the sample is a complete input (data [N,2,1,128] for a state [2,batch,128]; data [N] for a scalar
  input), so the model runs one sample per call and each output gets a leading sample axis.

Token sequences padded at the end (text data: arrays with a `lengths` attribute, each sample's real length) are
batched by length: each WINDOW of samples is sorted by length, each call cut to its longest sample, and each
output with a sequence axis (its dim 1 not fixed) padded back with zeros to the data's width, the samples put back
in their order. So padding does not dominate the time, and every sample's output is where it was.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from optkit.core.errors import UsageError
from optkit.core.shapes import dim_kind, format_shape

WINDOW = 4096   # samples sorted by length at a time: batches of like length, the data read in order otherwise


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


def matches(have, want) -> bool:
    """Whether a concrete shape fits a declared one (dynamic dims fit anything)."""
    return len(have) == len(want) and all(not (isinstance(w, int) and w > 0) or w == h for w, h in zip(want, have))


def batch_axis(spec) -> int:
    """Where an input declares its batch: the first dynamic dim named or placed as one (core.shapes.dim_kind:
    `[2,batch,128]` and `[2,?,128]` give 1), else the first axis."""
    for i, d in enumerate(spec.shape or []):
        if not (isinstance(d, int) and d > 0) and dim_kind(spec.shape, i) == "batch":
            return i
    return 0


def without_batch(spec) -> list | None:
    """The input's shape less its batch axis: what one sample of it is when the data leaves the batch out."""
    if not spec.shape:
        return None
    k = batch_axis(spec)
    return spec.shape[:k] + spec.shape[k + 1:]


def layout(spec, sample_shape) -> str | None:
    """"whole", "batched", or None when a sample of this shape fits the input neither way. Samples are
    "batched" (stacked several to a call) only on a batch axis that comes first; a sample without a batch
    axis that sits elsewhere is made whole first (measure.datasets)."""
    if spec.shape is None:
        return "batched"
    if matches(sample_shape, spec.shape):
        return "whole"
    if spec.shape and batch_axis(spec) == 0 and matches(sample_shape, spec.shape[1:]):
        return "batched"
    return None


def as_samples(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One call's feeds as a single sample (each array gains a leading sample axis of 1)."""
    return {k: np.asarray(v)[None] for k, v in feeds.items()}


def call_as_samples(specs: list, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One call's feeds as samples: split on the batch axis when the model has a common one, else one sample."""
    return feeds if stackable(specs) else as_samples(feeds)


def sequence_lengths(feeds: dict) -> tuple[np.ndarray | None, set[str]]:
    """The samples' real lengths and the feeds that are token sequences padded at the end (see the module);
    (None, set()) for other data."""
    keys = {k for k, v in feeds.items() if getattr(v, "lengths", None) is not None}
    return (np.asarray(feeds[next(iter(sorted(keys)))].lengths) if keys else None), keys


def cut(part: dict, keys: set[str], lengths: np.ndarray) -> tuple[dict, int, int]:
    """A call's token sequences cut to its longest sample: (feeds, width used, full width)."""
    if not keys:
        return part, 0, 0
    width = int(np.shape(part[next(iter(keys))])[1])
    used = max(1, min(width, int(lengths.max()) if len(lengths) else width))
    if used == width:
        return part, width, width
    return {k: (np.asarray(v)[:, :used] if k in keys else v) for k, v in part.items()}, used, width


def first_call(specs: list, feeds: dict[str, np.ndarray], batch: int = 1) -> dict[str, np.ndarray]:
    """The feeds of the first call run_batched would make with `batch` samples (one sample when the inputs
    are not all batched on a common axis); token sequences cut to their longest."""
    by_name = {s.name: s for s in specs}
    layouts = {k: layout(by_name[k], np.shape(v)[1:]) if k in by_name else "batched" for k, v in feeds.items()}
    if all(how == "batched" for how in layouts.values()) and stackable(specs):
        lengths, keys = sequence_lengths(feeds)
        part = {k: v[:batch] for k, v in feeds.items()}
        return cut(part, keys, lengths[:batch])[0] if keys else part
    return {k: v[0:1] if layouts[k] == "batched" else np.asarray(v[0]) for k, v in feeds.items()}


def calls(specs: list, feeds: dict[str, np.ndarray], batch: int = 16):
    """Yield the calls that cover every sample: equal batches of `batch` (the model's fixed batch when it has
    one; a last partial batch is dropped when there is more than one) when every input is batched on a common
    axis, else one sample per call. Calibration uses this: histogram calibrators stack equal batches."""
    by_name = {s.name: s for s in specs}
    n = count(feeds)
    batched = all(layout(by_name[k], np.shape(v)[1:]) == "batched" for k, v in feeds.items() if k in by_name)
    if batched and stackable(specs):
        step = fixed_batch(specs) or batch
        stop = n - n % step if n >= step else n
        for start in range(0, stop, step):
            yield {k: v[start:start + step] for k, v in feeds.items()}
        return
    for i in range(n):
        yield first_call(specs, {k: v[i:i + 1] for k, v in feeds.items()}, 1)


def stack_samples(calls: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Several calls' feeds as samples, one per call."""
    return {k: np.stack([np.asarray(c[k]) for c in calls]) for k in calls[0]}


def run_batched(run: Callable[[dict], list], specs: list, feeds: dict[str, np.ndarray], batch: int | None = 64,
                progress: Callable[[int], None] | None = None, outputs: list | None = None) -> list[np.ndarray]:
    """Run `run(feeds) -> outputs` over every sample of `feeds` (see the module's layouts).

    When every input is batched and the model's batch is dynamic or one fixed size, samples go `batch` at a
    time (exactly the fixed size when it has one; samples that would not fill the last call are an error,
    never dropped in silence: `trim` first to drop them on purpose) and outputs join on their first axis.
    Otherwise each sample is one call, and outputs are stacked on a new sample axis. A model without inputs
    runs once. With the model's `outputs` (specs), token sequences are batched by length (see the module)."""
    if not specs and not feeds:
        return [np.asarray(o) for o in run({})]
    n = count(feeds)
    by_name = {s.name: s for s in specs}
    layouts = {k: layout(by_name[k], np.shape(v)[1:]) if k in by_name else "batched" for k, v in feeds.items()}
    bad = [k for k, how in layouts.items() if how is None]
    if bad:
        raise UsageError(mismatch(by_name[bad[0]], np.shape(feeds[bad[0]])[1:]))
    if all(how == "batched" for how in layouts.values()) and stackable(specs):
        fixed = fixed_batch(specs)
        if fixed and n % fixed:
            raise UsageError(f"the model fixes batch size {fixed} but the data has {n} samples")
        step = fixed or batch or n or 1
        lengths, keys = sequence_lengths(feeds)
        if keys and not fixed and _sequence_outputs(outputs) is not None:
            return _by_length(run, feeds, step, lengths, keys, _sequence_outputs(outputs), progress)
        chunks = []
        for start, part in batches(feeds, step):
            chunks.append(run(part))
            if progress:
                progress(min(start + step, n))
        if not chunks:
            raise UsageError("no sample to run")
        return [join([c[i] for c in chunks]) for i in range(len(chunks[0]))]
    calls = []
    for i in range(n):
        calls.append(run({k: v[i:i + 1] if layouts[k] == "batched" else np.asarray(v[i]) for k, v in feeds.items()}))
        if progress:
            progress(i + 1)
    if not calls:
        raise UsageError("no sample to run")
    return [_stack([c[j] for c in calls]) for j in range(len(calls[0]))]


def _sequence_outputs(outputs: list | None) -> set[int] | None:
    """The positions of the outputs with a sequence axis (dim 1 not fixed); None when an output's shape is unknown
    (then calls are not cut: an output could not be put back)."""
    if outputs is None or any(o.shape is None for o in outputs):
        return None
    return {i for i, o in enumerate(outputs) if len(o.shape) >= 2 and not (isinstance(o.shape[1], int) and o.shape[1] > 0)}


def _by_length(run, feeds: dict, step: int, lengths: np.ndarray, keys: set[str], seq: set[int], progress) -> list:
    """run_batched over token sequences: sorted by length in windows, each call cut, its outputs put back."""
    n = count(feeds)
    order = np.concatenate([w + np.argsort(lengths[w:w + WINDOW], kind="stable") for w in range(0, n, WINDOW)])
    chunks = []
    for start in range(0, n, step):
        idx = order[start:start + step]
        part, used, width = cut({k: v[idx] for k, v in feeds.items()}, keys, lengths[idx])
        outs = [np.asarray(o) for o in run(part)]
        chunks.append([_pad_axis1(o, width) if i in seq and o.ndim >= 2 and o.shape[1] == used else o
                       for i, o in enumerate(outs)])
        if progress:
            progress(min(start + step, n))
    back = np.argsort(order, kind="stable")
    return [join([c[i] for c in chunks])[back] for i in range(len(chunks[0]))]


def _pad_axis1(o: np.ndarray, width: int) -> np.ndarray:
    if o.shape[1] >= width:
        return o
    pad = [(0, 0)] * o.ndim
    pad[1] = (0, width - o.shape[1])
    return np.pad(o, pad)


def mismatch(spec, sample_shape) -> str:
    """The message for a sample that fits an input in no layout: the shapes each layout would take."""
    whole = format_shape(spec.shape)
    ways = []
    if spec.shape:
        k = batch_axis(spec)
        where = "stacked on its batch axis" if k == 0 else f"given a batch of 1 at axis {k}, one per call"
        ways.append(f"{format_shape(without_batch(spec))} (the input without its batch axis; samples {where})")
        ways.append(f"{whole} (the input whole, batch 1, one per call)")
    else:
        ways.append(f"{whole} (a scalar: data [N], one value per call)")
    return (f"data for input {spec.name!r} has per-sample shape {format_shape(list(sample_shape))} but the model "
            f"takes {' or '.join(ways)}")


def _stack(parts: list) -> np.ndarray:
    parts = [np.asarray(p) for p in parts]
    try:
        return np.stack(parts)
    except ValueError:  # shapes differ from call to call (a sequence length, say)
        return np.concatenate([p.ravel() for p in parts])
