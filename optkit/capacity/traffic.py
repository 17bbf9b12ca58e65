"""A traffic history as one request rate per minute: a CSV of `timestamp,requests_per_s` (ISO 8601 or epoch
seconds, an optional header row) or a Prometheus range-query JSON (one series). It is user input: a rate that is
negative, NaN or not a number, a timestamp out of order or repeated, an empty or too large file is exit 2 naming
the file and the row; gaps are filled (linear between the neighbours) and counted in `repairs`, never silently.

Bounded before the work: a file of at most MAX_BYTES, read row by row and refused at its MAX_ROWS+1-th row (a
Prometheus answer's samples counted before it is parsed), spanning at most MAX_MINUTES; every step after is linear
in the rows and the span (a sample held for its interval is a forward fill, not a pass per minute held)."""
from __future__ import annotations

import math
import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from optkit.core import strictjson
from optkit.core.errors import UsageError
from optkit.core.readback import read_regular

MAX_BYTES = 64 << 20          # a year of per-second samples as CSV is ~1 GB: bound it well below
MAX_ROWS = 2_000_000
MAX_MINUTES = 366 * 1440      # a year of minutes
MAX_RATE = 1e9                # requests per second: past any fleet's
STEP_S = 60


@dataclass
class Traffic:
    """One rate (requests per second, the minute's mean) per minute from `start` (epoch seconds, UTC)."""
    rates: np.ndarray
    start: int
    source: str
    rows: int = 0
    sample_s: float = 60.0
    repairs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    row_of_minute: np.ndarray | None = None   # the file's row each minute came from (-1: filled)

    @property
    def minutes(self) -> int:
        return len(self.rates)

    def row_at(self, minute: int) -> str:
        if self.row_of_minute is None:
            return ""
        row = int(self.row_of_minute[minute])
        return f"row {row}" if row > 0 else f"minute {minute} (filled)"

    def time_of(self, minute: int) -> str:
        return datetime.fromtimestamp(self.start + STEP_S * minute, timezone.utc).strftime("%Y-%m-%d %H:%M")


def constant(rate: float, minutes: int = 60) -> Traffic:
    """A flat `--peak RATE` as a traffic of `minutes` minutes."""
    if not math.isfinite(rate) or rate <= 0 or rate > MAX_RATE:
        raise UsageError(f"--peak {rate}: give a finite request rate above 0 (requests per second)")
    return Traffic(rates=np.full(minutes, float(rate)), start=0, source="--peak", rows=0)


def load(path: str | Path) -> Traffic:
    p = Path(path)
    if not p.exists():
        raise UsageError(f"--history {p} does not exist")
    raw = read_regular(p, MAX_BYTES, hint="give a CSV (timestamp,requests_per_s) or a Prometheus range-query JSON")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UsageError(f"{p}: not UTF-8 text (byte {e.start}); give a CSV or a Prometheus JSON") from None
    del raw
    first = re.search(r"\S", text)
    if first is None:
        raise UsageError(f"{p} is empty; give rows of timestamp,requests_per_s")
    notes: list[str] = []
    rows = _prometheus(p, text) if first.group() in "{[" else _csv(p, text, notes)
    traffic = to_minutes(p, rows, naive=any("no time zone" in n for n in notes))
    traffic.notes[:0] = notes
    return traffic


def _number(p: Path, row: int, what: str, value) -> float:
    if isinstance(value, bool) or value is None:
        raise UsageError(f"{p} row {row}: {what} {str(value).lower()} is not a number")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{p} row {row}: {what} {str(value)[:40]!r} is not a number") from None
    return v


def _timestamp(p: Path, row: int, value: str) -> tuple[float, float | None]:
    """Epoch seconds and the time's UTC offset in seconds (None: no zone given; 0 for epoch seconds)."""
    value = value.strip()
    try:
        return float(value), 0.0
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except ValueError:
        raise UsageError(f"{p} row {row}: timestamp {value[:40]!r} is neither ISO 8601 nor epoch seconds") from None
    if t.tzinfo is None:
        return t.replace(tzinfo=timezone.utc).timestamp(), None
    return t.timestamp(), t.utcoffset().total_seconds()


