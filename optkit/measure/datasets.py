"""Labelled and unlabelled data: .npz / .npy files, image folders and MNIST-style IDX files.

Image folders, .npy files and the uncompressed members of an .npz are read lazily (`LazyArray`): indexing
reads only the samples asked for, so evaluation and calibration that walk the data a batch at a time hold one
batch of inputs, not the data set (`Dataset.bind(specs, stream=True)`)."""
from __future__ import annotations

import csv
import gzip
import math
import re
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from optkit.core.batching import batch_axis, layout, matches, mismatch, without_batch
from optkit.core.errors import UsageError
from optkit.core.registry import config_message

LABELS = "labels"
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".pgm"}


MAX_SIDE = 8192            # resize / center_crop: one side in pixels
MAX_PIXELS = 1 << 26       # one image as resized or prepared: 64M pixels (768 MiB of float32 RGB)
DTYPES = ("float32", "float16", "float64", "uint8", "int8", "uint16", "int16", "int32", "int64")


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{v!r} is not a number; {what}")
    try:
        x = float(v)
    except OverflowError:  # an int past float's range
        x = math.inf
    if not math.isfinite(x):
        raise ValueError(f"{_short(v)} is not a finite number; {what}")
    return x


def _sides(v: Any) -> int | tuple[int, int] | None:
    """resize / center_crop: one side, or [height, width]; whole pixels 1..MAX_SIDE."""
    if v is None:
        return None
    items = list(v) if isinstance(v, (list, tuple)) else [v]
    if isinstance(v, (list, tuple)) and len(items) != 2:
        raise ValueError(f"{_short(v)} has {len(items)} items; give one side or [height, width]")
    for x in items:
        if isinstance(x, bool) or not isinstance(x, int):
            raise ValueError(f"{_short(x)} is not a whole number of pixels; give 1 to {MAX_SIDE} or [height, width]")
        if not 1 <= x <= MAX_SIDE:
            raise ValueError(f"{x} is out of range: give 1 to {MAX_SIDE} pixels")
    return items[0] if len(items) == 1 else (items[0], items[1])


def _short(v: Any, n: int = 60) -> str:
    text = repr(v)
    return text if len(text) <= n else text[:n] + "..."


def _clip(text: str, n: int = 200) -> str:
    """A name from a file, short and printable (a control character would break the one-line message)."""
    text = text if text.isprintable() else repr(text)[1:-1]
    return text if len(text) <= n else text[:n] + "..."


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else v


class Preprocess(BaseModel):
    """How to turn image files (or IDX images) into model inputs. Every value is checked here (a file or a
    flag is user input): sides 1..MAX_SIDE with the crop inside the resize, finite numbers, std not 0,
    mean/std one number or one per channel, dtype one of DTYPES (and the model input's: Dataset.bind)."""

    model_config = ConfigDict(extra="forbid")
    resize: int | tuple[int, int] | None = None   # shorter side, or (height, width)
    resample: Literal["nearest", "bilinear", "bicubic"] = "bilinear"   # PIL's filter for resize
    center_crop: int | tuple[int, int] | None = None
    scale: float = 1 / 255                        # multiply uint8 pixels by this
    color: Literal["rgb", "bgr", "gray"] = "rgb"  # before mean/std: it sets how many channels they may name
    mean: float | list[float] | None = None       # after scaling: one number for every channel, or one each
    std: float | list[float] | None = None
    layout: Literal["nchw", "nhwc"] = "nchw"
    dtype: Literal[DTYPES] = "float32"            # must be the model input's element type when given

    @field_validator("resize", mode="before")
    @classmethod
    def _resize(cls, v: Any) -> Any:
        return _sides(v)

    @field_validator("center_crop", mode="before")
    @classmethod
    def _crop(cls, v: Any, info: ValidationInfo) -> Any:
        crop, resize = _sides(v), info.data.get("resize")
        if crop is None or resize is None:
            return crop
        (ch, cw), (rh, rw) = _pair(crop), _pair(resize)
        # a shorter-side resize leaves the longer side at least as long: only the shorter side bounds a crop
        fits = min(ch, cw) <= rh if isinstance(resize, int) else (ch <= rh and cw <= rw)
        if not fits:
            raise ValueError(f"{_short(v)} is larger than resize {_short(resize)}; crop inside the resized image")
        return crop

    @field_validator("scale", mode="before")
    @classmethod
    def _scale(cls, v: Any) -> float:
        x = _number(v, "give the factor pixels are multiplied by, e.g. 0.00392 (1/255) or 1")
        if x <= 0:
            raise ValueError(f"{x:g} must be over 0 (pixels are multiplied by it)")
        return x

    @field_validator("mean", "std", mode="before")
    @classmethod
    def _per_channel(cls, v: Any, info: ValidationInfo) -> Any:
        if v is None:
            return None
        channels = 1 if info.data.get("color") == "gray" else 3
        items = list(v) if isinstance(v, (list, tuple)) else [v]
        if isinstance(v, (list, tuple)) and len(items) not in (1, channels):
            raise ValueError(f"{_short(v)} has {len(items)} values but the images have {channels} channel"
                             f"{'s' if channels > 1 else ''} (color {info.data.get('color', 'rgb')}); give one "
                             f"number or {channels}")
        xs = [_number(x, "give one finite number or one per channel") for x in items]
        if info.field_name == "std" and any(x == 0 for x in xs):
            raise ValueError(f"{_short(v)} would divide pixels by 0; give a std other than 0")
        return xs if isinstance(v, (list, tuple)) else xs[0]

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype(cls, v: Any) -> Any:
        if v not in DTYPES:
            raise ValueError(f"{_short(v)} is not a dtype images can be given in; give the model input's type, "
                             f"one of {', '.join(DTYPES)}")
        return v


