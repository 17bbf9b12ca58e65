"""Labels of an image folder: a CSV of file,class_index rows or a .txt class list, read as user input
(bounded, each image once and inside the folder)."""
from __future__ import annotations

import csv
import re
from pathlib import Path

from optkit.core.errors import UsageError
from optkit.measure.preprocess import clip, short

MAX_LABELS_BYTES = 1 << 28   # a labels file: 256 MiB holds millions of rows
MAX_LINE = 4096              # one row of a labels CSV or one line of a class list
MAX_CLASS_INDEX = 2**63 - 1  # labels are int64
_INDEX = re.compile(r"-?[0-9]+")
_LONG_LINE = re.compile(rf"[^\n]{{{MAX_LINE + 1}}}")
_CONTENT_LINE = re.compile(r"^[^\n]*[^\s,\"][^\n]*$", re.M)


def _read_labels_text(path: Path) -> str:
    """A labels file's text, its line ends made "\n"; a file or a line longer than any labels file needs, or
    a path that is not a regular file (a folder, a FIFO, a device), is refused."""
    if not path.is_file():
        if path.exists():
            raise UsageError(f"labels {path} is not a regular file (a folder, FIFO or device); give a file")
        raise UsageError(f"labels {path} not found")
    try:
        if path.stat().st_size > MAX_LABELS_BYTES:
            raise UsageError(f"labels {path} is {path.stat().st_size:,} bytes; a labels file is at most "
                             f"{MAX_LABELS_BYTES:,}")
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read labels {path} as text: {e}") from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    long = _LONG_LINE.search(text)   # one pass in C: a file of millions of lines is read in seconds
    if long:
        start = text.rfind("\n", 0, long.start()) + 1
        end = text.find("\n", start)
        line = text[start:end if end >= 0 else len(text)]
        raise UsageError(f"{path} line {text.count(chr(10), 0, start) + 1} is {len(line):,} characters long "
                         f"({short(line, 40)}); a line of a labels file is at most {MAX_LINE:,}")
    return text


def _rows(text: str):
    """(line number, line) of each line of `text` with more than blanks, commas and quotes in it: blank
    lines are skipped in C, not one by one (a labels file of 100 million empty lines once took minutes)."""
    line, pos = 1, 0
    for m in _CONTENT_LINE.finditer(text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        yield line, m.group()


def csv_labels(path: Path, folder: Path) -> tuple[list[Path], list[int]]:
    """(image files, class indices) from `file,class_index` rows; a first row whose index is not a number is
    a header; further columns are ignored. Each image once, inside the folder (symlinks resolved)."""
    root = folder.resolve()
    files, ys, first = [], [], True
    seen: dict[Path, tuple[int, int]] = {}   # resolved image -> (line, class index)
    for line, text in _rows(_read_labels_text(path)):
        def bad(msg: str, line=line, text=text) -> UsageError:
            return UsageError(f"{path} line {line}: {msg} (row {short(text, 200)})")

        try:
            row = [c.strip() for c in next(csv.reader([text]), [])]
        except csv.Error as e:
            raise bad(f"not a CSV row: {e}") from None
        if not any(row):
            continue
        header, first = first, False
        if len(row) < 2 or not row[0]:
            raise UsageError(f"{path} line {line}: expected file,class_index, found {short(','.join(row))}")
        if not _INDEX.fullmatch(row[1]):
            if header and not (folder / row[0]).is_file():  # a first row naming an image is no header
                continue
            raise UsageError(f"{path} line {line}: class index {short(row[1])} is not a whole number")
        y = int(row[1])
        if y < 0:
            raise UsageError(f"{path} line {line}: class index {y} is negative")
        if y > MAX_CLASS_INDEX:
            raise bad(f"class index {clip(row[1], 30)} is too large (at most {MAX_CLASS_INDEX}, and under the "
                      "model's class count)")
        f = folder / row[0]
        try:
            real = f.resolve()
            inside = not Path(row[0]).is_absolute() and real.is_relative_to(root)
            found = f.is_file()
        except (OSError, ValueError):
            inside, found = True, False
        except RuntimeError:   # a symlink loop (Python < 3.13 raises RuntimeError, not OSError)
            raise bad(f"image {clip(row[0])} is a symlink loop") from None
        if not inside:
            how = "" if Path(row[0]).is_absolute() or ".." in Path(row[0]).parts else " (through a symlink)"
            raise bad(f"image {clip(row[0])} is outside {folder}{how}; rows name files inside the folder")
        if not found:
            if f.exists():
                raise bad(f"image {clip(row[0])} is not a regular file (a folder, FIFO or device)")
            raise UsageError(f"{path} line {line}: image {clip(row[0])} not found in {folder}")
        if real in seen:
            was, y0 = seen[real]
            raise bad(f"image {clip(row[0])} is listed again (first on line {was}, class {y0}); list each image "
                      "once" if y0 == y else
                      f"image {clip(row[0])} is under class {y} here but under class {y0} on line {was}; give each "
                      "image one class")
        seen[real] = (line, y)
        files.append(f)
        ys.append(y)
    if not files:
        raise UsageError(f"{path} lists no images (expected file,class_index rows)")
    return files, ys


def class_list(path: Path) -> tuple[list[str], dict[str, int]]:
    """The class names of a .txt list (line number = class index) and an index by name; a line such as
    `n01440764 tench, Tinca tinca` also names its class by its first word."""
    if path.suffix.lower() != ".txt":
        raise UsageError(f"labels {path} for an image folder: give a .csv (file,class_index rows) or a .txt "
                         "class list (one class name per line)")
    lines = [ln.strip() for ln in _read_labels_text(path).splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise UsageError(f"class list {path} is empty")
    index: dict[str, int] = {}
    for i, name in enumerate(lines):
        if not name:
            raise UsageError(f"class list {path} line {i + 1} is empty; every line up to the last names a class")
        if name in index:
            raise UsageError(f"class list {path} names {name!r} twice (lines {index[name] + 1} and {i + 1})")
        index[name] = i
    for i, name in enumerate(lines):
        index.setdefault(name.split()[0].rstrip(","), i)
    return lines, index
