"""Tensor signatures, `--shape name=1x3x224x224` and `--value name=V` parsing, and concrete shapes for them.

A dynamic dim the user did not set is filled from a ladder chosen by the dim's name (batch, spatial, sequence,
or unknown); `measure.inputs.probe` walks the ladder's rungs until the runtime accepts the inputs.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from optkit.core.errors import UsageError


@dataclass
class TensorSpec:
    name: str
    shape: list | None   # ints; None or a string for a dynamic dim; None for an unknown rank
    dtype: str           # numpy dtype name, e.g. "float32"
    # what a synthesized value must respect, where the model tells (ONNX): integer inputs' valid range
    # [low, high) (token ids index an embedding table), and inputs that are masks (all ones)
    value_range: tuple[int, int] | None = field(default=None, compare=False)
    mask: bool = field(default=False, compare=False)

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": self.shape, "dtype": self.dtype}

    @property
    def dynamic(self) -> bool:
        return self.shape is None or any(not (isinstance(d, int) and d > 0) for d in self.shape)


MAX_DIM = 1 << 20              # one dimension of a measurement shape
MAX_ELEMENTS = 1 << 28         # elements of one synthesized input (1 GiB of float32)


def parse_shapes(values: list[str] | None) -> dict[str, list[int]]:
    """Parse `name=1x3x8x8` items; a bare `1x3x8x8` applies to the model's only input (key "")."""
    shapes: dict[str, list[int]] = {}
    for item in values or []:
        name, _, dims = item.rpartition("=")
        try:
            shape = [int(d) for d in dims.lower().replace(",", "x").split("x")]
        except ValueError:
            raise UsageError(f"bad --shape {item!r}: expected name=1x3x224x224 (positive integers joined by x)") from None
        if not shape or any(d <= 0 for d in shape):
            raise UsageError(f"bad --shape {item!r}: every dimension must be a positive integer")
        if len(shape) > 16 or max(shape) > MAX_DIM or math.prod(shape) > MAX_ELEMENTS:
            raise UsageError(f"bad --shape {item!r}: at most 16 dims of at most {MAX_DIM:,} each and "
                             f"{MAX_ELEMENTS:,} elements")
        if name.strip() in shapes:
            raise UsageError(f"--shape {item!r} sets {name.strip() or 'the input'} a second time; give each input once")
        shapes[name.strip()] = shape
    return shapes


# Values tried, in order, for a dynamic dim nobody set, by what its name says it is. The first rung is what
# synthesized inputs use; `measure.inputs.probe` climbs when the runtime refuses it.
LADDERS = {
    "batch": (1,),
    # images 224, 320, 640 square; then text-line crops (OCR recognizers take height 48 or 32, any width)
    "height": (224, 320, 640, 48, 32, 64),
    "width": (224, 320, 640, 320, 320, 256),
    "sequence": (128, 64, 16, 512),  # 512: also a speech model's chunk of samples (silero VAD's stft needs >= 192)
    "other": (16, 128, 1, 64, 224, 512, 576, 640, 1024),
}
_KINDS = (
    ("batch", re.compile(r"batch|^(n|b|bs|N|B)$|num_?samples", re.I)),
    ("height", re.compile(r"height|^(h|H)$|^(img|image)_?(h|size)$|^size$", re.I)),
    ("width", re.compile(r"width|^(w|W)$|^(img|image)_?w", re.I)),
    ("sequence", re.compile(r"seq|len|token|time|step|frame|word|sentence|^(t|s|T|S|L)$", re.I)),
)


def _dynamic(d) -> bool:
    return not (isinstance(d, int) and d > 0)


