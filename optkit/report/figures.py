"""One typed view of a stage's figures. Table, compare, html and gates read measurements only through it.

A figure is absent (None), a number, or recorded as null: that is how a report stores a non-finite figure
(NaN, Inf), and `number` gives it as NaN so a gate on it fails instead of passing or being skipped. Reports
can be hand-edited, so a figure of the wrong type is a UsageError where it would decide a verdict (gates) and
simply absent where it is only shown.
"""
from __future__ import annotations

import math
from typing import Any

from optkit.core.errors import UsageError


class Figures:
    def __init__(self, stage) -> None:
        self.stage = stage
        self.m: dict[str, Any] = stage.measurements if stage is not None else {}

    def group(self, name: str) -> dict[str, Any]:
        d = self.m.get(name)
        return d if isinstance(d, dict) else {}

    def number(self, group: str, key: Any, *, strict: bool = False, null_is_missing: bool = False) -> float | None:
        """The figure: None when absent, NaN when recorded as null (None with null_is_missing). A value that is
        not a number is a UsageError with `strict`, else absent."""
        d = self.group(group)
        if not isinstance(key, str) or key not in d:
            return None
        v = d[key]
        if v is None:
            return None if null_is_missing else math.nan
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            if strict:
                raise UsageError(f"stage {getattr(self.stage, 'name', '?')!r}: figure {group}.{key} is {v!r}, "
                                 "not a number")
            return None
        return float(v)

    def finite(self, group: str, key: Any) -> float | None:
        """The figure when it is a finite number, else None (for showing and plotting)."""
        v = self.number(group, key)
        return v if v is not None and math.isfinite(v) else None

    # the figures the renderers and gates name
    @property
    def size_bytes(self) -> float | None:
        return self.finite("size", "bytes")

    @property
    def parameters(self) -> float | None:
        return self.finite("size", "parameters")

    def latency(self, key: str = "p50_ms") -> float | None:
        return self.finite("latency", key)

    @property
    def p50_ms(self) -> float | None:
        return self.latency("p50_ms")

    @property
    def metric(self) -> str | None:
        m = self.group("accuracy").get("metric")
        return m if isinstance(m, str) else None

    def accuracy(self, *, strict: bool = False) -> float | None:
        """The value of the stage's own metric (NaN when recorded as null)."""
        return self.number("accuracy", self.metric, strict=strict) if self.metric else None

    def fidelity(self, key: str) -> float | None:
        return self.finite("fidelity", key)

    @property
    def latency_change(self) -> dict[str, Any]:
        """The paired input/output latency ratio with its CI (single-stage commands), or {}."""
        return self.group("latency_change")
