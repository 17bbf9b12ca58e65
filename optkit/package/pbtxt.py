"""Protobuf text format, the subset Triton configs use: one printer and one parser, no regular expression.

A config is a mapping in the message's JSON shape (the protobuf field names): a nested message is a dict, a
repeated field a list, an enum value an `Ident` (a str printed bare), a map field (Triton's `parameters`, a
warm-up's `inputs`) a dict of key -> value. `dumps` prints one top-level field a line, nested messages inline:

    name: "cnn"
    input [ { name: "x" data_type: TYPE_FP32 dims: [ 1, 8, 8 ] } ]
    parameters { key: "execution_mode" value { string_value: "0" } }

`loads` reads that back, and what people write by hand: `field: value` or `field value` for messages, `{ }` or
`< >`, repeated fields as `[a, b]` or the field given again, `#` comments, ',' or ';' between fields, strings in
single or double quotes with C escapes (octal, hex, \\u), adjacent strings joined. Every error is one UsageError
line naming the line and column.
"""
from __future__ import annotations

from typing import Any

from optkit.core.errors import UsageError

MAX_TEXT = 1 << 20   # characters; a config is a page
MAX_DEPTH = 32       # nested messages; Triton's deepest is ~6
_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "\\": "\\", "'": "'",
           '"': '"', "?": "?"}
_IDENT_START = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_IDENT = _IDENT_START | set("0123456789")
_NUMBER = set("0123456789+-.eExXabcdefABCDEF")


class Ident(str):
    """An enum value (KIND_CPU, TYPE_FP32): printed without quotes; equal to its plain string."""


# ------------------------------------------------------------------ printing

def dumps(config: dict[str, Any], maps: frozenset[str] = frozenset()) -> str:
    """The config as text: one top-level field a line. `maps` names the map fields (dict of key -> value)."""
    lines = []
    for key, value in config.items():
        lines.append(_field(key, value, maps))
    return "\n".join(line for line in lines if line) + "\n"


def _field(key: str, value: Any, maps: frozenset[str]) -> str:
    if key in maps and isinstance(value, dict):
        return " ".join(f"{key} {_message({'key': k, 'value': v}, maps)}" for k, v in value.items())
    if isinstance(value, dict):
        return f"{key} {_message(value, maps)}"
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, dict) for v in value):
            return f"{key} [ " + ", ".join(_message(v, maps) for v in value) + " ]"
        return f"{key}: [ " + ", ".join(_scalar(v) for v in value) + " ]" if value else f"{key}: [ ]"
    return f"{key}: {_scalar(value)}"


def _message(value: dict, maps: frozenset[str]) -> str:
    inner = " ".join(_field(k, v, maps) for k, v in value.items())
    return f"{{ {inner} }}" if inner else "{ }"


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Ident):
        return str(value)
    if isinstance(value, (int, float)):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return quote(value)
    raise TypeError(f"cannot print {type(value).__name__} in a text-format config")


