"""Turning exceptions into the one line a user reads, and untrusted names into text that is safe to show."""
from __future__ import annotations

import re

# C0 and C1 control characters (ESC starts terminal escape sequences; a newline in a name forges a line of
# its own) and the bidirectional overrides that make text display in another order than it reads; tabs stay
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_MARKDOWN = re.compile(r"([\\`*_\[\]<>|!~])")


_SCHEME = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*(?:://|%3A%2F%2F)")
_END = re.compile(r"""[\s'"<>`]""")
# secret query arguments and libpq-style keywords (password=..., "password": "...")
_SECRET_KEYS = r"(?:ssl)?password|passwd|pwd|(?:access_|auth_|refresh_)?token|api_?key|(?:client_)?secret"
_SECRET_ARG = re.compile(rf"(?i)(\b(?:{_SECRET_KEYS})\s*=\s*)('[^']*'|\"[^\"]*\"|[^\s&;'\"#]+)")
_SECRET_ITEM = re.compile(rf"""(?i)((['"])(?:{_SECRET_KEYS})\2\s*:\s*)('[^']*'|"[^"]*")""")
MASK = "***"


def _userinfo_end(region: str, colon: str, at: str, slash: str) -> tuple[int, int] | None:
    """(start, end) of the password in `region` (what follows scheme://), or None. It ends at the first `at` (as
    SQLAlchemy reads a URL: `u:a/b@h`) or at the last `at` before the first `/` (as urllib does: `u:p@ss@h`),
    whichever is further, so either reading of the URL finds nothing of it left."""
    low = region.lower()
    c = low.find(colon)
    if c < 0 or slash in low[:c]:
        return None
    start = c + len(colon)
    first = low.find(at, start)
    cut = min([i for i in (low.find(slash), low.find("?"), low.find("#")) if i >= 0], default=len(low))
    last = low.rfind(at, start, cut)
    end = max(first, last)
    return (start, end) if end > start else None


def redact_url(text: str) -> str:
    """`text` fit to show: in every URL in it (several may be) the password of user:PASSWORD@ masked as *** (an
    `@` or `/` inside the password included, the URL written plainly or percent-encoded), and every secret
    argument (password=, token=, api_key=, a libpq `password=...`, a `'password': '...'` item) masked; a user
    without a password stays. Text with no such secret is returned as it is."""
    text = str(text)
    out, pos = [], 0
    for m in _SCHEME.finditer(text):
        if m.start() < pos:
            continue
        encoded = m.group().endswith(("%2F", "%2f"))
        end = _END.search(text, m.end())
        stop = end.start() if end else len(text)
        nxt = _SCHEME.search(text, m.end(), stop)
        stop = nxt.start() if nxt else stop
        region = text[m.end():stop]
        span = _userinfo_end(region, *(("%3a", "%40", "%2f") if encoded else (":", "@", "/")))
        if span:
            out.append(text[pos:m.end() + span[0]] + MASK)
            pos = m.end() + span[1]
    text = "".join(out) + text[pos:]
    text = _SECRET_ARG.sub(lambda m: m.group(1) + MASK, text)
    return _SECRET_ITEM.sub(lambda m: m.group(1) + m.group(2) + MASK + m.group(2), text)


def passwords(*urls: str | None) -> list[str]:
    """The passwords of these URLs, as written and percent-decoded (to mask wherever a library repeats one)."""
    import urllib.parse

    found = []
    for url in urls:
        if not url:
            continue
        m = _SCHEME.match(url)
        region = url[m.end():] if m else ""
        span = _userinfo_end(region, ":", "@", "/") if m else None
        if span:
            raw = region[span[0]:span[1]]
            found += [raw, urllib.parse.unquote(raw)]
        found += [urllib.parse.unquote(v) for v in re.findall(rf"(?i)[?&;](?:{_SECRET_KEYS})=([^&;#\s]+)", url)]
    return sorted({p for p in found if len(p) >= 3}, key=len, reverse=True)


def redact(text: str, *urls: str | None) -> str:
    """`text` (a library's message, say) fit to show: redact_url, and the passwords of `urls` masked wherever they
    appear in it, even outside a URL."""
    text = redact_url(text)
    for secret in passwords(*urls):
        text = text.replace(secret, MASK)
    return text


def redact_config(value):
    """A pass's config as reports and logs show it: every string with a URL's password or a secret argument
    masked (redact_url), and the value of a key that names a secret (password, token, ...)."""
    if isinstance(value, dict):
        return {k: MASK if isinstance(k, str) and isinstance(v, str) and v and re.fullmatch(_SECRET_KEYS, k, re.I)
                else redact_config(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_config(v) for v in value]
    if isinstance(value, str):
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
