"""What a package reads back that is not one of optkit's contracts (optkit/contracts: best.json, CAPACITY.json,
split.json, the lineage, the version index): the report figures it carries into the lineage, and a version's text
file (a server's config) checked against the sha256 the lineage records. Both are user input: a bad one is exit
2, one line naming the file and the key.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from optkit.contracts.base import read_bytes, validate
from optkit.contracts.lineage import Measured
from optkit.core.errors import UsageError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
TAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
MAX_CONFIG_BYTES = 1 << 20


def check_measured(figures: dict, where: str) -> dict:
    """The report figures a package carries (memory for the manifests, latency and size for inspect)."""
    validate(figures, Measured, where, "give the report of the run that made the model, unedited")
    return figures


def check_recorded_text(path: Path, sha256: str | None, limit: int = MAX_CONFIG_BYTES) -> str:
    """A version's text file (a server's config), before it is served: the bytes optkit recorded in the lineage
    (sha256) and UTF-8, else exit 2. The target checks what the text says."""
    raw = read_bytes(path, limit)
    if sha256 is None:
        raise UsageError(f"{path}: the version's lineage records no sha256 for it (files.{path.name}); "
                         "package the model again")
    if hashlib.sha256(raw).hexdigest() != sha256:
        raise UsageError(f"{path} was edited after optkit packaged it (its sha256 is not the lineage's "
                         f"files.{path.name}); restore it or package the model again")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text (byte {e.start}); package the model again") from None
