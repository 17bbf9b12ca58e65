"""Text data files read row by row: CSV / TSV (delimiter and header sniffed), JSON Lines, Parquet and a `datasets`
`save_to_disk` folder (Arrow files, read with pyarrow, memory-mapped).

A file is streamed: `scan()` yields each row once with a locator (a byte offset, an Arrow row number) and `fetch`
reads rows again by their locators, so a million-row file is never held whole. Bounds: a row (a CSV record, a
JSON line, a text value of an Arrow row) is at most MAX_ROW_BYTES, a file at most MAX_ROWS rows; past them, and on
any row that is not UTF-8, not parseable or blank, the error is one line naming the file and the line or row.
"""
from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from optkit.core.errors import DependencyError, UsageError
from optkit.measure.preprocess import clip

MAX_ROW_BYTES = 1 << 20       # one row: 1 MiB (a long document is a few hundred KiB; a model reads 512 tokens)
MAX_ROWS = 5_000_000          # rows of one file: the index holds an offset, a length and a label per row
SNIFF_LINES = 64              # lines the delimiter and header are judged on
DELIMITERS = ("\t", ",", ";", "|")
TEXT_SUFFIXES = (".csv", ".tsv", ".txt", ".jsonl", ".ndjson", ".parquet")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\- ]{0,63}")