def parse_preprocess(mapping: Any, where: str = "--preprocess") -> Preprocess:
    """A preprocess from a mapping (a flag's YAML, the Python API): a bad key or value is a UsageError naming
    it, e.g. "--preprocess std: 0 ..." (recipes check the same model as part of the recipe)."""
    if isinstance(mapping, Preprocess):
        return mapping
    if not isinstance(mapping, dict):
        raise UsageError(f"{where} {_short(mapping)} is not a mapping; write e.g. '{{resize: 256, center_crop: 224}}'")
    try:
        return Preprocess.model_validate(mapping)
    except ValidationError as e:
        err = e.errors()[0]
        key = _clip(str(err["loc"][0]), 40) if err["loc"] else "value"
        unknown = f"unknown key (keys: {', '.join(Preprocess.model_fields)})"
        raise UsageError(f"{where} {key}: {config_message(err, unknown)}") from None


CHUNK = 64  # samples read at a time when a lazy array is scanned whole


class LazyArray:
    """An array of samples read on demand: `read(indices)` gives the samples at those positions (a 1-D int
    array, sorted or not) as one ndarray. Indexing on the first axis (an int, a slice, an index array, a
    tuple whose first item is one of those) reads only those samples; `np.asarray` reads them all.
    `checks`: whether `read` itself refuses NaN/Inf (decoded images); otherwise the values are scanned once
    at load (`_checked`)."""

    def __init__(self, read: Callable[[np.ndarray], np.ndarray], n: int, sample_shape: tuple, dtype,
                 index: np.ndarray | None = None, checks: bool = False):
        self._read, self._n = read, n
        self._index = np.arange(n) if index is None else np.asarray(index, dtype=np.int64)
        self.sample_shape, self.dtype, self.checks = tuple(sample_shape), np.dtype(dtype), checks

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
                         self.checks)

    def map(self, fn: Callable[[np.ndarray], np.ndarray]) -> LazyArray:
        """`fn` applied to every chunk read (a cast, a reshape); its shape and dtype from the first sample."""
        probe = fn(self[:1])
        read = self._read
        return LazyArray(lambda idx: fn(read(idx)), self._n, probe.shape[1:], probe.dtype, self._index, self.checks)

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


