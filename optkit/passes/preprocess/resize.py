"""The resize and centre crop of `preprocess.onnx` as ONNX ops, the work bounded whatever image comes in.

A shorter-side resize enlarges a thin image without limit: a [1,1,W,3] request resized to 272 rows is 272 x 272*W
pixels before a 240 crop (2.9 GB at W=6000). Here the graph never builds more than the crop needs:
- enlarging (shorter side < resize; bilinear / bicubic): only the crop's output pixels are computed, from the
  crop's pre-image, with PIL's own arithmetic (Resample.c: precompute_coeffs in double, 22-bit integer
  coefficients, horizontal then vertical pass, each rounded and clipped to uint8), so the pixels are PIL's;
- shrinking (shorter side >= resize): onnxruntime's antialiased Resize on the whole image, whose output is no
  larger than the image sent; then the crop;
- nearest: the crop's source rows and columns gathered, their indices those PIL takes, so the pixels are PIL's.
And every image is refused in the graph (a Reshape that fails, named for the reason, so the runtime's message
says it) past MAX_PIXELS as sent or once resized, as optkit's PIL path refuses it, or smaller than the crop.
"""
from __future__ import annotations

import math

import numpy as np

from optkit.measure.preprocess import MAX_PIXELS, Preprocess, pair

# PIL's filters as ONNX Resize attributes. PIL antialiases bilinear and bicubic (the filter widens with the
# scale when shrinking); its bicubic is Keys' a = -0.5. Nearest: PIL takes floor((x + 0.5) * in / out), which is
# half_pixel with round_prefer_ceil (up to rounding: a fixed [h, w] or uncropped resize uses these).
RESAMPLE = {
    "nearest": {"mode": "nearest", "coordinate_transformation_mode": "half_pixel", "nearest_mode": "round_prefer_ceil"},
    "bilinear": {"mode": "linear", "coordinate_transformation_mode": "half_pixel", "antialias": 1},
    "bicubic": {"mode": "cubic", "coordinate_transformation_mode": "half_pixel", "antialias": 1,
                "cubic_coeff_a": -0.5},
}
SUPPORT = {"bilinear": 1.0, "bicubic": 2.0}   # PIL's filter support (Resample.c), in source pixels when enlarging
PRECISION_BITS = 22                           # PIL's 8-bit coefficients: 32 - 8 - 2
TOO_LARGE_SENT = f"image larger than 64M pixels ({MAX_PIXELS}) as sent; send a smaller image"
TOO_LARGE_RESIZED = f"image larger than 64M pixels ({MAX_PIXELS}) after resize; send a less elongated image"
TOO_SMALL = "image smaller than center_crop; send a larger image"
TOO_SMALL_RESIZED = "image smaller than center_crop after resize; send a larger image"

DOUBLE, FLOAT, INT32, INT64, UINT8, BOOL = 11, 1, 6, 7, 2, 9   # ONNX element types