RATE_NAMES = ("requests_per_s", "requests_per_second", "rps", "rate", "value", "requests", "qps")


def _columns(p: Path, header: list[str] | None, width: int, notes: list[str]) -> int:
    """Which column holds the rate: the second of two; of more, the one a header names (else exit 2)."""
    names = [h.strip().lower() for h in header] if header else None
    if width == 2:
        if names and names[1] not in RATE_NAMES:
            notes.append(f"header {','.join(h.strip() for h in header)[:80]!r} read as timestamp,requests_per_s "
                         "(the first column the time, the second the rate)")
        return 1
    if names:
        hits = [i for i, h in enumerate(names) if h in RATE_NAMES and i > 0]
        if len(hits) == 1:
            notes.append(f"{width} columns: the rate is column {hits[0] + 1} ({header[hits[0]].strip()[:40]!r}), "
                         "the others are ignored")
            return hits[0]
        raise UsageError(f"{p} row 1: {width} columns ({','.join(h.strip() for h in header)[:80]}) and "
                         f"{'no' if not hits else 'more than one'} column named as the rate "
                         f"({', '.join(RATE_NAMES[:3])}); give timestamp,requests_per_s")
    raise UsageError(f"{p}: {width} columns and no header naming the rate; give timestamp,requests_per_s (or a "
                     "header row naming the rate column requests_per_s)")


def _csv(p: Path, text: str, notes: list[str]) -> _Rows:
    import csv

    out = _Rows()
    header, col, width = None, None, None
    zones: set = set()
    first = _first_row(text)
    for n, fields in enumerate(csv.reader(_lines(text)), start=1):
        if not fields or all(not f.strip() for f in fields) or fields[0].lstrip().startswith("#"):
            continue
        if len(fields) < 2:
            raise UsageError(f"{p} row {n}: one column; give timestamp,requests_per_s (comma-separated)")
        if not out and header is None and n == first and not all(_numeric(f) for f in fields[1:]):
            header = fields  # a header row: no numbers past the time
            continue
        if width is None:
            width = len(fields)
            col = _columns(p, header, width, notes)
        elif len(fields) != width:
            raise UsageError(f"{p} row {n}: {len(fields)} columns where the rows before have {width}")
        if len(out) >= MAX_ROWS:
            raise UsageError(f"{p} has over {MAX_ROWS:,} rows; resample it to one row a minute or coarser")
        t, zone = _timestamp(p, n, fields[0])
        zones.add(zone)
        out.add(n, t, _number(p, n, "rate", fields[col].strip()))
    if not out:
        raise UsageError(f"{p} holds no rows of timestamp,requests_per_s")
    if None in zones and len(zones) > 1:
        raise UsageError(f"{p}: some timestamps carry a time zone and some do not; give every time in UTC (Z) or "
                         "with its offset")
    if zones == {None}:
        notes.append("the timestamps carry no time zone: read as UTC")
    elif len(zones) > 1:
        offs = sorted(z for z in zones if z is not None)
        notes.append("timestamps with UTC offsets " + ", ".join(_offset(z) for z in offs[:4])
                     + (" ..." if len(offs) > 4 else "") + " converted to UTC")
    return out