@dataclass
class Dataset:
    """Arrays with a leading sample axis. The key "" holds unnamed data, bound to a single-input model."""

    arrays: dict[str, np.ndarray]
    labels: np.ndarray | None = None
    source: str = ""
    classes: list[str] = field(default_factory=list)
    dtype: str | None = None   # images prepared as this dtype (a preprocess's), which the model must take

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def subset(self, n: int | None, seed: int = 0) -> Dataset:
        """A deterministic sample of n items (all of them when n is None or >= len)."""
        if n is not None and n < 1:
            raise UsageError(f"max_samples {n} leaves no samples of {self.source} to use; give 1 or more")
        if n is None or n >= len(self):
            return self
        idx = np.sort(np.random.default_rng(seed).choice(len(self), size=n, replace=False))
        return Dataset({k: v.take(idx) if isinstance(v, LazyArray) else v[idx] for k, v in self.arrays.items()},
                       None if self.labels is None else self.labels[idx], self.source, self.classes, self.dtype)

    def bind(self, specs: list, stream: bool = False) -> dict[str, np.ndarray]:
        """The arrays keyed by the model's input names, cast to their dtypes and per-sample shapes.

        With `stream`, data read lazily stays lazy (`LazyArray`: slices read, cast and check only their
        samples), for callers that walk it a batch at a time; otherwise every sample is read now.

        A sample is either a whole input (the model's full shape, its batch dim 1 wherever it sits, e.g.
        [2,1,128] for a state [2,batch,128]; a scalar input takes an (N,) array) or an input without its first
        (batch) axis; see core.batching. It may also differ from that only by dims of size 1 (e.g. [28,28]
        feeds [1,28,28]).
        """
        names = [s.name for s in specs]
        if set(self.arrays) == {""}:
            if len(specs) != 1:
                raise UsageError(f"{self.source} holds one unnamed array but the model has {len(specs)} inputs "
                                 f"({', '.join(names)}); use an .npz with one array per input")
            named = {names[0]: self.arrays[""]}
        else:
            missing = [n for n in names if n not in self.arrays]
            if missing:
                raise UsageError(
                    f"{self.source} has arrays {', '.join(sorted(self.arrays))} but the model's inputs are "
                    f"{', '.join(names)}; name the arrays after the inputs (missing: {', '.join(missing)})"
                )
            named = {n: self.arrays[n] for n in names}
        bound = {}
        for s in specs:
            arr = named[s.name]
            self._check_dtype(s)
            if isinstance(arr, LazyArray):  # shape and dtype checked before any sample is read
                _fit(np.empty((0, *arr.sample_shape), arr.dtype), s, self.source)
            if isinstance(arr, LazyArray) and stream:
                bound[s.name] = arr.map(lambda chunk, s=s: _fit(chunk, s, self.source))
            else:
                bound[s.name] = _fit(materialize(arr), s, self.source)
        return bound

    def _check_dtype(self, spec) -> None:
        """Images prepared as a dtype other than the default float32 are given as the model takes them, or
        not at all: int8 pixels cast to a float input (or float16 ones) would score a model on other data."""
        if self.dtype in (None, "float32") or self.dtype == spec.dtype:
            return
        raise UsageError(f"preprocess dtype {self.dtype} does not fit input {spec.name!r} of the model, which takes "
                         f"{spec.dtype} ({self.source}); give dtype: {spec.dtype} or leave dtype out")


def _fit(arr: np.ndarray, spec, source: str) -> np.ndarray:
    if arr.dtype.kind == "c":
        raise UsageError(f"data for input {spec.name!r} from {source} is complex ({arr.dtype}); the model expects "
                         f"{spec.dtype} (give the real part, or both parts as their own arrays)")
    if "string" in str(spec.dtype):  # a string input: text data, fed as it is
        if arr.dtype.kind not in "USO":
            raise UsageError(f"data for input {spec.name!r} from {source} holds {arr.dtype} values, but the model "
                             "expects strings")
        return arr.astype(object)
    if arr.dtype.kind not in "biufc":
        raise UsageError(f"data for input {spec.name!r} from {source} holds {arr.dtype} values (text or objects), "
                         f"but the model expects {spec.dtype} numbers")
    if spec.shape is None:
        return arr.astype(np.dtype(spec.dtype)) if arr.dtype != np.dtype(spec.dtype) else arr
    have = list(arr.shape[1:])
    first = spec.shape[0] if spec.shape else None
    k = batch_axis(spec)
    if k and layout(spec, have) is None and matches(have, without_batch(spec)):
        arr = np.expand_dims(arr, k + 1)  # a sample of [2,batch,8] given as [2,8]: its batch of 1 at axis k
        have = list(arr.shape[1:])
    if layout(spec, have) == "whole" and have and have[0] == 1 and not (isinstance(first, int) and first > 1):
        arr = arr.reshape((arr.shape[0], *have[1:]))  # a whole input whose batch is the first axis: batched
    elif layout(spec, have) is None:
        # dims of size 1 left out or added: [28,28] for a sample [1,28,28]; [1,2,8] or [2,8,1] for [2,batch,8]
        squeezed = [d for d in have if d != 1]
        for want in _size_one_targets(spec, k):
            if squeezed == [d for d in want if d != 1]:
                arr = arr.reshape((arr.shape[0], *want))
                break
        else:
            raise UsageError(f"{mismatch(spec, have)} (from {source})")
    dtype = np.dtype(spec.dtype) if spec.dtype != "bfloat16" else np.float32
    if arr.dtype != dtype:
        if np.issubdtype(arr.dtype, np.floating) and not np.issubdtype(dtype, np.floating) and dtype != np.bool_:
            if dtype.kind in "iu" and arr.size and not np.allclose(arr, np.round(arr)):
                raise UsageError(f"data for input {spec.name!r} is float but the model expects {dtype.name}")
            if dtype.kind in "iu" and arr.size:
                _check_range(arr, dtype, f"data for input {spec.name!r} from {source}")
        with np.errstate(over="ignore"):
            cast = arr.astype(dtype)
        if dtype.kind == "f" and not np.isfinite(cast).all():  # finite at load, so the cast overflowed
            raise UsageError(f"data for input {spec.name!r} from {source} does not fit {dtype.name}: "
                             f"{int(cast.size - np.count_nonzero(np.isfinite(cast)))} values overflow to Inf")
        arr = cast
    return arr