def quote(text: str) -> str:
    """A double-quoted string: printable ASCII as it is, the rest as C escapes (UTF-8 bytes in octal)."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.extend(f"\\{b:03o}" for b in ch.encode("utf-8"))
    out.append('"')
    return "".join(out)


# ------------------------------------------------------------------ parsing

def loads(text: str, *, maps: frozenset[str] = frozenset(), repeated: frozenset[str] = frozenset(),
          where: str = "config") -> dict[str, Any]:
    """The mapping `text` holds. `repeated` names fields that are lists even when given once; `maps` the map
    fields (their {key, value} entries become a dict). A malformed text is one UsageError line."""
    if not isinstance(text, str):
        raise UsageError(f"{where}: not text")
    if len(text) > MAX_TEXT:
        raise UsageError(f"{where}: {len(text)} characters, over the {MAX_TEXT} a config may have")
    return _Parser(text, maps, repeated, where).document()


class _Parser:
    def __init__(self, text: str, maps: frozenset[str], repeated: frozenset[str], where: str):
        self.s, self.i, self.maps, self.repeated, self.where = text, 0, maps, repeated, where

    def fail(self, message: str, at: int | None = None) -> UsageError:
        at = self.i if at is None else at
        line = self.s.count("\n", 0, at) + 1
        col = at - (self.s.rfind("\n", 0, at) + 1) + 1
        return UsageError(f"{self.where}: line {line} column {col}: {message}")

    def skip(self) -> None:
        s, n = self.s, len(self.s)
        while self.i < n:
            c = s[self.i]
            if c in " \t\r\n\f\v":
                self.i += 1
            elif c == "#":
                end = s.find("\n", self.i)
                self.i = n if end < 0 else end + 1
            else:
                return

    def peek(self) -> str:
        self.skip()
        return self.s[self.i] if self.i < len(self.s) else ""

    def expect(self, ch: str) -> None:
        if self.peek() != ch:
            found = repr(self.s[self.i]) if self.i < len(self.s) else "the end of the text"
            raise self.fail(f"expected {ch!r}, found {found}")
        self.i += 1

    def document(self) -> dict[str, Any]:
        out = self.fields("", 0)
        if self.peek():
            raise self.fail(f"unexpected {self.s[self.i]!r}")
        return out

    def fields(self, close: str, depth: int) -> dict[str, Any]:
        if depth > MAX_DEPTH:
            raise self.fail(f"messages nested over {MAX_DEPTH} deep")
        out: dict[str, Any] = {}
        while True:
            c = self.peek()
            if c == close:
                return out
            if c == "":
                raise self.fail(f"unterminated message: expected {close!r} before the end of the text")
            if c in "}>]":
                raise self.fail(f"unexpected {c!r}")
            start = self.i
            key = self.ident()
            if self.peek() == ":":
                self.i += 1
                value = self.value(depth)
            elif self.peek() in "{<[":
                value = self.value(depth)
            else:
                raise self.fail(f"expected ':' or '{{' after field {key}")
            self.add(out, key, value, start)
            if self.peek() in ",;":
                self.i += 1

    def add(self, out: dict, key: str, value: Any, at: int) -> None:
        if key in self.maps:
            entries = value if isinstance(value, list) else [value]
            table = out.setdefault(key, {})
            for entry in entries:
                if not isinstance(entry, dict) or set(entry) - {"key", "value"}:
                    raise self.fail(f"map field {key}: each entry is {{ key: ... value: ... }}", at)
                if isinstance(entry.get("key", ""), (dict, list)):
                    raise self.fail(f"map field {key}: a key is a string or a number, not a message or a list", at)
                table[entry.get("key", "")] = entry.get("value")
        elif key in out:
            if key not in self.repeated and not isinstance(out[key], list):
                raise self.fail(f"field {key} given twice", at)
            out[key] = out[key] + (value if isinstance(value, list) else [value])
        else:
            out[key] = value if isinstance(value, list) or key not in self.repeated else [value]

    def value(self, depth: int) -> Any:
        c = self.peek()
        if c in "{<":
            self.i += 1
            inner = self.fields("}" if c == "{" else ">", depth + 1)
            self.i += 1
            return inner
        if c == "[":
            self.i += 1
            items: list[Any] = []
            while self.peek() != "]":
                if not self.peek():
                    raise self.fail("unterminated list: expected ']' before the end of the text")
                if self.peek() == "[":
                    raise self.fail("a list inside a list (text format has none)")
                items.append(self.value(depth))
                if self.peek() == ",":
                    self.i += 1
                elif not self.peek():
                    raise self.fail("unterminated list: expected ']' before the end of the text")
                elif self.peek() != "]":
                    raise self.fail("expected ',' or ']' in a list")
            self.i += 1
            return items
        if c in "\"'":
            parts = []
            while self.peek() in ("'", '"'):
                parts.append(self.string())
            return "".join(parts)
        if c == "-" and self.s[self.i + 1:self.i + 2] in _IDENT_START:  # -inf
            self.i += 1
            word = self.ident()
            if word.lower() not in ("inf", "infinity"):
                raise self.fail(f"not a number: {'-' + word[:40]!r}", self.i - len(word) - 1)
            return float("-inf")
        if c and (c in _NUMBER and c not in "abcdefABCDEFxX"):
            return self.number()
        if c and c in _IDENT_START:
            word = self.ident()
            if word in ("true", "True", "t"):
                return True
            if word in ("false", "False", "f"):
                return False
            if word.lower() in ("inf", "infinity", "nan"):
                return float(word)
            return Ident(word)
        raise self.fail("expected a value" if c else "expected a value before the end of the text")

    def ident(self) -> str:
        self.skip()
        start, s, n = self.i, self.s, len(self.s)
        if self.i >= n or s[self.i] not in _IDENT_START:
            raise self.fail("expected a field name" if self.i < n else "expected a field name, found the end")
        while self.i < n and s[self.i] in _IDENT:
            self.i += 1
        return s[start:self.i]

    def number(self) -> int | float:
        start, s, n = self.i, self.s, len(self.s)
        while self.i < n and (s[self.i] in _NUMBER or s[self.i] in "fF" and self.i > start):
            self.i += 1
        word = s[start:self.i].rstrip("fF") if "x" not in s[start:self.i].lower() else s[start:self.i]
        if self.i < n and s[self.i] in _IDENT:
            word += s[self.i]
            raise self.fail(f"not a number: {word[:40]!r}", start)
        try:
            return int(word, 0) if not any(ch in word for ch in ".eE") or word.lower().startswith(("0x", "-0x")) \
                else float(word)
        except ValueError:
            try:
                return int(word, 10)  # a leading 0 (protobuf would read octal; no Triton field wants that)
            except ValueError:
                raise self.fail(f"not a number: {word[:40]!r}", start) from None

    def string(self) -> str:
        quote_ch, start, s, n = self.s[self.i], self.i, self.s, len(self.s)
        self.i += 1
        out = bytearray()
        while True:
            if self.i >= n or s[self.i] == "\n":
                raise self.fail("unterminated string", start)
            c = s[self.i]
            if c == quote_ch:
                self.i += 1
                break
            if c != "\\":
                out += c.encode("utf-8")
                self.i += 1
                continue
            self.i += 1
            e = s[self.i] if self.i < n else ""
            if e in _SIMPLE:
                out += _SIMPLE[e].encode()
                self.i += 1
            elif e in "01234567" and e:
                digits = self._run("01234567", 3)
                out.append(int(digits, 8) & 0xFF)
            elif e in "xX" and e:
                self.i += 1
                digits = self._run("0123456789abcdefABCDEF", 2)
                if not digits:
                    raise self.fail("\\x needs hex digits")
                out.append(int(digits, 16))
            elif e in "uU" and e:
                self.i += 1
                digits = self._run("0123456789abcdefABCDEF", 4 if e == "u" else 8)
                if len(digits) != (4 if e == "u" else 8) or int(digits, 16) > 0x10FFFF:
                    raise self.fail(f"\\{e} needs {4 if e == 'u' else 8} hex digits of a code point")
                out += chr(int(digits, 16)).encode("utf-8", "surrogatepass")
            else:
                raise self.fail(f"unknown escape \\{e}" if e else "unterminated string", self.i - 1)
        try:
            return out.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail("string is not UTF-8 once unescaped", start) from None

    def _run(self, chars: str, most: int) -> str:
        start = self.i
        while self.i < len(self.s) and self.i - start < most and self.s[self.i] in chars:
            self.i += 1
        return self.s[start:self.i]