def _numeric(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def _offset(seconds: float) -> str:
    m = int(seconds // 60)
    return f"{'+' if m >= 0 else '-'}{abs(m) // 60:02d}:{abs(m) % 60:02d}"


def _first_row(text: str) -> int:
    for n, line in enumerate(_lines(text), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            return n
    return 0


_LINE_END = re.compile(r"\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")  # where str.splitlines splits


def _lines(text: str) -> Iterator[str]:
    """text.splitlines(), one line at a time: a 60 MB history never becomes millions of strings at once."""
    start = 0
    for m in _LINE_END.finditer(text):
        yield text[start:m.start()]
        start = m.end()
    if start < len(text):
        yield text[start:]


class _Rows:
    """(row number, epoch seconds, rate) of each row, kept as three compact arrays (24 bytes a row)."""

    def __init__(self):
        self.numbers, self.times, self.rates = array("q"), array("d"), array("d")

    def add(self, n: int, t: float, v: float) -> None:
        self.numbers.append(n)
        self.times.append(t)
        self.rates.append(v)

    def __len__(self) -> int:
        return len(self.numbers)


def _prometheus(p: Path, text: str) -> _Rows:
    if text.count("[") > MAX_ROWS + 2:  # each sample is a [t, "v"] pair: refused before json builds them all
        raise UsageError(f"{p} has over {MAX_ROWS:,} samples; query with a step of a minute or coarser")
    try:
        doc = strictjson.loads(text)
    except (ValueError, RecursionError) as e:
        raise UsageError(f"{p}: not JSON ({str(e).splitlines()[0][:80]}); give a Prometheus range-query "
                         "answer or a CSV") from None
    if not isinstance(doc, dict) or doc.get("status") != "success" or not isinstance(doc.get("data"), dict):
        raise UsageError(f"{p}: not a Prometheus query answer (key status: 'success' and key data expected)")
    data = doc["data"]
    if data.get("resultType") != "matrix":
        raise UsageError(f"{p}: key data.resultType is {str(data.get('resultType'))[:20]!r}, not 'matrix'; "
                         "give a range query's answer (/api/v1/query_range)")
    result = data.get("result")
    if not isinstance(result, list) or not result:
        raise UsageError(f"{p}: key data.result holds no series; the query matched nothing")
    if len(result) > 1:
        raise UsageError(f"{p}: key data.result holds {len(result)} series; sum them in the query "
                         "(sum(rate(requests_total[1m])))")
    values = result[0].get("values") if isinstance(result[0], dict) else None
    if not isinstance(values, list) or not values:
        raise UsageError(f"{p}: key data.result.0.values holds no samples")
    if len(values) > MAX_ROWS:
        raise UsageError(f"{p} has over {MAX_ROWS:,} samples; query with a step of a minute or coarser")
    out = _Rows()
    for n, pair in enumerate(values):
        if not isinstance(pair, list) or len(pair) != 2:
            raise UsageError(f"{p}: key data.result.0.values.{n}: not a [timestamp, \"value\"] pair")
        t = _number(p, n, "timestamp", pair[0])
        out.add(n, t, _number(p, n, "rate", pair[1]))
    return out


def _check_rows(p: Path | str, ts: np.ndarray, vs: np.ndarray, numbers: np.ndarray, naive: bool) -> None:
    """Exit 2 at the first row whose time or rate is wrong (found on the arrays; the one line names that row)."""
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(ts) | (ts < 0) | (ts > 4e9) | ~np.isfinite(vs) | (vs < 0) | (vs > MAX_RATE)
        bad[1:] |= ~(ts[1:] > ts[:-1])
    if not bad.any():
        return
    i = int(np.argmax(bad))
    where = "key data.result.0.values." if str(p).endswith(".json") else "row "
    local = ("; local times without a zone repeat at a daylight-saving change: give UTC (Z) or offsets"
             if naive else "")
    n, t, v = int(numbers[i]), float(ts[i]), float(vs[i])
    if not math.isfinite(t) or t < 0 or t > 4e9:
        unit = ("; epoch milliseconds? give seconds" if 1e11 < t < 4e12 else
                "; epoch microseconds? give seconds" if 1e14 < t < 4e15 else "")
        raise UsageError(f"{p} {where}{n}: timestamp {t:g} is not a time between 1970 and 2096{unit}")
    if not math.isfinite(v):
        raise UsageError(f"{p} {where}{n}: rate is {v}; every rate must be a number (fill or drop the row)")
    if v < 0:
        raise UsageError(f"{p} {where}{n}: rate {v:g} is negative; a request rate is 0 or more")
    if v > MAX_RATE:
        raise UsageError(f"{p} {where}{n}: rate {v:g} is over {MAX_RATE:g} requests per second")
    prev_row = int(numbers[i - 1])
    if t == ts[i - 1]:
        raise UsageError(f"{p} {where}{n}: timestamp repeats {where}{prev_row}'s; one rate per time{local}")
    raise UsageError(f"{p} {where}{n}: timestamp is before {where}{prev_row}'s; sort the rows by time{local}")


def to_minutes(p: Path | str, rows: _Rows, naive: bool = False) -> Traffic:
    """Checked rows as one mean rate per minute; gaps filled and counted. `naive`: the times carried no zone (a
    local clock repeats an hour when daylight saving ends)."""
    where = "key data.result.0.values." if str(p).endswith(".json") else "row "
    ts = np.frombuffer(rows.times, dtype=np.float64)
    vs = np.frombuffer(rows.rates, dtype=np.float64)
    numbers = np.frombuffer(rows.numbers, dtype=np.int64)
    _check_rows(p, ts, vs, numbers, naive)
    start = int(ts[0] // STEP_S * STEP_S)
    sample_s = float(np.median(np.diff(ts))) if len(ts) > 1 else 60.0
    hold = max(1, int(round(sample_s / STEP_S)))
    span = int((ts[-1] - start) // STEP_S) + hold      # the last sample holds for its interval too
    if span > MAX_MINUTES:
        raise UsageError(f"{p} spans {span / 1440:.0f} days; optkit replays at most {MAX_MINUTES // 1440} days: "
                         "give the last year")
    idx = ((ts - start) // STEP_S).astype(np.int64)
    sums = np.bincount(idx, weights=vs, minlength=span)
    counts = np.bincount(idx, minlength=span)
    rates = np.full(span, np.nan)
    have = counts > 0
    rates[have] = sums[have] / counts[have]
    row_of = np.full(span, -1, dtype=np.int64)
    row_of[idx] = numbers  # the last row of each minute
    traffic = Traffic(rates=rates, start=start, source=str(p), rows=len(rows), sample_s=sample_s)
    if len(rows) == 1:
        traffic.notes.append("the history is one row: one minute is replayed (the same as --peak with it)")
    if sample_s < STEP_S and len(rows) > span:
        traffic.notes.append(f"resampled: {len(rows):,} samples every {sample_s:g} s averaged into {span:,} "
                             "minutes (each minute's mean)")
    if hold > 1:  # coarser than a minute: each sample holds for its interval, a missing sample is a gap
        minute = np.arange(span)
        last = np.maximum.accumulate(np.where(np.isnan(rates), -1, minute))  # the last sampled minute so far
        fill = np.isnan(rates) & (last >= 0) & (minute - last < hold)
        rates[fill] = rates[last[fill]]
        row_of[fill] = row_of[last[fill]]
        traffic.notes.append(f"resampled: one sample every {sample_s:g} s, each held for its {hold} minutes "
                             "(the replay cannot see a surge inside a sample's interval)")
    missing = np.isnan(rates)
    if missing.any():
        known = np.flatnonzero(~missing)
        rates[missing] = np.interp(np.flatnonzero(missing), known, rates[known])
        runs = _runs(missing)
        longest = max(b - a for a, b in runs)
        first = runs[0]
        traffic.repairs.append(
            f"{int(missing.sum()):,} missing minutes in {len(runs)} gaps filled linearly between their neighbours "
            f"(longest {longest} min; first at {traffic.time_of(first[0])} UTC, after {where}{row_of[first[0] - 1]})")
        if missing.sum() > 0.2 * span:
            traffic.notes.append(f"{100 * missing.sum() / span:.0f}% of the minutes were filled: the replay is "
                                 "of the filled curve as much as of the traffic")
    if not rates.any():
        traffic.notes.append("the traffic is zero throughout: every strategy keeps the minimum replicas")
    traffic.rates = rates
    traffic.row_of_minute = row_of
    return traffic


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of True."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))