def _check_range(arr: np.ndarray, dtype: np.dtype, what: str) -> None:
    """Values cast to an integer type fit it (a cast would wrap them silently)."""
    info = np.iinfo(dtype)
    lo, hi = float(arr.min()), float(arr.max())
    if lo < info.min or hi > info.max:
        raise UsageError(f"{what} ranges {lo:g}..{hi:g}, outside {dtype.name} ({info.min}..{info.max})")


def _size_one_targets(spec, k: int) -> list[list[int]]:
    """The fixed per-sample shapes a sample may reach by adding or dropping dims of size 1: the input without
    its batch axis (when it comes first), and the input whole with a batch of 1."""
    fixed = lambda shape: all(isinstance(d, int) and d > 0 for d in shape)  # noqa: E731
    targets = [list(spec.shape[1:])] if k == 0 and len(spec.shape) > 1 else []
    targets.append([1 if i == k else d for i, d in enumerate(spec.shape)])
    return [t for t in targets if t and fixed(t)]


def load_dataset(spec: str | Path, preprocess: Preprocess | dict[str, Any] | None = None,
                 labels: str | Path | None = None) -> Dataset:
    """Load .npz, an image folder or IDX images (labels from `labels` or a sibling file).

    An image folder's labels: by default each class sub-folder's position in sorted order. `labels` may give
    them instead: a CSV of `file,class_index` rows (header optional, files relative to the folder; the
    images are exactly the files it lists) or a .txt class list (one class name per line, line number =
    class index) through which the sub-folder names map. A folder without sub-folders that holds a
    `labels.csv` uses it.
    """
    path = Path(spec)
    pre = parse_preprocess(preprocess or {}, "preprocess")
    if not path.exists():
        raise UsageError(f"data {path} not found")
    if path.is_dir():
        return _checked(_image_folder(path, pre, labels))
    name = path.name.lower()
    if name.endswith(".npz"):
        return _checked(_npz(path))
    if name.endswith(".npy"):
        return _checked(_npy(path, labels))
    if "idx" in name or name.endswith(("-ubyte", "-ubyte.gz")):
        return _checked(_idx_dataset(path, labels, pre))
    raise UsageError(f"cannot read data {path}: expected an .npz, an .npy, an image folder or IDX (-ubyte) files")


def _npz(path: Path) -> Dataset:
    try:
        with zipfile.ZipFile(path) as zf:
            infos = {i.filename[:-4] if i.filename.endswith(".npy") else i.filename: i for i in zf.infolist()}
        with np.load(path, allow_pickle=False) as z:
            arrays = {}
            for k in z.files:
                lazy = _npz_member(path, infos.get(k))
                arrays[k] = lazy if lazy is not None else z[k]
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise UsageError(f"cannot read {path} as .npz: {e}") from None
    labels = arrays.pop(LABELS, None)
    if labels is not None:
        labels = materialize(labels)
    if not arrays:
        raise UsageError(f"{path} holds no input arrays (only {LABELS!r})")
    return Dataset(arrays, labels, str(path))


LAZY_BYTES = 1 << 24  # arrays smaller than this are read whole: reading them lazily saves nothing


def _npz_member(path: Path, info: zipfile.ZipInfo | None) -> LazyArray | None:
    """A large member stored uncompressed, read lazily from its place in the file (None: read it whole)."""
    if info is None or info.compress_type != zipfile.ZIP_STORED or info.file_size < LAZY_BYTES:
        return None
    with open(path, "rb") as f:  # the member's data follows its local header, whose name and extra vary
        f.seek(info.header_offset)
        local = f.read(30)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            return None
        name_len, extra_len = struct.unpack("<HH", local[26:30])
    return _npy_lazy(path, info.header_offset + 30 + name_len + extra_len)