def resize_and_crop(b, x: str, pre: Preprocess, symbolic: bool) -> str:
    """`x` (uint8 [N,H,W,C]) resized and centre-cropped as `pre` says, with the refusals above; `symbolic`: the
    input's H and W vary (nothing to refuse when the model fixes them)."""
    crop = pair(pre.center_crop) if pre.center_crop is not None else None
    if pre.resize is None and crop is None and not symbolic:
        return x
    hw = b.op("Shape", [x], start=1, end=3)
    if symbolic:
        hw = _refuse_past(b, hw, TOO_LARGE_SENT)
        if not (isinstance(pre.resize, int) or (pre.resize is None and crop is not None)):
            # nothing below reads hw: the image goes on through a Reshape to its own shape, after the refusal
            shape = b.op("Concat", [b.op("Shape", [x], end=1), hw, b.op("Shape", [x], start=3)], axis=0)
            x = b.op("Reshape", [x, shape])
    if pre.resize is None and crop is None:
        return x
    if pre.resize is None:
        return _crop(b, x, hw, crop)
    if not isinstance(pre.resize, int):  # fixed [h, w]: the output is the spec's size, at most MAX_SIDE^2
        x = b.op("Resize", [x, "", "", b.const(list(pre.resize), np.int64, "sizes")], axes=[1, 2],
                 **RESAMPLE[pre.resample])
        return x if crop is None else _crop(b, x, b.const(list(pre.resize), np.int64, "hw"), crop)
    sizes = _refuse_past(b, _shorter_side(b, hw, pre.resize), TOO_LARGE_RESIZED)
    if crop is None:  # the resized image is the output: MAX_PIXELS bounds it
        return b.op("Resize", [x, "", "", sizes], axes=[1, 2], **RESAMPLE[pre.resample])
    sizes = _refuse(b, b.op("Not", [_all(b, b.op("GreaterOrEqual", [sizes, b.const(list(crop), np.int64, "crop")]))]),
                    TOO_SMALL_RESIZED, sizes)
    start = b.op("Div", [b.op("Sub", [sizes, b.const(list(crop), np.int64, "crop")]), b.const([2, 2], np.int64)])
    if pre.resample == "nearest":
        return _nearest(b, x, hw, sizes, start, crop)
    # enlarging: PIL's arithmetic on the crop alone; otherwise a Resize of the whole image (no larger than it)
    up = b.op("Less", [b.op("ReduceMin", [hw], keepdims=0), b.const(pre.resize, np.int64, "side")])
    grow = b.branch()
    grown = _pil_enlarged(grow, x, hw, sizes, start, crop, SUPPORT[pre.resample])
    shrink = b.branch()
    shrunk = shrink.op("Resize", [x, "", "", sizes], axes=[1, 2], **RESAMPLE[pre.resample])
    shrunk = _slice(shrink, shrunk, start, crop)
    shape = [None, *crop, 1 if pre.color == "gray" else 3]  # declared: shape inference sees the crop's size
    return b.op("If", [up], then_branch=grow.graph("enlarge", grown, UINT8, shape),
                else_branch=shrink.graph("shrink", shrunk, UINT8, shape))


def _shorter_side(b, hw: str, side: int) -> str:
    """sizes = max(1, round((h, w) * side / min(h, w))), in double: the PIL path's sizes, Python's rounding."""
    hwd = b.op("Cast", [hw], to=DOUBLE)
    s = b.op("Div", [b.const([float(side)], np.float64, "side"), b.op("ReduceMin", [hwd], keepdims=1)])
    sized = b.op("Max", [b.op("Round", [b.op("Mul", [hwd, s])]), b.const([1.0], np.float64, "one")])
    return b.op("Cast", [sized], to=INT64)


def _all(b, cond: str) -> str:
    return b.op("Cast", [b.op("ReduceMin", [b.op("Cast", [cond], to=INT64)], keepdims=1)], to=BOOL)


def _refuse_past(b, hw: str, reason: str) -> str:
    """`hw` (height, width), after a node that fails when their product passes MAX_PIXELS."""
    pixels = b.op("ReduceProd", [hw], keepdims=1)
    return _refuse(b, b.op("Greater", [pixels, b.const([MAX_PIXELS], np.int64, "max_pixels")]), reason, hw)


def _refuse(b, bad: str, reason: str, value: str) -> str:
    """`value` (int64) plus a zero that only a Reshape named `reason` makes: to [1] when `bad` ([1] bool) is
    false, to an impossible [2] when it is true, so the runtime fails with the reason in its message."""
    want = b.op("Add", [b.op("Cast", [bad], to=INT64), b.const([1], np.int64, "one")])
    zero = b.op("Reshape", [b.const([0], np.int64, "zero"), want], name=f"{b.prefix}{reason}")
    return b.op("Add", [value, zero])


def _crop(b, x: str, hw: str, crop: tuple[int, int]) -> str:
    """The centre crop: top = (h - ch) // 2, left = (w - cw) // 2, as optkit's PIL path crops; refused in the graph
    when the image is smaller."""
    c = b.const(list(crop), np.int64, "crop")
    hw = _refuse(b, b.op("Not", [_all(b, b.op("GreaterOrEqual", [hw, c]))]), TOO_SMALL, hw)
    return _slice(b, x, b.op("Div", [b.op("Sub", [hw, c]), b.const([2, 2], np.int64, "two")]), crop)


def _slice(b, x: str, start: str, crop: tuple[int, int]) -> str:
    end = b.op("Add", [start, b.const(list(crop), np.int64, "crop")])
    return b.op("Slice", [x, start, end, b.const([1, 2], np.int64, "axes")])


