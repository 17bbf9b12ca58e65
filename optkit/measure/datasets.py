"""Labelled and unlabelled data: .npz / .npy files, image folders and MNIST-style IDX files.

Image folders, .npy files and the uncompressed members of an .npz are read lazily (`LazyArray`): indexing
reads only the samples asked for, so evaluation and calibration that walk the data a batch at a time hold one
batch of inputs, not the data set (`Dataset.bind(specs, stream=True)`)."""
from __future__ import annotations

import gzip
import math
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optkit.core.batching import batch_axis, layout, matches, mismatch, without_batch
from optkit.core.errors import UsageError
from optkit.core.text import first_line
from optkit.measure.images import image_folder
from optkit.measure.lazy import CHUNK, LazyArray, materialize
from optkit.measure.preprocess import DTYPES, Preprocess, as_dtype, parse_preprocess
from optkit.measure.text import TextOptions, is_text_data, load_text

__all__ = ["CHUNK", "DTYPES", "LABELS", "Dataset", "LazyArray", "Preprocess", "load_dataset", "materialize",
           "parse_preprocess", "read_idx"]

LABELS = "labels"


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
                 labels: str | Path | None = None, *, model: str | Path | None = None, text=None) -> Dataset:
    """Load .npz, an image folder or IDX images (labels from `labels` or a sibling file).

    An image folder's labels: by default each class sub-folder's position in sorted order. `labels` may give
    them instead: a CSV of `file,class_index` rows (header optional, files relative to the folder; the
    images are exactly the files it lists) or a .txt class list (one class name per line, line number =
    class index) through which the sub-folder names map. A folder without sub-folders that holds a
    `labels.csv` uses it.

    Text data (CSV, TSV, JSONL, Parquet, a `datasets` folder: measure.text) is tokenized by `model`'s own
    tokenizer; `text` (measure.text.TextOptions) says how it is read.
    """
    path = Path(spec)
    pre = parse_preprocess(preprocess or {}, "preprocess")
    if not path.exists():
        raise UsageError(f"data {path} not found")
    if is_text_data(path):
        return load_text(path, text or TextOptions(), model)
    if path.is_dir():
        images, ys, classes = image_folder(path, pre, labels)
        return _checked(Dataset({"": images}, ys, str(path), classes, pre.dtype))
    name = path.name.lower()
    if name.endswith(".npz"):
        return _checked(_npz(path))
    if name.endswith(".npy"):
        return _checked(_npy(path, labels))
    if "idx" in name or name.endswith(("-ubyte", "-ubyte.gz")):
        return _checked(_idx_dataset(path, labels, pre))
    raise UsageError(f"cannot read data {path}: expected an .npz, an .npy, an image folder, IDX (-ubyte) files, or text "
                     "(.csv, .tsv, .txt, .jsonl, .parquet, a datasets folder)")


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


MAX_IDX_BYTES = 1 << 30   # an IDX file's data as its header declares it (EMNIST's largest set: 638 MB)


def read_idx(path: Path) -> np.ndarray:
    """The array of an IDX file (.gz or not): the header's dims bounded (MAX_IDX_BYTES) before the data is read,
    and exactly that much read (a small .gz cannot unpack to more)."""
    opener = gzip.open if path.suffix == ".gz" else open
    dtypes = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    try:
        with opener(path, "rb") as f:
            zero, dtype_code, ndim = struct.unpack(">HBB", f.read(4))
            if zero != 0 or dtype_code not in dtypes:
                raise UsageError(f"{path} is not an IDX file (bad magic number)")
            dims = struct.unpack(f">{ndim}I", f.read(4 * ndim))
            size = math.prod(dims)
            if size * np.dtype(dtypes[dtype_code]).itemsize > MAX_IDX_BYTES:
                raise UsageError(f"{path} declares {'x'.join(map(str, dims))} values "
                                 f"({size * np.dtype(dtypes[dtype_code]).itemsize:,} bytes), more than "
                                 f"{MAX_IDX_BYTES:,}; give a smaller IDX file")
            data = f.read(size * np.dtype(dtypes[dtype_code]).itemsize + 1)
    except (OSError, struct.error, EOFError, zlib.error) as e:
        raise UsageError(f"cannot read {path} as an IDX file: {first_line(e)}") from None
    arr = np.frombuffer(data, dtype=dtypes[dtype_code], count=len(data) // np.dtype(dtypes[dtype_code]).itemsize)
    if arr.size != size:
        raise UsageError(f"{path} is truncated or has trailing data: header says {dims}, found "
                         f"{'more' if arr.size > size else arr.size} values")
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
    return Dataset({"": as_dtype(x, pre.dtype, path)}, y, str(path), dtype=pre.dtype)
