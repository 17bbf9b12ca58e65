"""The preprocess of an image data set (`Preprocess`: resize, crop, colour, scale, mean/std, layout, dtype),
checked as a schema, and what it does to one image (`prepare`)."""
from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from optkit.core.errors import UsageError
from optkit.core.registry import config_message

MAX_SIDE = 8192            # resize / center_crop: one side in pixels
MAX_PIXELS = 1 << 26       # one image as resized or prepared: 64M pixels (768 MiB of float32 RGB)
MAX_VALUE = 1e6            # scale, mean, std: a pixel times any of them stays far inside float32's range
DTYPES = ("float32", "float16", "float64", "uint8", "int8", "uint16", "int16", "int32", "int64")


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{v!r} is not a number; {what}")
    try:
        x = float(v)
    except OverflowError:  # an int past float's range
        x = math.inf
    if not math.isfinite(x):
        raise ValueError(f"{short(v)} is not a finite number; {what}")
    if abs(x) > MAX_VALUE:
        raise ValueError(f"{short(v)} is over {MAX_VALUE:g} in size; {what}")
    return x


def _sides(v: Any) -> int | tuple[int, int] | None:
    """resize / center_crop: one side, or [height, width]; whole pixels 1..MAX_SIDE."""
    if v is None:
        return None
    items = list(v) if isinstance(v, (list, tuple)) else [v]
    if isinstance(v, (list, tuple)) and len(items) != 2:
        raise ValueError(f"{short(v)} has {len(items)} items; give one side or [height, width]")
    for x in items:
        if isinstance(x, bool) or not isinstance(x, int):
            raise ValueError(f"{short(x)} is not a whole number of pixels; give 1 to {MAX_SIDE} or [height, width]")
        if not 1 <= x <= MAX_SIDE:
            raise ValueError(f"{x} is out of range: give 1 to {MAX_SIDE} pixels")
    return items[0] if len(items) == 1 else (items[0], items[1])


def short(v: Any, n: int = 60) -> str:
    text = repr(v)
    return text if len(text) <= n else text[:n] + "..."


def clip(text: str, n: int = 200) -> str:
    """A name from a file, short and printable (a control character would break the one-line message)."""
    text = text if text.isprintable() else repr(text)[1:-1]
    return text if len(text) <= n else text[:n] + "..."


def pair(v: int | tuple[int, int]) -> tuple[int, int]:
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
        (ch, cw), (rh, rw) = pair(crop), pair(resize)
        # a shorter-side resize leaves the longer side at least as long: only the shorter side bounds a crop
        fits = min(ch, cw) <= rh if isinstance(resize, int) else (ch <= rh and cw <= rw)
        if not fits:
            raise ValueError(f"{short(v)} is larger than resize {short(resize)}; crop inside the resized image")
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
            raise ValueError(f"{short(v)} has {len(items)} values but the images have {channels} channel"
                             f"{'s' if channels > 1 else ''} (color {info.data.get('color', 'rgb')}); give one "
                             f"number or {channels}")
        xs = [_number(x, "give one finite number or one per channel") for x in items]
        if info.field_name == "std" and any(x == 0 for x in xs):
            raise ValueError(f"{short(v)} would divide pixels by 0; give a std other than 0")
        return xs if isinstance(v, (list, tuple)) else xs[0]

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype(cls, v: Any) -> Any:
        if v not in DTYPES:
            raise ValueError(f"{short(v)} is not a dtype images can be given in; give the model input's type, "
                             f"one of {', '.join(DTYPES)}")
        return v


def parse_preprocess(mapping: Any, where: str = "--preprocess") -> Preprocess:
    """A preprocess from a mapping (a flag's YAML, the Python API): a bad key or value is a UsageError naming
    it, e.g. "--preprocess std: 0 ..." (recipes check the same model as part of the recipe)."""
    if isinstance(mapping, Preprocess):
        return mapping
    if not isinstance(mapping, dict):
        raise UsageError(f"{where} {short(mapping)} is not a mapping; write e.g. '{{resize: 256, center_crop: 224}}'")
    try:
        return Preprocess.model_validate(mapping)
    except ValidationError as e:
        err = e.errors()[0]
        key = clip(str(err["loc"][0]), 40) if err["loc"] else "value"
        unknown = f"unknown key (keys: {', '.join(Preprocess.model_fields)})"
        raise UsageError(f"{where} {key}: {config_message(err, unknown)}") from None



def resized_size(size: tuple[int, int], pre: Preprocess, where) -> tuple[int, int]:
    """(width, height) `prepare` resizes an image of `size` (width, height) to (the shorter side: Python's
    rounding); more than MAX_PIXELS is a UsageError, before any pixel is resized."""
    w, h = size
    if isinstance(pre.resize, int):  # shorter side
        s = pre.resize / min(w, h)
        w, h = max(1, round(w * s)), max(1, round(h * s))
    elif pre.resize is not None:
        h, w = pre.resize
    if w * h > MAX_PIXELS:
        raise UsageError(f"preprocess resize: {where} would be {w}x{h} pixels, more than {MAX_PIXELS:,}; "
                         "give a smaller resize")
    return w, h


def prepare(im, pre: Preprocess, where) -> np.ndarray:
    """What optkit's PIL path makes of a PIL image: the spec's resize, crop, colour, scale, mean/std, layout and
    dtype (the image's size past MAX_PIXELS once resized: a UsageError, before the resize)."""
    from PIL import Image

    size = resized_size(im.size, pre, where)
    im = im.convert("L" if pre.color == "gray" else "RGB")
    if pre.resize is not None:
        resample = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}[pre.resample]
        im = im.resize(size, resample)
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
    return np.ascontiguousarray(as_dtype(x, pre.dtype, where))


def as_dtype(x: np.ndarray, dtype: str, where) -> np.ndarray:
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