def _npy_lazy(path: Path, offset: int = 0) -> LazyArray | None:
    """The .npy array starting at `offset` in `path`, read a few samples at a time (None: not one to read that
    way: object or Fortran-ordered data, a scalar)."""
    from numpy.lib import format as npy

    with open(path, "rb") as f:
        f.seek(offset)
        version = npy.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npy.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = npy.read_array_header_2_0(f)
        else:
            return None
        start = f.tell()
    if fortran or dtype.hasobject or not shape:
        return None
    row = int(np.prod(shape[1:], dtype=np.int64))

    def read(idx: np.ndarray) -> np.ndarray:
        out = np.empty((len(idx), *shape[1:]), dtype)
        with open(path, "rb") as f:
            i = 0
            while i < len(idx):  # runs of consecutive samples in one read each
                j = i + 1
                while j < len(idx) and idx[j] == idx[j - 1] + 1:
                    j += 1
                f.seek(start + int(idx[i]) * row * dtype.itemsize)
                got = np.fromfile(f, dtype, count=(j - i) * row)
                if got.size != (j - i) * row:
                    raise UsageError(f"{path} is truncated: expected {shape[0]} samples of {list(shape[1:])}")
                out[i:j] = got.reshape((j - i, *shape[1:]))
                i = j
        return out

    return LazyArray(read, shape[0], shape[1:], dtype)


def _npy(path: Path, labels: str | Path | None) -> Dataset:
    """One unnamed input array from an .npy file (read lazily), labels from an .npy beside it if given."""
    try:
        arr = _npy_lazy(path)
        if arr is None:
            arr = np.load(path, allow_pickle=False)
        y = np.load(labels, allow_pickle=False) if labels is not None else None
    except (ValueError, OSError, EOFError) as e:
        raise UsageError(f"cannot read {path} as .npy: {e}") from None
    return Dataset({"": arr}, y, str(path))


def _checked(ds: Dataset) -> Dataset:
    """Refuse data that would give figures without meaning: no samples, or NaN / Inf values."""
    named = [(f"array {k!r}" if k else "the images", v) for k, v in ds.arrays.items()]
    if ds.labels is not None:
        named.append((f"array {LABELS!r}", ds.labels))
    for what, v in named:
        if v.ndim == 0:
            raise UsageError(f"{ds.source}: {what} is a scalar (0-d); every array needs a leading sample axis")
    lengths = {k or "images": len(v) for k, v in [*ds.arrays.items(), (LABELS, ds.labels)] if v is not None}
    if len(set(lengths.values())) != 1:
        raise UsageError(f"arrays in {ds.source} have different sample counts: {lengths}")
    if len(ds) == 0:
        raise UsageError(f"{ds.source} holds 0 samples; give data with at least one")
    for what, v in named:
        if v.dtype.kind in "fc" and not getattr(v, "checks", False):
            chunks = v.chunks() if isinstance(v, LazyArray) else [v]
            bad = sum(int(c.size - np.count_nonzero(np.isfinite(c))) for c in chunks)
            if bad:
                hint = "check the preprocess mean/std" if what == "the images" else "clean the data"
                raise UsageError(f"{ds.source}: {what} has {bad} non-finite values (NaN or Inf) out of {v.size}; "
                                 f"{hint}")
    return ds


