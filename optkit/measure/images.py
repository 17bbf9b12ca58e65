"""Image folders: a class per sub-folder, or a labels file; the images prepared (optkit.measure.preprocess) and
read lazily, a batch at a time. Every image file optkit decodes is opened by `open_image`: its header is checked
against MAX_PIXELS before any pixel is decoded."""
from __future__ import annotations

import contextlib
import os
import stat
import struct
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from optkit.core.errors import UsageError
from optkit.core.text import first_line
from optkit.measure.labels import class_list, csv_labels
from optkit.measure.lazy import LazyArray
from optkit.measure.preprocess import MAX_PIXELS, Preprocess, pair, prepare, resized_size

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".pgm"}
# what PIL raises on a file it cannot decode: a broken header or stream (PIL's own parsers raise SyntaxError,
# ValueError, struct.error and EOFError as well as OSError)
DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, struct.error)


@contextlib.contextmanager
def open_image(path: Path) -> Iterator:
    """The PIL image of `path`, opened lazily (header only): one of more than MAX_PIXELS (64M) pixels, as its
    header declares, is a UsageError before a pixel is decoded (a 40000x40000 PNG of 65 bytes, or a 462 KB one of
    12500x12000 that decodes to 450 MB); PIL's own decompression-bomb limit is set to the same number, so its
    warning or error never escapes. A file PIL cannot read is a UsageError too, here or while decoding."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    with _regular_file(path) as f:
        with _opened(Image, f, path) as im:
            yield im


def _regular_file(path: Path):
    """The open file of `path`, only when it is a regular file: a FIFO, device or folder named like an image is
    refused without being read (opening a FIFO does not block; reading one would, forever)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise UsageError(f"cannot read image {path}: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"image {path} is not a regular file (a FIFO, device or folder); leave it out")
        return os.fdopen(fd, "rb")
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


@contextlib.contextmanager
def _opened(Image, f, path: Path) -> Iterator:
    """PIL's image of the open file `f`, its size checked against MAX_PIXELS before any pixel is decoded."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(f)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise UsageError(f"image {path} declares more than {MAX_PIXELS:,} pixels (64M), optkit's limit per image; "
                         "downscale it or leave it out") from None
    except Image.UnidentifiedImageError:  # its own words name the open file object, not the path
        raise UsageError(f"cannot read image {path}: not an image file PIL can identify") from None
    except DECODE_ERRORS as e:
        raise UsageError(f"cannot read image {path}: {first_line(e)}") from None
    with im:
        w, h = im.size
        if w * h > MAX_PIXELS:  # PIL's check is skipped where a caller set its limit to None
            raise UsageError(f"image {path} is {w}x{h} pixels, more than {MAX_PIXELS:,} (64M), optkit's limit per "
                             "image; downscale it or leave it out")
        try:
            yield im
        except DECODE_ERRORS as e:
            raise UsageError(f"cannot read image {path}: {first_line(e)}") from None


def image_folder(path: Path, pre: Preprocess, labels: str | Path | None = None
                 ) -> tuple[LazyArray, np.ndarray, list[str]]:
    """The folder's images (read lazily, prepared), their class indices and the class names (none from a CSV)."""
    files, ys, classes = image_files(path, labels)
    shape = _prepared_shape(files, pre, path)
    images = LazyArray(lambda idx: _read_images(files, idx, pre, shape, path), len(files), shape, pre.dtype,
                       checks=True)
    return images, np.array(ys, dtype=np.int64), classes


def image_files(path: Path, labels: str | Path | None = None) -> tuple[list[Path], list[int], list[str]]:
    """The folder's image files in the order image_folder reads them, their class indices and class names."""
    subdirs = sorted(d.name for d in path.iterdir() if d.is_dir())
    if labels is None and not subdirs and (path / "labels.csv").is_file():
        labels = path / "labels.csv"
    classes: list[str] = []
    if labels is not None and Path(labels).suffix.lower() == ".csv":
        files, ys = csv_labels(Path(labels), path)
    else:
        if not subdirs:
            raise UsageError(f"{path} is a folder without class sub-folders (expected {path}/<class>/<image>, "
                             "or give --labels FILE.csv with file,class_index rows)")
        index = {c: i for i, c in enumerate(subdirs)}
        if labels is not None:
            classes, index = class_list(Path(labels))
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
    return files, ys, classes


def _prepared_shape(files: list[Path], pre: Preprocess, folder: Path) -> tuple:
    """The shape every image takes after `pre`, from the files' headers (no pixels decoded), and the first
    image decoded: a file that is no image, or sizes that differ, are refused now, not mid-run."""
    shapes = set()
    for f in files:
        with open_image(f) as im:
            shapes.add(_geometry(im.size, pre, f))
    if len(shapes) > 1:
        raise UsageError(f"images under {folder} have different sizes {sorted(shapes)}; set resize and center_crop")
    first = _read_images(files, np.array([0]), pre, None, folder)
    return first.shape[1:]


def _geometry(size: tuple[int, int], pre: Preprocess, where) -> tuple:
    """The shape `prepare` gives an image of `size` (width, height); a crop larger than the (resized) image, or
    an image of more than MAX_PIXELS on the way, is refused before any pixel is decoded."""
    w, h = resized_size(size, pre, where)
    if pre.center_crop is not None:
        ch, cw = pair(pre.center_crop)
        if ch > h or cw > w:
            raise UsageError(f"preprocess center_crop: {ch}x{cw} (height x width) is larger than {where}, {h}x{w} "
                             f"{'once resized' if pre.resize is not None else '(set resize)'}; crop inside the image")
        h, w = ch, cw
    c = 1 if pre.color == "gray" else 3
    return (c, h, w) if pre.layout == "nchw" else (h, w, c)


def _read_images(files: list[Path], idx: np.ndarray, pre: Preprocess, shape: tuple | None,
                 folder: Path) -> np.ndarray:
    """The images at `idx`, prepared and stacked; NaN/Inf (from the preprocess's mean/std) refused."""
    out = None
    for k, i in enumerate(idx):
        with open_image(files[i]) as im:
            _geometry(im.size, pre, files[i])
            x = prepare(im, pre, files[i])
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


def client_images(path: Path, gray: bool = False, limit: int = 1) -> tuple[list[tuple[Path, np.ndarray]], int]:
    """What a client of a model with preprocessing in its graph sends: the first `limit` images of the folder
    (a flat folder of images, or image_files' order: class sub-folders or labels.csv), each decoded as is to uint8
    [1,H,W,C] (C: 3 RGB, 1 gray), no resize; and how many images the folder holds. An image of more than
    MAX_PIXELS is refused before its pixels are decoded."""
    has_subdirs = any(d.is_dir() for d in path.iterdir())
    if has_subdirs or (path / "labels.csv").is_file():
        files = image_files(path)[0]
    else:
        files = sorted(f for f in path.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise UsageError(f"no images found under {path} ({', '.join(sorted(IMAGE_SUFFIXES))})")
    out = []
    for f in files[:limit]:
        with open_image(f) as im:
            x = np.asarray(im.convert("L" if gray else "RGB"), dtype=np.uint8)
        out.append((f, np.ascontiguousarray((x[:, :, None] if x.ndim == 2 else x)[None])))
    return out, len(files)
