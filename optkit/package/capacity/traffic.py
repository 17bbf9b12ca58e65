"""A traffic history as one request rate per minute: a CSV of `timestamp,requests_per_s` (ISO 8601 or epoch
seconds, an optional header row) or a Prometheus range-query JSON (one series). It is user input: a rate that is
negative, NaN or not a number, a timestamp out of order or repeated, an empty or too large file is exit 2 naming
the file and the row; gaps are filled (linear between the neighbours) and counted in `repairs`, never silently."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

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
    stripped = text.lstrip()
    if not stripped:
        raise UsageError(f"{p} is empty; give rows of timestamp,requests_per_s")
    rows = _prometheus(p, stripped) if stripped[0] in "{[" else _csv(p, text)
    return to_minutes(p, rows)


def _number(p: Path, row: int, what: str, value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{p} row {row}: {what} {str(value)[:40]!r} is not a number") from None
    return v


def _timestamp(p: Path, row: int, value: str) -> float:
    value = value.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except ValueError:
        raise UsageError(f"{p} row {row}: timestamp {value[:40]!r} is neither ISO 8601 nor epoch seconds") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.timestamp()


def _csv(p: Path, text: str) -> list[tuple[int, float, float]]:
    import csv

    out = []
    for n, fields in enumerate(csv.reader(text.splitlines()), start=1):
        if not fields or all(not f.strip() for f in fields) or fields[0].lstrip().startswith("#"):
            continue
        if len(fields) < 2:
            raise UsageError(f"{p} row {n}: one column; give timestamp,requests_per_s")
        if not out and n == _first_row(text):
            try:
                float(fields[1])
            except ValueError:
                continue  # a header row
        if len(out) >= MAX_ROWS:
            raise UsageError(f"{p} has over {MAX_ROWS:,} rows; resample it to one row a minute or coarser")
        out.append((n, _timestamp(p, n, fields[0]), _number(p, n, "rate", fields[1].strip())))
    if not out:
        raise UsageError(f"{p} holds no rows of timestamp,requests_per_s")
    return out


def _first_row(text: str) -> int:
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            return n
    return 0


def _prometheus(p: Path, text: str) -> list[tuple[int, float, float]]:
    try:
        doc = json.loads(text)
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
    out = []
    for n, pair in enumerate(values):
        if not isinstance(pair, list) or len(pair) != 2:
            raise UsageError(f"{p}: key data.result.0.values.{n}: not a [timestamp, \"value\"] pair")
        t = _number(p, n, "timestamp", pair[0])
        out.append((n, t, _number(p, n, "rate", pair[1])))
    return out


def to_minutes(p: Path | str, rows: list[tuple[int, float, float]]) -> Traffic:
    """Checked rows (row number, epoch seconds, rate) as one mean rate per minute; gaps filled and counted."""
    where = "key data.result.0.values." if str(p).endswith(".json") else "row "
    prev_t, prev_row = None, None
    for n, t, v in rows:
        if not math.isfinite(t) or t < 0 or t > 4e9:
            raise UsageError(f"{p} {where}{n}: timestamp {t} is not a time between 1970 and 2096")
        if not math.isfinite(v):
            raise UsageError(f"{p} {where}{n}: rate is {v}; every rate must be a number (fill or drop the row)")
        if v < 0:
            raise UsageError(f"{p} {where}{n}: rate {v:g} is negative; a request rate is 0 or more")
        if v > MAX_RATE:
            raise UsageError(f"{p} {where}{n}: rate {v:g} is over {MAX_RATE:g} requests per second")
        if prev_t is not None:
            if t == prev_t:
                raise UsageError(f"{p} {where}{n}: timestamp repeats {where}{prev_row}'s; one rate per time")
            if t < prev_t:
                raise UsageError(f"{p} {where}{n}: timestamp is before {where}{prev_row}'s; sort the rows by time")
        prev_t, prev_row = t, n
    ts = np.array([r[1] for r in rows])
    vs = np.array([r[2] for r in rows])
    numbers = np.array([r[0] for r in rows])
    start = int(ts[0] // STEP_S * STEP_S)
    span = int((ts[-1] - start) // STEP_S) + 1
    if span > MAX_MINUTES:
        raise UsageError(f"{p} spans {span / 1440:.0f} days; optkit replays at most {MAX_MINUTES // 1440} days: "
                         "give the last year")
    sample_s = float(np.median(np.diff(ts))) if len(ts) > 1 else 60.0
    idx = ((ts - start) // STEP_S).astype(np.int64)
    sums = np.bincount(idx, weights=vs, minlength=span)
    counts = np.bincount(idx, minlength=span)
    rates = np.full(span, np.nan)
    have = counts > 0
    rates[have] = sums[have] / counts[have]
    row_of = np.full(span, -1, dtype=np.int64)
    row_of[idx] = numbers  # the last row of each minute
    traffic = Traffic(rates=rates, start=start, source=str(p), rows=len(rows), sample_s=sample_s)
    if sample_s < STEP_S and len(rows) > span:
        traffic.notes.append(f"{len(rows):,} samples every {sample_s:g} s averaged into {span:,} minutes")
    hold = max(1, int(round(sample_s / STEP_S)))
    if hold > 1:  # coarser than a minute: each sample holds for its interval, a missing sample is a gap
        for k in range(1, hold):
            fill = np.isnan(rates) & np.roll(~np.isnan(rates), k)
            fill[:k] = False
            rates[fill] = np.roll(rates, k)[fill]
            row_of[fill] = np.roll(row_of, k)[fill]
        traffic.notes.append(f"one sample every {sample_s:g} s: each holds for its {hold} minutes")
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
    traffic.rates = rates
    traffic.row_of_minute = row_of
    return traffic


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of True."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))