def _axis(b, v: str, i: int) -> str:
    """Element i of a [2] tensor, as [1]."""
    return b.op("Slice", [v, b.const([i], np.int64), b.const([i + 1], np.int64)])


def _nearest(b, x: str, hw: str, sizes: str, start: str, crop: tuple[int, int]) -> str:
    """The crop of PIL's nearest resize, without the resize: the crop's source rows sliced, then its columns and
    rows gathered at the indices PIL takes."""
    rows, cols = (_pil_nearest(b, _axis(b, hw, i), _axis(b, sizes, i), _axis(b, start, i), crop[i]) for i in (0, 1))
    top = _axis(b, rows, 0)
    bottom = b.op("Add", [_axis(b, rows, crop[0] - 1), b.const([1], np.int64)])
    part = b.op("Slice", [x, top, bottom, b.const([1], np.int64, "axes")])
    return b.op("Gather", [b.op("Gather", [part, cols], axis=2), b.op("Sub", [rows, top])], axis=1)


def _pil_nearest(b, n_in: str, n_out: str, first: str, count: int) -> str:
    """The source indices [count] of output pixels first..first+count-1 of PIL's nearest resize n_in -> n_out
    (Geometry.c, ImagingScaleAffine): a running sum in double, in/out * 0.5 then + in/out per pixel (CumSum over
    the first+count pixels, at most MAX_PIXELS / the other side), truncated, clamped into the image."""
    scale = b.op("Div", [b.op("Cast", [n_in], to=DOUBLE), b.op("Cast", [n_out], to=DOUBLE)])
    past = b.op("Add", [first, b.const([count - 1], np.int64)])
    steps = b.op("Concat", [b.op("Mul", [scale, b.const(0.5, np.float64)]), b.op("Expand", [scale, past])], axis=0)
    at = b.op("Slice", [b.op("CumSum", [steps, b.const(0, np.int64)]), first,
                        b.op("Add", [past, b.const([1], np.int64)])])
    last = b.op("Cast", [b.op("Sub", [n_in, b.const([1], np.int64)])], to=DOUBLE)
    return b.op("Cast", [b.op("Min", [b.op("Floor", [at]), last])], to=INT64)


def _pil_taps(b, n_in: str, n_out: str, first: str, count: int, support: float) -> tuple[str, str, str]:
    """PIL's precompute_coeffs + normalize_coeffs_8bpc for output pixels first..first+count-1 of an enlarging
    resize n_in -> n_out (filterscale 1: the filter is not widened): int64 source positions [count, K], int32
    coefficients [count, K] (0 past each pixel's window, its position then clamped into the image), and the
    window's first position [count]. Every step in double, in PIL's order, so the coefficients are PIL's."""
    k = int(math.ceil(support)) * 2 + 1
    n_in_d = b.op("Cast", [n_in], to=DOUBLE)
    scale = b.op("Div", [n_in_d, b.op("Cast", [n_out], to=DOUBLE)])
    xx = b.op("Add", [b.op("Cast", [first], to=DOUBLE), b.const(np.arange(count), np.float64, "range")])
    center = b.op("Mul", [b.op("Add", [xx, b.const(0.5, np.float64)]), scale])
    half = b.const(0.5, np.float64)
    sup = b.const(support, np.float64, "support")
    xmin = b.op("Max", [b.op("Floor", [b.op("Add", [b.op("Sub", [center, sup]), half])]), b.const(0.0, np.float64)])
    xmax = b.op("Min", [b.op("Floor", [b.op("Add", [b.op("Add", [center, sup]), half])]), n_in_d])
    to_col = b.const([1], np.int64, "axes")
    pos = b.op("Add", [b.op("Unsqueeze", [xmin, to_col]), b.const(np.arange(k)[None], np.float64, "taps")])
    inside = b.op("Less", [pos, b.op("Unsqueeze", [xmax, to_col])])
    d = b.op("Add", [b.op("Sub", [pos, b.op("Unsqueeze", [center, to_col])]), half])
    w = b.op("Where", [inside, _filter(b, d, support), b.const(0.0, np.float64)])
    parts = b.op("Split", [w], n_out=k, axis=1)
    total = parts[0]
    for p in parts[1:]:  # PIL's running sum, in its order (a zero past the window adds nothing)
        total = b.op("Add", [total, p])
    w = b.op("Where", [b.op("Equal", [total, b.const(0.0, np.float64)]), w, b.op("Div", [w, total])])
    v = b.op("Mul", [w, b.const(float(1 << PRECISION_BITS), np.float64)])
    neg = b.op("Less", [w, b.const(0.0, np.float64)])
    kint = b.op("Where", [neg, b.op("Ceil", [b.op("Add", [v, b.const(-0.5, np.float64)])]),
                          b.op("Floor", [b.op("Add", [v, half])])])
    pos = b.op("Where", [inside, pos, b.op("Unsqueeze", [xmin, to_col])])
    return b.op("Cast", [pos], to=INT64), b.op("Cast", [kint], to=INT32), b.op("Cast", [xmin], to=INT64)


