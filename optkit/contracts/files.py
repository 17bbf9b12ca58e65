"""The one record of a file optkit made or read, as reports (a stage's input and output) and a package's lineage
(its model, its source, each pass's files) carry it."""
from __future__ import annotations

from optkit.contracts.base import Strict


class FileRef(Strict):
    """A model file: where it was, its format and sha256 (empty for a served model: `bench --url`), the file it
    came from and the pass that made it."""

    path: str
    format: str
    sha256: str
    parent: str | None = None
    produced_by: str | None = None
