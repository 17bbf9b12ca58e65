"""Which column of a text data file plays which role, and the values of one row by role.

Roles: `text` (and `text_pair`) with a `label` for sentence and sentence-pair data; `tokens` (a list of words)
with `tags` for token classification (CoNLL shape); `question`, `context` and `answers` for question answering
(SQuAD shape). Columns are found by these names (`tags` also as `ner_tags`), or mapped with one option,
`--columns text=5,text_pair=6,label=4` (positions count from 0; names map a header's or a JSON key's name).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from optkit.core.errors import UsageError
from optkit.measure.preprocess import clip

ROLES = ("text", "text_pair", "label", "tokens", "tags", "question", "context", "answers")
ALIASES = {"tags": ("tags", "ner_tags")}
TASKS = {"tokens": "token-classification", "question": "question-answering", "text": "text"}
REQUIRED = {"text": ("text",), "token-classification": ("tokens",), "question-answering": ("question", "context")}
OPTIONAL = {"text": ("text_pair", "label"), "token-classification": ("tags",), "question-answering": ("answers",)}
_ITEM = re.compile(r"\s*([a-z_]+)\s*=\s*(.+?)\s*")


def parse_columns(spec: str | None, where: str = "--columns") -> dict[str, str | int]:
    """`text=5,text_pair=6,label=4` or `text=sentence1,label=score` -> {role: position or name}."""
    if not spec:
        return {}
    out: dict[str, str | int] = {}
    for item in spec.split(","):
        m = _ITEM.fullmatch(item)
        if not m:
            raise UsageError(f"{where} {clip(item, 40)!r} is not role=column; write e.g. text=5,text_pair=6,label=4")
        role, col = m.groups()
        if role not in ROLES:
            raise UsageError(f"{where}: {role!r} is not a role; roles are {', '.join(ROLES)}")
        if role in out:
            raise UsageError(f"{where}: {role} is mapped twice")
        out[role] = int(col) if col.isdigit() else col
    return out


@dataclass(frozen=True)
class Layout:
    """Where each role's values are: {role: key} (a name in a mapping row, a position in a list of fields), and
    the task the roles make."""
    keys: dict[str, Any]
    task: str

    def values(self, row: Any, where: str) -> dict[str, Any]:
        """{role: value} of one row (a list of fields, or a mapping); a missing column is exit 2 naming it."""
        out = {}
        for role, key in self.keys.items():
            if isinstance(row, dict):
                if key not in row:
                    raise UsageError(f"{where} has no {key!r} (the {role} column); it has "
                                     f"{', '.join(map(str, list(row)[:12]))}")
                out[role] = row[key]
            else:
                if key >= len(row):
                    raise UsageError(f"{where} has {len(row)} fields; the {role} column is field {key} (from 0)")
                out[role] = row[key]
        return out


def layout(names: list[str] | None, width: int | None, mapped: dict[str, str | int], source: str,
           positional: bool) -> Layout:
    """The layout of a file whose columns are `names` (a header or the keys; None: a headerless file of `width`
    fields) under the --columns mapping. `positional`: rows are lists of fields (a CSV/TSV), else mappings."""
    if names is None and any(isinstance(v, str) for v in mapped.values()):
        bad = next(k for k, v in mapped.items() if isinstance(v, str))
        raise UsageError(f"--columns {bad}={mapped[bad]}: {source} has no header row to find {mapped[bad]!r} in; "
                         f"give positions (from 0), e.g. {bad}=0")
    found: dict[str, int | str] = {}
    for role, col in mapped.items():
        count = len(names) if names is not None else width
        if isinstance(col, int) and count is not None and col >= count:
            raise UsageError(f"--columns {role}={col}: {source} has {count} columns (0..{count - 1})")
        if isinstance(col, str) and col not in names:
            raise UsageError(f"--columns {role}={col}: {source} has no column {col!r}; it has "
                             f"{', '.join(map(str, names[:12]))}")
        found[role] = col
    if names is not None:
        for role in ROLES:
            hit = next((a for a in ALIASES.get(role, (role,)) if a in names), None)
            if role not in found and hit is not None:
                found[role] = hit
    task = next((t for role, t in TASKS.items() if role in found), None)
    if task is None:
        have = f"columns {', '.join(map(str, names[:12]))}" if names is not None else f"{width} unnamed fields"
        raise UsageError(f"{source} has no text column (it has {have}); name them with --columns, e.g. "
                         "--columns text=0,label=1 (roles: text, text_pair, label; tokens, tags; question, context, "
                         "answers)")
    for role in REQUIRED[task]:
        if role not in found:
            raise UsageError(f"{source}: {task} data needs a {role!r} column; map it with --columns {role}=...")
    allowed = set(REQUIRED[task]) | set(OPTIONAL[task])
    stray = [r for r in mapped if r not in allowed]
    if stray:
        raise UsageError(f"--columns {stray[0]}: {task} data takes the roles {', '.join(sorted(allowed))}")

    def key(col):
        if positional:
            return col if isinstance(col, int) else names.index(col)
        return names[col] if isinstance(col, int) else col

    return Layout({r: key(c) for r, c in found.items() if r in allowed}, task)
