"""The one JSON writer: every JSON document optkit writes or prints (reports, CAPACITY.json, best.json,
split.json, lineage, the version index, --json output, the text a cache key is a digest of) goes through
`dumps`, so it is strict JSON (RFC 8259).

Python's json writes NaN and Infinity as bare words no other parser reads, and pydantic's model_dump_json writes
them as null (a figure silently lost). Here a non-finite number is refused: PassError (exit 3: a figure optkit
computed), naming the key it sits under. Flags and files read back are checked finite before anything is
computed from them, so a non-finite number reaching a writer is optkit's own figure.

    text = dumps(doc, indent=2)          # a dict, list or pydantic model

Its reader, `loads`, is what every file optkit wrote is read back with: a key given twice in one object (which
Python's json, jq and others resolve differently: the last, the first) is a ValueError naming it, as broken JSON is.

One document says otherwise for its own figures: a report (report/schema.py) writes a figure that is not finite
(a fidelity error past any bound, a ratio of nothing) as null, which its readers (report/figures.py) read as not
bounded; `dumps(report, nulls=True)` does that, and only that.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

from optkit.core.errors import PassError


def plain(obj: Any) -> Any:
    """A pydantic model as its plain data (aliases as written: `schema`, `pass`); anything else as it is."""
    dump = getattr(obj, "model_dump", None)
    return dump(by_alias=True) if callable(dump) and not isinstance(obj, type) else obj


def _default(value: Any) -> Any:
    """What json does not know but optkit's documents hold: paths, sets, numpy numbers and arrays, pydantic
    models."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (set, frozenset)):   # as pydantic's JSON writes them
        return list(value)
    if hasattr(value, "model_dump") and not isinstance(value, type):
        return plain(value)
    item, tolist = getattr(value, "item", None), getattr(value, "tolist", None)
    if callable(tolist) and type(value).__module__ == "numpy":
        return tolist()
    if callable(item) and type(value).__module__ == "numpy":
        return item()
    raise TypeError(f"{type(value).__name__} is not JSON")


def dumps(obj: Any, *, indent: int | None = None, sort_keys: bool = False, separators: tuple[str, str] | None = None,
          default: Callable[[Any], Any] | None = None, nulls: bool = False) -> str:
    """`obj` as strict JSON text; PassError (exit 3) naming the key of a NaN or infinite number (null instead
    with `nulls`: a report's figures)."""
    fallback = _default if default is None else default
    if nulls:
        obj = _nulled(plain(obj), fallback)
    try:
        return json.dumps(plain(obj), indent=indent, sort_keys=sort_keys, separators=separators, allow_nan=False,
                          default=fallback, ensure_ascii=True)
    except ValueError as e:
        where = non_finite(plain(obj), fallback)
        if where is None:
            raise
        key, value = where
        raise PassError(f"a computed figure is {value} at key {key or '(the document)'}: optkit writes strict JSON "
                        "(no NaN or Infinity), so nothing was written; run with --debug and report it") from e
    except TypeError as e:
        raise PassError(f"cannot write JSON: {e}") from None


def _nulled(value: Any, fallback: Callable[[Any], Any]) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _nulled(v, fallback) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nulled(v, fallback) for v in value]
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    try:
        return _nulled(fallback(value), fallback)
    except TypeError:
        return value


def non_finite(obj: Any, fallback: Callable[[Any], Any] = _default) -> tuple[str, float] | None:
    """(the dotted key, the value) of the first NaN or infinite number in `obj`, or None."""
    stack: list[tuple[Any, str]] = [(obj, "")]
    while stack:
        value, key = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                return key, value
            continue
        if isinstance(value, (str, int, bool)) or value is None:
            continue
        if isinstance(value, dict):
            stack.extend((v, f"{key}.{k}" if key else str(k)) for k, v in reversed(list(value.items())))
        elif isinstance(value, (list, tuple)):
            stack.extend((v, f"{key}.{i}" if key else str(i)) for i, v in reversed(list(enumerate(value))))
        else:
            try:
                stack.append((fallback(value), key))
            except TypeError:
                continue
    return None


def loads(text: str | bytes) -> Any:
    """JSON text as optkit reads back a file it wrote: json.loads, and a key given twice in one object is a
    ValueError naming it (readers disagree on which of the two counts). RecursionError for nesting too deep."""
    return json.loads(text, object_pairs_hook=_unique)


def _unique(pairs: list[tuple[str, Any]]) -> dict:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"key {key[:40]!r} is given twice in one object")
    return doc
