"""What every contract shares: the bounds (each declared once: a flag that writes a figure and the reader of the
file it lands in use the same one), strict and open models, reading a file through its model (exit 2 naming the
file and the key), building one for writing (a document its readers would refuse is never written: exit 3), and
the check that a file is for the model at hand.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from optkit.core import strictjson
from optkit.core.errors import PassError, UsageError
from optkit.core.readback import read_regular

# ------------------------------------------------------------------ bounds, each declared once
MAX_VERSION = 2 ** 31 - 1          # Triton's versions are int64; a package keeps to int32 for every tool
MAX_MIB = float(2 ** 24)           # 16 TiB: no server has more memory than this
MAX_MS = 1e9                       # a latency past 11 days is no figure
MAX_THROUGHPUT = 1e9               # requests (samples) per second of one replica
MAX_CORES = 1024                   # CPU cores of one replica
MAX_FILE_BYTES = 64 << 20          # an index, lineage, best.json, split.json or CAPACITY.json is far smaller

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Version = Annotated[int, Field(ge=1, le=MAX_VERSION)]
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")]
TargetName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,63}$")]  # a registered package target's name
Tag = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")]
MiB = Annotated[float, Field(ge=0, le=MAX_MIB)]
Ms = Annotated[float, Field(ge=0, le=MAX_MS)]
Fraction = Annotated[float, Field(ge=0, le=1e6)]
Label = Annotated[str, Field(pattern=r"^[^\x00-\x1f\x7f]{0,512}$")]  # one short line
Text = Label

M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    """Every key optkit writes, of its type; nothing else."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, populate_by_name=True)


class Open(BaseModel):
    """The keys optkit uses, checked; other keys are kept (figures of other groups) but their numbers must be
    finite."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False, populate_by_name=True)

    @model_validator(mode="after")
    def _finite_extras(self):
        for key, value in (self.model_extra or {}).items():
            finite(value, key)
        return self


def finite(value: Any, key: str) -> None:
    """ValueError naming the key of a NaN or infinite number anywhere in `value`."""
    found = strictjson.non_finite(value)
    if found is not None:
        where, bad = found
        raise ValueError(f"{key}{'.' + where if where else ''} is {bad}, not a finite number")


# ------------------------------------------------------------------ reading

def read_bytes(path: Path, limit: int = MAX_FILE_BYTES, *, links: bool = False,
               hint: str = "optkit wrote a file there: remove it") -> bytes:
    """A regular file's bytes, never from a FIFO or device, nor through a link unless `links` (a file the user
    named, not one inside a package); exit 2 otherwise (`hint`: what to do instead)."""
    try:
        return read_regular(path, limit, links=links, hint=hint)
    except FileNotFoundError:
        raise UsageError(f"{path} is missing; package the model again or restore it") from None


def parse(raw: bytes, path: Path | str, hint: str) -> Any:
    """JSON text as optkit writes it: UTF-8 and strict: a NaN or Infinity (which Python's json reads) is exit 2
    naming its key, as any value past its bound is."""
    try:
        data = strictjson.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text (byte {e.start}); {hint}") from None
    except (ValueError, RecursionError) as e:
        raise UsageError(f"{path}: not JSON ({str(e).splitlines()[0][:80]}); {hint}") from None
    found = strictjson.non_finite(data)
    if found is not None:
        raise UsageError(f"{path}: key {found[0] or '(the document)'}: {found[1]} is not a finite number (optkit "
                         f"writes strict JSON); {hint}")
    return data


def load(path: Path, schema: type[M], hint: str, *, links: bool = False) -> tuple[dict, M]:
    """(the JSON document, its validated model); exit 2 with one line naming the file and the key."""
    data = parse(read_bytes(path, links=links), path, hint)
    return data, validate(data, schema, path, hint)


def validate(data: Any, schema: type[M], path: Path | str, hint: str) -> M:
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        raise UsageError(f"{path}: {problem(e)}; {hint}") from None


def problem(e: ValidationError) -> str:
    """The first error of a validation: 'key a.b.0: what is wrong (got X)' on one line."""
    err = e.errors(include_url=False)[0]
    key = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    got = ""
    if err["type"] not in ("missing", "extra_forbidden") and "input" in err and not isinstance(err["input"], dict):
        shown = repr(err["input"])
        got = f" (got {shown if len(shown) <= 40 else shown[:37] + '...'})"
    return f"{'key ' + key + ': ' if key else ''}{msg}{got}".replace("\n", " ")


# ------------------------------------------------------------------ writing

def build(schema: type[M], data: Any, what: str) -> M:
    """The model of a document optkit is about to write, from what the writer computed: as its readers will see
    it (through strict JSON). A document a reader would refuse is a figure optkit got wrong: exit 3, nothing
    written."""
    plain = json.loads(strictjson.dumps(data))
    try:
        return schema.model_validate(plain)
    except ValidationError as e:
        raise PassError(f"optkit computed a {what} its readers would refuse ({problem(e)}); nothing was written: "
                        "run with --debug and report it") from None


def text(doc: BaseModel) -> str:
    """A contract's file as written: the keys the writer set (none added), strict JSON, one trailing newline."""
    return strictjson.dumps(doc.model_dump(by_alias=True, exclude_unset=True), indent=2) + "\n"


# ------------------------------------------------------------------ the model a file is for

def same_model(where: str | Path, key: str, recorded: str | None, sha256: str, model: str, fix: str) -> None:
    """Exit 2 unless the file's `key` records `sha256` (the model at hand): one line naming the file, the key and
    both sha256 prefixes."""
    if recorded == sha256:
        return
    if recorded is None:
        raise UsageError(f"{where}: key {key}: missing, so the file is not tied to a model and cannot be checked to "
                         f"be for {model} (sha256 {sha256[:12]}...); {fix}")
    raise UsageError(f"{where}: key {key}: the file was made for another model (sha256 {recorded[:12]}...), not "
                     f"{model} (sha256 {sha256[:12]}...); {fix}")