def read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
        zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
        dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    except (OSError, struct.error, EOFError) as e:
        raise UsageError(f"cannot read {path} as an IDX file: {e}") from None
    dtypes = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if zero != 0 or dtype_code not in dtypes:
        raise UsageError(f"{path} is not an IDX file (bad magic number)")
    arr = np.frombuffer(data, dtype=dtypes[dtype_code], offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise UsageError(f"{path} is truncated: header says {dims}, found {arr.size} values")
    return arr.reshape(dims)


def _idx_dataset(path: Path, labels: str | Path | None, pre: Preprocess) -> Dataset:
    images = read_idx(path)
    if labels is None:  # t10k-images-idx3-ubyte(.gz) -> t10k-labels-idx1-ubyte(.gz)
        guess = path.with_name(path.name.replace("images-idx3", "labels-idx1"))
        labels = guess if guess != path and guess.exists() else None
    y = read_idx(Path(labels)) if labels else None
    if y is not None and y.dtype.kind in "iu":
        y = y.astype(np.int64)  # float labels stay float: _checked refuses NaN, the metric checks the values
    if y is not None and len(y) != len(images):
        raise UsageError(f"{labels} has {len(y)} labels for {len(images)} images")
    for key in ("mean", "std"):
        if np.size(getattr(pre, key)) > 1:
            raise UsageError(f"preprocess {key}: {path} holds one-channel images; give one number, not "
                             f"{np.size(getattr(pre, key))}")
    x = images.astype(np.float32) * pre.scale
    if pre.mean is not None:
        x = x - np.float32(np.ravel(pre.mean)[0])
    if pre.std is not None:
        x = x / np.float32(np.ravel(pre.std)[0])
    return Dataset({"": _as_dtype(x, pre.dtype, path)}, y, str(path), dtype=pre.dtype)


def _image_folder(path: Path, pre: Preprocess, labels: str | Path | None = None) -> Dataset:
    subdirs = sorted(d.name for d in path.iterdir() if d.is_dir())
    if labels is None and not subdirs and (path / "labels.csv").is_file():
        labels = path / "labels.csv"
    classes: list[str] = []
    if labels is not None and Path(labels).suffix.lower() == ".csv":
        files, ys = _csv_labels(Path(labels), path)
    else:
        if not subdirs:
            raise UsageError(f"{path} is a folder without class sub-folders (expected {path}/<class>/<image>, "
                             "or give --labels FILE.csv with file,class_index rows)")
        index = {c: i for i, c in enumerate(subdirs)}
        if labels is not None:
            classes, index = _class_list(Path(labels))
            unknown = [c for c in subdirs if c not in index]
            if unknown:
                raise UsageError(f"folder {path / unknown[0]} is not in the class list {labels} "
                                 f"({len(classes)} names); name the folder as a line of the list names it"
                                 + (f" ({len(unknown)} folders are missing)" if len(unknown) > 1 else ""))
        else:
            classes = subdirs
        files, ys = [], []
        for cls in subdirs:
            for f in sorted((path / cls).iterdir()):
                if f.suffix.lower() in IMAGE_SUFFIXES:
                    files.append(f)
                    ys.append(index[cls])
    if not files:
        raise UsageError(f"no images found under {path}")
    shape = _prepared_shape(files, pre, path)
    return Dataset({"": LazyArray(lambda idx: _read_images(files, idx, pre, shape, path), len(files), shape,
                                  pre.dtype, checks=True)},
                   np.array(ys, dtype=np.int64), str(path), classes, pre.dtype)


def _prepared_shape(files: list[Path], pre: Preprocess, folder: Path) -> tuple:
    """The shape every image takes after `pre`, from the files' headers (no pixels decoded), and the first
    image decoded: a file that is no image, or sizes that differ, are refused now, not mid-run."""
    from PIL import Image

    shapes = set()
    for f in files:
        try:
            with Image.open(f) as im:
                shapes.add(_geometry(im.size, pre, f))
        except OSError as e:
            raise UsageError(f"cannot read image {f}: {e}") from None
    if len(shapes) > 1:
        raise UsageError(f"images under {folder} have different sizes {sorted(shapes)}; set resize and center_crop")
    first = _read_images(files, np.array([0]), pre, None, folder)
    return first.shape[1:]


def _geometry(size: tuple[int, int], pre: Preprocess, where) -> tuple:
    """The shape _prepare gives an image of `size` (width, height); a crop larger than the (resized) image, or
    an image of more than MAX_PIXELS on the way, is refused before any pixel is decoded."""
    w, h = size
    if pre.resize is not None:
        if isinstance(pre.resize, int):
            s = pre.resize / min(w, h)
            w, h = max(1, round(w * s)), max(1, round(h * s))
        else:
            h, w = pre.resize
    if w * h > MAX_PIXELS:
        raise UsageError(f"preprocess resize: {where} would be {w}x{h} pixels, more than {MAX_PIXELS:,}; "
                         "give a smaller resize")
    if pre.center_crop is not None:
        ch, cw = _pair(pre.center_crop)
        if ch > h or cw > w:
            raise UsageError(f"preprocess center_crop: {ch}x{cw} (height x width) is larger than {where}, {h}x{w} "
                             f"{'once resized' if pre.resize is not None else '(set resize)'}; crop inside the image")
        h, w = ch, cw
    c = 1 if pre.color == "gray" else 3
    return (c, h, w) if pre.layout == "nchw" else (h, w, c)


def _read_images(files: list[Path], idx: np.ndarray, pre: Preprocess, shape: tuple | None,
                 folder: Path) -> np.ndarray:
    """The images at `idx`, prepared and stacked; NaN/Inf (from the preprocess's mean/std) refused."""
    from PIL import Image

    out = None
    for k, i in enumerate(idx):
        try:
            with Image.open(files[i]) as im:
                x = _prepare(im, pre, files[i])
        except OSError as e:
            raise UsageError(f"cannot read image {files[i]}: {e}") from None
        if out is None:  # filled in place: one batch of inputs in memory, not two
            out = np.empty((len(idx), *x.shape), x.dtype)
        if x.shape != out.shape[1:] or (shape is not None and x.shape != tuple(shape)):
            sizes = sorted({x.shape, out.shape[1:], *([tuple(shape)] if shape is not None else [])})
            raise UsageError(f"images under {folder} have different sizes {sizes}; set resize and center_crop")
        out[k] = x
    if out.dtype.kind in "fc":
        bad = int(out.size - np.count_nonzero(np.isfinite(out)))
        if bad:
            raise UsageError(f"{folder}: the images has {bad} non-finite values (NaN or Inf) out of {out.size}"
                             f"{' (in the ' + str(len(idx)) + ' images read)' if shape is not None else ''}; "
                             "check the preprocess mean/std")
    return out


MAX_LABELS_BYTES = 1 << 28   # a labels file: 256 MiB holds millions of rows
MAX_LINE = 4096              # one row of a labels CSV or one line of a class list
MAX_CLASS_INDEX = 2**63 - 1  # labels are int64
_INDEX = re.compile(r"-?[0-9]+")
_LONG_LINE = re.compile(rf"[^\n]{{{MAX_LINE + 1}}}")
_CONTENT_LINE = re.compile(r"^[^\n]*[^\s,\"][^\n]*$", re.M)


def _read_labels_text(path: Path) -> str:
    """A labels file's text, its line ends made "\n"; a file or a line longer than any labels file needs, or
    a path that is not a regular file (a folder, a FIFO, a device), is refused."""
    if not path.is_file():
        if path.exists():
            raise UsageError(f"labels {path} is not a regular file (a folder, FIFO or device); give a file")
        raise UsageError(f"labels {path} not found")
    try:
        if path.stat().st_size > MAX_LABELS_BYTES:
            raise UsageError(f"labels {path} is {path.stat().st_size:,} bytes; a labels file is at most "
                             f"{MAX_LABELS_BYTES:,}")
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read labels {path} as text: {e}") from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    long = _LONG_LINE.search(text)   # one pass in C: a file of millions of lines is read in seconds
    if long:
        start = text.rfind("\n", 0, long.start()) + 1
        end = text.find("\n", start)
        line = text[start:end if end >= 0 else len(text)]
        raise UsageError(f"{path} line {text.count(chr(10), 0, start) + 1} is {len(line):,} characters long "
                         f"({_short(line, 40)}); a line of a labels file is at most {MAX_LINE:,}")
    return text


def _rows(text: str):
    """(line number, line) of each line of `text` with more than blanks, commas and quotes in it: blank
    lines are skipped in C, not one by one (a labels file of 100 million empty lines once took minutes)."""
    line, pos = 1, 0
    for m in _CONTENT_LINE.finditer(text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        yield line, m.group()


def _csv_labels(path: Path, folder: Path) -> tuple[list[Path], list[int]]:
    """(image files, class indices) from `file,class_index` rows; a first row whose index is not a number is
    a header; further columns are ignored. Each image once, inside the folder (symlinks resolved)."""
    root = folder.resolve()
    files, ys, first = [], [], True
    seen: dict[Path, tuple[int, int]] = {}   # resolved image -> (line, class index)
    for line, text in _rows(_read_labels_text(path)):
        def bad(msg: str, line=line, text=text) -> UsageError:
            return UsageError(f"{path} line {line}: {msg} (row {_short(text, 200)})")

        try:
            row = [c.strip() for c in next(csv.reader([text]), [])]
        except csv.Error as e:
            raise bad(f"not a CSV row: {e}") from None
        if not any(row):
            continue
        header, first = first, False
        if len(row) < 2 or not row[0]:
            raise UsageError(f"{path} line {line}: expected file,class_index, found {_short(','.join(row))}")
        if not _INDEX.fullmatch(row[1]):
            if header and not (folder / row[0]).is_file():  # a first row naming an image is no header
                continue
            raise UsageError(f"{path} line {line}: class index {_short(row[1])} is not a whole number")
        y = int(row[1])
        if y < 0:
            raise UsageError(f"{path} line {line}: class index {y} is negative")
        if y > MAX_CLASS_INDEX:
            raise bad(f"class index {_clip(row[1], 30)} is too large (at most {MAX_CLASS_INDEX}, and under the "
                      "model's class count)")
        f = folder / row[0]
        try:
            real = f.resolve()
            inside = not Path(row[0]).is_absolute() and real.is_relative_to(root)
            found = f.is_file()
        except (OSError, ValueError):
            inside, found = True, False
        except RuntimeError:   # a symlink loop (Python < 3.13 raises RuntimeError, not OSError)
            raise bad(f"image {_clip(row[0])} is a symlink loop") from None
        if not inside:
            how = "" if Path(row[0]).is_absolute() or ".." in Path(row[0]).parts else " (through a symlink)"
            raise bad(f"image {_clip(row[0])} is outside {folder}{how}; rows name files inside the folder")
        if not found:
            if f.exists():
                raise bad(f"image {_clip(row[0])} is not a regular file (a folder, FIFO or device)")
            raise UsageError(f"{path} line {line}: image {_clip(row[0])} not found in {folder}")
        if real in seen:
            was, y0 = seen[real]
            raise bad(f"image {_clip(row[0])} is listed again (first on line {was}, class {y0}); list each image "
                      "once" if y0 == y else
                      f"image {_clip(row[0])} is under class {y} here but under class {y0} on line {was}; give each "
                      "image one class")
        seen[real] = (line, y)
        files.append(f)
        ys.append(y)
    if not files:
        raise UsageError(f"{path} lists no images (expected file,class_index rows)")
    return files, ys


def _class_list(path: Path) -> tuple[list[str], dict[str, int]]:
    """The class names of a .txt list (line number = class index) and an index by name; a line such as
    `n01440764 tench, Tinca tinca` also names its class by its first word."""
    if path.suffix.lower() != ".txt":
        raise UsageError(f"labels {path} for an image folder: give a .csv (file,class_index rows) or a .txt "
                         "class list (one class name per line)")
    lines = [ln.strip() for ln in _read_labels_text(path).splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise UsageError(f"class list {path} is empty")
    index: dict[str, int] = {}
    for i, name in enumerate(lines):
        if not name:
            raise UsageError(f"class list {path} line {i + 1} is empty; every line up to the last names a class")
        if name in index:
            raise UsageError(f"class list {path} names {name!r} twice (lines {index[name] + 1} and {i + 1})")
        index[name] = i
    for i, name in enumerate(lines):
        index.setdefault(name.split()[0].rstrip(","), i)
    return lines, index


def _prepare(im, pre: Preprocess, where) -> np.ndarray:
    from PIL import Image

    im = im.convert("L" if pre.color == "gray" else "RGB")
    if pre.resize is not None:
        resample = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}[pre.resample]
        if isinstance(pre.resize, int):  # shorter side
            w, h = im.size
            s = pre.resize / min(w, h)
            im = im.resize((max(1, round(w * s)), max(1, round(h * s))), resample)
        else:
            im = im.resize((pre.resize[1], pre.resize[0]), resample)
    if pre.center_crop is not None:
        ch, cw = (pre.center_crop, pre.center_crop) if isinstance(pre.center_crop, int) else pre.center_crop
        w, h = im.size
        left, top = (w - cw) // 2, (h - ch) // 2
        im = im.crop((left, top, left + cw, top + ch))
    x = np.asarray(im, dtype=np.float32) * pre.scale
    if x.ndim == 2:
        x = x[:, :, None]
    if pre.color == "bgr":
        x = x[:, :, ::-1]
    if pre.mean is not None:
        x = x - np.asarray(pre.mean, dtype=np.float32)
    if pre.std is not None:
        x = x / np.asarray(pre.std, dtype=np.float32)
    if pre.layout == "nchw":
        x = x.transpose(2, 0, 1)
    return np.ascontiguousarray(_as_dtype(x, pre.dtype, where))


def _as_dtype(x: np.ndarray, dtype: str, where) -> np.ndarray:
    """Prepared pixels as the preprocess's dtype; an integer dtype takes whole values in its range only (a
    cast would truncate 0..1 to 0 or wrap 200 to -56)."""
    want = np.dtype(dtype)
    if want.kind in "iu" and not np.isfinite(x).all():
        raise UsageError(f"preprocess dtype {dtype}: pixels of {where} are not finite after mean and std; check std")
    if want.kind in "iu" and x.size:
        info = np.iinfo(want)
        lo, hi = float(x.min()), float(x.max())
        if not np.array_equal(x, np.round(x)) or lo < info.min or hi > info.max:
            raise UsageError(f"preprocess dtype {dtype}: pixels of {where} after scale, mean and std range "
                             f"{lo:g}..{hi:g}, not whole numbers in {info.min}..{info.max}; set scale, mean and "
                             f"std to give them, or use a float dtype")
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(want)
