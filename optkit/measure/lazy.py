"""Samples read on demand (`LazyArray`): image folders, .npy files and large uncompressed .npz members are
indexed without reading the whole data set."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

CHUNK = 64  # samples read at a time when a lazy array is scanned whole


class LazyArray:
    """An array of samples read on demand: `read(indices)` gives the samples at those positions (a 1-D int
    array, sorted or not) as one ndarray. Indexing on the first axis (an int, a slice, an index array, a
    tuple whose first item is one of those) reads only those samples; `np.asarray` reads them all.
    `checks`: whether `read` itself refuses NaN/Inf (decoded images); otherwise the values are scanned once
    at load (`_checked`). `lengths`: for token sequences padded at the end (text data), each sample's real
    length, by which core.batching batches samples of like length and cuts each call to its longest."""

    def __init__(self, read: Callable[[np.ndarray], np.ndarray], n: int, sample_shape: tuple, dtype,
                 index: np.ndarray | None = None, checks: bool = False, lengths: np.ndarray | None = None):
        self._read, self._n = read, n
        self._index = np.arange(n) if index is None else np.asarray(index, dtype=np.int64)
        self.sample_shape, self.dtype, self.checks = tuple(sample_shape), np.dtype(dtype), checks
        self._lengths = lengths

    @property
    def lengths(self) -> np.ndarray | None:
        """Each sample's real length (token sequences padded at the end), or None."""
        return None if self._lengths is None else self._lengths[self._index]

    @property
    def shape(self) -> tuple:
        return (len(self._index), *self.sample_shape)

    @property
    def ndim(self) -> int:
        return 1 + len(self.sample_shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return f"LazyArray(shape={self.shape}, dtype={self.dtype})"

    def _get(self, positions: np.ndarray) -> np.ndarray:
        out = self._read(self._index[positions]) if len(positions) else \
            np.empty((0, *self.sample_shape), self.dtype)
        return out

    def __getitem__(self, key):
        first, rest = (key[0], key[1:]) if isinstance(key, tuple) and key else (key, ())
        if isinstance(first, (int, np.integer)):
            pos = int(first) + len(self) if first < 0 else int(first)
            if not 0 <= pos < len(self):
                raise IndexError(f"index {first} is out of bounds for {len(self)} samples")
            arr = self._get(np.array([pos]))[0]
        elif isinstance(first, slice):
            arr = self._get(np.arange(len(self))[first])
        else:
            arr = self._get(np.arange(len(self))[np.asarray(first)])
        return arr[rest] if rest else arr

    def take(self, positions) -> LazyArray:
        """These samples, still unread."""
        return LazyArray(self._read, self._n, self.sample_shape, self.dtype, self._index[np.asarray(positions)],
                         self.checks, self._lengths)

    def map(self, fn: Callable[[np.ndarray], np.ndarray]) -> LazyArray:
        """`fn` applied to every chunk read (a cast, a reshape); its shape and dtype from the first sample."""
        probe = fn(self[:1])
        read = self._read
        lengths = self._lengths if probe.shape[1:] == self.sample_shape else None
        return LazyArray(lambda idx: fn(read(idx)), self._n, probe.shape[1:], probe.dtype, self._index, self.checks,
                         lengths)

    def chunks(self, size: int = CHUNK):
        for start in range(0, len(self), size):
            yield self[start:start + size]

    def __array__(self, dtype=None, copy=None):
        arr = self[:]
        return arr if dtype is None else arr.astype(dtype)

    def __getattr__(self, name: str):
        # any other ndarray attribute (min, astype, reshape, ...) reads every sample: callers that do not
        # stream still get arrays that behave as before
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(np.asarray(self), name)


def _delegate(op: str):
    return lambda self, *args: getattr(np.asarray(self), op)(*args)


for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "eq", "ne", "lt", "le", "gt", "ge",
            "neg", "abs", "iter"):
    for _name in (f"__{_op}__", f"__r{_op}__"):
        if hasattr(np.ndarray, _name):
            setattr(LazyArray, _name, _delegate(_name))


def materialize(arr) -> np.ndarray:
    """An ndarray of every sample (a LazyArray is read whole)."""
    return np.asarray(arr) if isinstance(arr, LazyArray) else arr