def _filter(b, d: str, support: float) -> str:
    """PIL's bilinear (support 1) or bicubic (a = -0.5) filter at d, in double, as Resample.c evaluates it."""
    a = b.op("Abs", [d])
    zero = b.const(0.0, np.float64)

    def c(v):
        return b.const(v, np.float64)

    if support == 1.0:
        return b.op("Where", [b.op("Less", [a, c(1.0)]), b.op("Sub", [c(1.0), a]), zero])
    near = b.op("Add", [b.op("Mul", [b.op("Mul", [b.op("Sub", [b.op("Mul", [c(1.5), a]), c(2.5)]), a]), a]), c(1.0)])
    far = b.op("Mul", [b.op("Sub", [b.op("Mul", [b.op("Add", [b.op("Mul", [b.op("Sub", [a, c(5.0)]), a]), c(8.0)]),
                                                  a]), c(4.0)]), c(-0.5)])
    return b.op("Where", [b.op("Less", [a, c(1.0)]), near, b.op("Where", [b.op("Less", [a, c(2.0)]), far, zero])])


def _pil_enlarged(b, x: str, hw: str, sizes: str, start: str, crop: tuple[int, int], support: float) -> str:
    """The crop of PIL's resize of x to `sizes`, enlarging: the source rows the crop's rows read are sliced, the
    horizontal pass computes the crop's columns on them, the vertical pass the crop's rows (each pass: 2^21 plus
    the integer products, >> 22, clipped to 0..255, as PIL's 8-bit passes)."""
    rows = _pil_taps(b, _axis(b, hw, 0), _axis(b, sizes, 0), _axis(b, start, 0), crop[0], support)
    cols = _pil_taps(b, _axis(b, hw, 1), _axis(b, sizes, 1), _axis(b, start, 1), crop[1], support)
    first = _axis(b, rows[2], 0)
    past = b.op("Add", [b.op("ReduceMax", [rows[0]], keepdims=0), b.const(1, np.int64)])
    part = b.op("Slice", [x, first, b.op("Unsqueeze", [past, b.const([0], np.int64)]), b.const([1], np.int64, "axes")])
    # horizontal: [N, rows, W, C] -> gather [N, rows, cw, K, C] (uint8, then int32) -> [N, rows, cw, C]
    taps = b.op("Cast", [b.op("Gather", [part, cols[0]], axis=2)], to=INT32)
    k = b.op("Unsqueeze", [cols[1], b.const([2], np.int64)])
    across = _round8(b, b.op("ReduceSum", [b.op("Mul", [taps, k]), b.const([3], np.int64)], keepdims=0))
    # vertical: [N, rows, cw, C] -> gather [N, ch, K, cw, C] -> [N, ch, cw, C]
    taps = b.op("Gather", [across, b.op("Sub", [rows[0], first])], axis=1)
    k = b.op("Unsqueeze", [rows[1], b.const([2, 3], np.int64)])
    down = _round8(b, b.op("ReduceSum", [b.op("Mul", [taps, k]), b.const([2], np.int64)], keepdims=0))
    return b.op("Cast", [down], to=UINT8)


def _round8(b, acc: str) -> str:
    """PIL's clip8(2^21 + acc): >> 22 (a quotient truncated toward 0 differs from the shift only below 0, where
    both clip to 0), clipped to 0..255; int32."""
    q = b.op("Div", [b.op("Add", [acc, b.const(1 << (PRECISION_BITS - 1), np.int32)]),
                     b.const(1 << PRECISION_BITS, np.int32)])
    return b.op("Clip", [q, b.const(0, np.int32), b.const(255, np.int32)])

