"""Turning exceptions into the one line a user reads, and untrusted names into text that is safe to show."""
from __future__ import annotations

import re

# C0 and C1 control characters (ESC starts terminal escape sequences; a newline in a name forges a line of
# its own) and the bidirectional overrides that make text display in another order than it reads; tabs stay
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_MARKDOWN = re.compile(r"([\\`*_\[\]<>|!~])")


def redact_url(url: str) -> str:
    """A URL fit to show: its password (user:PASSWORD@, to the last @, and a password= query argument) replaced by
    ***. Text with no such URL is returned as it is."""
    url = re.sub(r"//([^:/@\s]*):.*@", r"//\1:***@", url)
    return re.sub(r"(?i)([?&;]password=)[^&;\s]*", r"\1***", url)


def redact_config(value):
    """A pass's config as reports and logs show it: every string with a URL's password masked (redact_url)."""
    if isinstance(value, dict):
        return {k: redact_config(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_config(v) for v in value]
    if isinstance(value, str) and ("//" in value or "password=" in value.lower()):
        return redact_url(value)
    return value


def printable(text: str) -> str:
    """`text` with control characters shown as escapes (`\x1b`), so a model, node or input name cannot move the
    cursor, recolour or retitle a terminal, or hide what a line says."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def markdown(text: str) -> str:
    """`text` for a Markdown report (a pull-request comment): printable, `&` `<` `>` as entities and Markdown's
    own characters escaped, so a name is shown as written and never becomes HTML, a link or an image."""
    text = printable(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKDOWN.sub(r"\\\1", text)


def first_line(e: BaseException) -> str:
    """The first non-blank line of an exception's message, or its type name when it has none."""
    for line in str(e).strip().splitlines():
        if line.strip():
            return line.strip()
    return type(e).__name__
