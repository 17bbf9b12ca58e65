"""Turning exceptions into the one line a user reads."""
from __future__ import annotations


def first_line(e: BaseException) -> str:
    """The first non-blank line of an exception's message, or its type name when it has none."""
    for line in str(e).strip().splitlines():
        if line.strip():
            return line.strip()
    return type(e).__name__
