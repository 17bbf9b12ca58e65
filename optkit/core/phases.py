"""Where a command's wall time went: one process-wide clock, lapped by what runs (start-up, reading the recipe and
data, each stage's pass and its measurement, the report), so `-v` can end with one line of phase times that adds
up to the command's wall time, counted from the process's start as the user counts it.

    phases.lap("input")            # the time since the last lap (or the process's start) is the input's
    phases.detail("build 1.0 s, timing 14.5 s")  # said beside the phase the next lap closes (a pass's own)
    phases.line()                  # "start-up 0.9 s, data 0.2 s, input 2.0 s, ...; wall 30.1 s"
"""
from __future__ import annotations

import os
import time

_laps: list[tuple[str, float]] = []
_details: dict[str, str] = {}
_pending: list[str] = []
_last: float | None = None


def _started() -> float:
    """The process's start on the time.time() clock: from /proc (its start in clock ticks since boot, against the
    boot clock: 10 ms), else this module's import."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])  # field 22, starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        return _IMPORTED


_IMPORTED = time.time()


def lap(name: str) -> None:
    """The time since the previous lap (the first: since the process started) goes to `name` (added up when a
    name laps twice)."""
    global _last
    now = time.time()
    start = _started() if _last is None else _last
    _last = now
    if _pending:
        _details[name] = "; ".join(_pending)
        _pending.clear()
    for i, (n, s) in enumerate(_laps):
        if n == name:
            _laps[i] = (n, s + now - start)
            return
    _laps.append((name, now - start))


def detail(text: str) -> None:
    """What is said in brackets beside the phase the next lap closes (a pass's own phases: build, score, timing)."""
    _pending.append(text)


def lapped() -> bool:
    return bool(_laps)


def line(last: str = "report") -> str:
    """Every phase in order with its seconds, the time since the last lap as `last`, and the wall time (their sum)."""
    lap(last)
    parts = [f"{name} {s:.1f} s" + (f" ({_details[name]})" if name in _details else "") for name, s in _laps]
    return ", ".join(parts) + f"; wall {sum(s for _, s in _laps):.1f} s"


def reset() -> None:
    """Forget every lap (a process that runs several commands: the tests)."""
    global _last
    _laps.clear()
    _details.clear()
    _pending.clear()
    _last = None
