"""Tensor signatures, and `--shape name=1x3x224x224` parsing and application to them."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from optkit.core.errors import UsageError


@dataclass
class TensorSpec:
    name: str
    shape: list | None   # ints; None or a string for a dynamic dim; None for an unknown rank
    dtype: str           # numpy dtype name, e.g. "float32"

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def dynamic(self) -> bool:
        return self.shape is None or any(not (isinstance(d, int) and d > 0) for d in self.shape)


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
        shapes[name.strip()] = shape
    return shapes


def resolve_shape(name: str, declared: list, overrides: dict[str, list[int]], n_inputs: int,
                  default_batch: int = 1) -> list[int]:
    """The concrete shape to feed input `name`: the override if given, else declared with dynamic dims set.

    A dynamic first dim becomes `default_batch`; another dynamic dim needs an override.
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
        elif i == 0:
            shape.append(default_batch)
        else:
            raise UsageError(
                f"input {name!r} has a dynamic dimension {i} ({format_shape(declared)}); "
                f"set it with --shape {name}=" + "x".join(str(x) if isinstance(x, int) and x > 0 else "N" for x in declared)
            )
    return shape


def check_unused(overrides: dict[str, list[int]], names: list[str]) -> None:
    for key in overrides:
        if key and key not in names:
            raise UsageError(f"--shape names input {key!r}, but the model's inputs are {', '.join(names)}")
        if not key and len(names) != 1:
            raise UsageError(f"the model has {len(names)} inputs ({', '.join(names)}): write --shape NAME=DIMS")


def format_shape(shape) -> str:
    if shape is None:
        return "[unknown]"
    return "[" + ",".join("?" if d is None or (isinstance(d, int) and d < 0) else str(d) for d in shape) + "]"