def is_text_data(path: Path) -> bool:
    """Whether `path` is text data this module reads: a file by its suffix, or a `datasets` folder."""
    if path.is_dir():
        return (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()
    return path.name.lower().endswith(TEXT_SUFFIXES)


def open_table(path: Path):
    """The reader for `path` (by suffix, or a `datasets` folder)."""
    if path.is_dir():
        return ArrowTable(path)
    name = path.name.lower()
    if name.endswith((".jsonl", ".ndjson")):
        return JsonLines(path)
    if name.endswith(".parquet"):
        return ParquetTable(path)
    return Delimited(path)


def _too_many(path: Path) -> UsageError:
    return UsageError(f"{path} has more than {MAX_ROWS:,} rows, the most optkit reads from one file; give a part "
                      "of it (the figures of a sample are as good)")


class _Lines:
    """A text file's physical lines as (byte offset, line number, text), each bounded and decoded as UTF-8."""

    def __init__(self, path: Path, f, offset: int = 0, line: int = 1):
        self.path, self.f, self.line = path, f, line
        f.seek(offset)

    def next(self) -> tuple[int, int, str] | None:
        off = self.f.tell()
        raw = self.f.readline(MAX_ROW_BYTES + 1)
        if not raw:
            return None
        line, self.line = self.line, self.line + 1
        if len(raw) > MAX_ROW_BYTES:
            raise UsageError(f"{self.path} line {line} is over {MAX_ROW_BYTES >> 20} MiB; a row of text data is at "
                             f"most {MAX_ROW_BYTES:,} bytes")
        try:
            text = raw.decode("utf-8-sig" if off == 0 else "utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"{self.path} line {line} is not UTF-8 text (byte {e.start}: "
                             f"{raw[e.start:e.start + 1]!r}); save the file as UTF-8") from None
        return off, line, text


class Delimited:
    """CSV or TSV: the delimiter is the one that splits the first lines into the same number (over one) of fields
    most often (tab first); a tab-separated file is read without quoting (a stray quote in a sentence is text, as in
    STS-B), a comma-separated one with CSV quoting (a quoted field may span lines)."""

    kind = "delimited"

    def __init__(self, path: Path):
        self.path = path
        if not path.is_file():
            raise UsageError(f"data {path} is not a regular file")
        with open(path, "rb") as f:
            lines, reader = [], _Lines(path, f)
            while len(lines) < SNIFF_LINES and (got := reader.next()) is not None:
                if got[2].strip():
                    lines.append(got[2].rstrip("\r\n"))
        if not lines:
            raise UsageError(f"{path} holds no rows; give a file with at least one")
        self.delimiter = _sniff(lines)
        self.quoting = csv.QUOTE_NONE if self.delimiter == "\t" else csv.QUOTE_MINIMAL
        first = self._parse(lines[0])
        rest = [self._parse(x) for x in lines[1:]]
        self.first_row = first
        self.header_guess = _looks_like_header(first, rest)

    def _parse(self, line: str) -> list[str]:
        return next(csv.reader([line], delimiter=self.delimiter, quoting=self.quoting), [])

    def records(self, f, offset: int = 0, line: int = 1) -> Iterator[tuple[int, int, list[str]]]:
        """(offset, first line, fields) of each record from `offset`; blank lines only at the end of the file."""
        lines = _Lines(self.path, f, offset, line)
        start: list = [None, 0]   # the current record's (offset, line) and bytes so far

        def feed():
            while (got := lines.next()) is not None:
                off, no, text = got
                if start[0] is None:
                    start[0], start[1] = (off, no), 0
                start[1] += len(text)
                if start[1] > MAX_ROW_BYTES:
                    raise UsageError(f"{self.path} line {start[0][1]}: a record over {MAX_ROW_BYTES >> 20} MiB "
                                     "(an unclosed quote?); a row of text data is at most "
                                     f"{MAX_ROW_BYTES:,} bytes")
                yield text

        csv.field_size_limit(MAX_ROW_BYTES)
        reader = csv.reader(feed(), delimiter=self.delimiter, quoting=self.quoting, strict=True)
        blank = None
        while True:
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                where = start[0][1] if start[0] else lines.line
                raise UsageError(f"{self.path} line {where} is not a {self.kind_name} row: {e}") from None
            at, start[0] = start[0], None
            if not fields or all(not x.strip() for x in fields):
                blank = blank or at
                continue
            if blank is not None:
                raise UsageError(f"{self.path} line {blank[1]} is blank; every row holds data (remove the blank "
                                 "line)")
            yield at[0], at[1], fields

    @property
    def kind_name(self) -> str:
        return "tab-separated" if self.delimiter == "\t" else f"{self.delimiter!r}-separated"


def _sniff(lines: list[str]) -> str:
    best, score = None, (0.0, 0)
    for d in DELIMITERS:
        quoting = csv.QUOTE_NONE if d == "\t" else csv.QUOTE_MINIMAL
        try:
            counts = [len(r) for r in csv.reader(lines, delimiter=d, quoting=quoting)]
        except csv.Error:
            continue
        mode = max(set(counts), key=counts.count)
        if mode < 2:
            continue
        s = (sum(c >= mode for c in counts) / len(counts), mode if d != "\t" else mode + 0.5)
        if s[0] >= 0.9 and (best is None or s[0] > score[0] + 0.05 or (abs(s[0] - score[0]) <= 0.05 and d == "\t"
                                                                       and best != "\t")):
            best, score = d, s
    return best or ","


def _number(x: str) -> bool:
    try:
        float(x)
        return True
    except ValueError:
        return False


def _looks_like_header(first: list[str], rest: list[list[str]]) -> bool:
    """A first row of short names (no number among them) over rows that hold a number where it holds a name."""
    if not first or any(_number(x) or not _NAME.fullmatch(x.strip()) for x in first):
        return False
    if not rest:
        return True
    numeric_below = any(all(i < len(r) and _number(r[i]) for r in rest) for i in range(len(first)))
    return numeric_below or all(len(x.split()) == 1 for x in first)


class JsonLines:
    """One JSON object per line."""

    kind = "jsonl"

    def __init__(self, path: Path):
        self.path = path
        if not path.is_file():
            raise UsageError(f"data {path} is not a regular file")

    def records(self, f, offset: int = 0, line: int = 1) -> Iterator[tuple[int, int, dict]]:
        lines, blank = _Lines(self.path, f, offset, line), None
        while (got := lines.next()) is not None:
            off, no, text = got
            if not text.strip():
                blank = blank or no
                continue
            if blank is not None:
                raise UsageError(f"{self.path} line {blank} is blank; every line holds one JSON object")
            try:
                row = json.loads(text)
            except ValueError as e:
                raise UsageError(f"{self.path} line {no} is not JSON: {clip(str(e), 80)}") from None
            if not isinstance(row, dict):
                raise UsageError(f"{self.path} line {no} holds a JSON {type(row).__name__}, not an object "
                                 '({"text": ..., "label": ...})')
            yield off, no, row


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise DependencyError("reading Parquet and datasets folders needs pyarrow: pip install 'optkit[text]'") \
            from None
    return pyarrow


class _Arrow:
    """Rows of an Arrow table (Parquet row groups, or memory-mapped Arrow files)."""

    kind = "arrow"
    class_names: dict[str, list[str]] = {}

    def column_names(self) -> list[str]:
        return list(self.schema.names)

    def check_count(self, n: int) -> None:
        if n > MAX_ROWS:
            raise _too_many(self.path)


class ParquetTable(_Arrow):
    def __init__(self, path: Path):
        pa = _pyarrow()
        self.path = path
        try:
            self.file = pa.parquet.ParquetFile(path)
        except (OSError, pa.ArrowException) as e:
            raise UsageError(f"cannot read {path} as Parquet: {clip(str(e), 120)}") from None
        self.schema = self.file.schema_arrow
        self.rows = self.file.metadata.num_rows
        self.check_count(self.rows)
        self._groups = [self.file.metadata.row_group(i).num_rows for i in range(self.file.num_row_groups)]
        self._cache: tuple[int, Any] | None = None

    def batches(self, columns: list[str]):
        for batch in self.file.iter_batches(batch_size=1024, columns=columns):
            yield batch.to_pylist()

    def fetch(self, rows: list[int], columns: list[str]) -> list[dict]:
        out = []
        for r in rows:
            g, start = 0, 0
            while r >= start + self._groups[g]:
                start += self._groups[g]
                g += 1
            if self._cache is None or self._cache[0] != g:
                self._cache = (g, self.file.read_row_group(g, columns=columns).to_pylist())
            out.append(self._cache[1][r - start])
        return out


class ArrowTable(_Arrow):
    """A `datasets` `save_to_disk` folder: its Arrow files (stream or file format) memory-mapped, in the order
    state.json lists them; ClassLabel names from dataset_info.json."""

    def __init__(self, path: Path):
        pa = _pyarrow()
        self.path = path
        if (path / "dataset_dict.json").is_file():
            splits = sorted(p.name for p in path.iterdir() if (p / "dataset_info.json").is_file())
            raise UsageError(f"{path} is a datasets DatasetDict with splits {', '.join(splits) or '(none)'}; give "
                             f"one split's folder, e.g. {path / (splits[0] if splits else 'test')}")
        names = self._files(path)
        tables = []
        for name in names:
            f = path / name
            if Path(name).name != name or not f.is_file() or f.is_symlink():
                raise UsageError(f"{path}: state.json names {clip(name, 80)}, not an Arrow file in the folder")
            tables.append(self._read(pa, f))
        self.table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        self.schema, self.rows = self.table.schema, self.table.num_rows
        self.check_count(self.rows)
        self.class_names = _class_names(path)

    @staticmethod
    def _files(path: Path) -> list[str]:
        state = path / "state.json"
        if state.is_file():
            try:
                files = json.loads(state.read_text(encoding="utf-8"))["_data_files"]
                return [str(f["filename"]) for f in files]
            except (ValueError, KeyError, TypeError):
                raise UsageError(f"{state} is not a datasets state.json (no _data_files list)") from None
        found = sorted(p.name for p in path.glob("*.arrow"))
        if not found:
            raise UsageError(f"{path} holds no .arrow files; give a folder datasets' save_to_disk wrote")
        return found

    @staticmethod
    def _read(pa, f: Path):
        source = pa.memory_map(str(f))
        for opener in (pa.ipc.open_stream, pa.ipc.open_file):
            try:
                return opener(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
        raise UsageError(f"cannot read {f} as an Arrow file (stream or file format)")

    def batches(self, columns: list[str]):
        for batch in self.table.select(columns).to_batches(max_chunksize=1024):
            yield batch.to_pylist()

    def fetch(self, rows: list[int], columns: list[str]) -> list[dict]:
        return self.table.select(columns).take(rows).to_pylist()


def _class_names(path: Path) -> dict[str, list[str]]:
    """ClassLabel names per column (a Sequence of ClassLabel too) from dataset_info.json; {} when it has none."""
    try:
        features = json.loads((path / "dataset_info.json").read_text(encoding="utf-8")).get("features") or {}
    except (OSError, ValueError):
        return {}
    out = {}
    for col, feat in features.items() if isinstance(features, dict) else ():
        inner = feat.get("feature", feat) if isinstance(feat, dict) else {}
        names = inner.get("names") if isinstance(inner, dict) else None
        if isinstance(names, list) and all(isinstance(n, str) for n in names):
            out[col] = names
    return out