def dim_kind(shape: list, index: int) -> str:
    """What dynamic dim `index` of `shape` is: from its symbolic name when it has one, else from its place.
    Unnamed: the first dim is the batch; so is a lone dynamic dim behind a fixed first dim over 1 (a state
    [layers, batch, hidden]); the dynamic dims of an image-like rank-4 input are its height and width."""
    name = shape[index]
    if isinstance(name, str) and name:
        for kind, pattern in _KINDS:
            if pattern.search(name):
                return kind
    if index == 0:
        return "batch"
    open_dims = [i for i, d in enumerate(shape) if _dynamic(d)]
    if open_dims == [index] and isinstance(shape[0], int) and shape[0] > 1:
        return "batch"
    spatial = [i for i in open_dims if i > 0]
    if len(shape) == 4 and spatial in ([2, 3], [1, 2], [2], [3]):
        pair = [2, 3] if spatial[0] >= 2 else [1, 2]  # NCHW, else NHWC
        return "height" if index == pair[0] else "width"
    return "other"


def rungs(specs: list) -> int:
    """How many rungs the ladders of these inputs' dynamic dims have (1 when nothing is dynamic)."""
    kinds = {dim_kind(s.shape, i) for s in specs if s.shape for i, d in enumerate(s.shape) if _dynamic(d)}
    return max((len(LADDERS[k]) for k in kinds), default=1)


def resolve_shape(name: str, declared: list, overrides: dict[str, list[int]], n_inputs: int,
                  default_batch: int = 1, rung: int = 0) -> list[int]:
    """The concrete shape to feed input `name`: the override if given, else declared with dynamic dims set.

    A dynamic dim named or placed as the batch becomes `default_batch`; any other takes its ladder's `rung`.
    """
    override = overrides.get(name, overrides.get("") if n_inputs == 1 else None)
    if declared is None:  # rank unknown (TorchScript)
        if override is None:
            raise UsageError(f"the model does not declare the shape of input {name!r}; set it with --shape {name}=DIMS")
        return list(override)
    if override is not None:
        if declared and len(override) != len(declared):
            raise UsageError(
                f"--shape for input {name!r} has {len(override)} dims but the model expects {len(declared)} "
                f"({format_shape(declared)})"
            )
        for i, (want, have) in enumerate(zip(declared, override)):
            if isinstance(want, int) and want > 0 and want != have:
                raise UsageError(
                    f"--shape for input {name!r} sets dim {i} to {have} but the model fixes it at {want} "
                    f"({format_shape(declared)})"
                )
        return list(override)
    shape = []
    for i, d in enumerate(declared):
        if isinstance(d, int) and d > 0:
            shape.append(d)
        elif dim_kind(declared, i) == "batch":
            shape.append(default_batch)
        else:
            values = LADDERS[dim_kind(declared, i)]
            shape.append(values[min(rung, len(values) - 1)])
    return shape


def parse_values(values: list[str] | None) -> dict[str, float]:
    """Parse `--value name=V` items: the value a scalar input (a sample rate, a threshold) is fed."""
    parsed: dict[str, float] = {}
    for item in values or []:
        name, sep, text = item.partition("=")
        try:
            value = float(text)
        except ValueError:
            value = None
        if not sep or not name.strip() or value is None:
            raise UsageError(f"bad --value {item!r}: expected NAME=NUMBER, e.g. --value sr=16000")
        if not math.isfinite(value):
            raise UsageError(f"bad --value {item!r}: the value must be a finite number")
        if name.strip() in parsed:
            raise UsageError(f"--value {item!r} sets {name.strip()} a second time; give each input once")
        parsed[name.strip()] = int(value) if value.is_integer() else value
    return parsed


def check_unused(overrides: dict, names: list[str], flag: str = "--shape") -> None:
    for key in overrides:
        if key and key not in names:
            raise UsageError(f"{flag} names input {key!r}, but the model's inputs are {', '.join(names)}")
        if not key and len(names) != 1:
            raise UsageError(f"the model has {len(names)} inputs ({', '.join(names)}): write {flag} NAME=...")


def format_shape(shape) -> str:
    if shape is None:
        return "[unknown]"
    return "[" + ",".join("?" if d is None or (isinstance(d, int) and d < 0) else str(d) for d in shape) + "]"
