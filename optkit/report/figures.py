"""One typed view of a stage's figures: `StageFigures.of(stage)`. Table, render, compare, html and gates read
a stage's measurements only through it; the JSON report keeps its untyped `measurements` dict.

Every figure is a field that is None when the report lacks it, never a KeyError. A figure the report records
as null is a non-finite measurement (JSON has no NaN or Inf; pydantic writes them as null) and reads:
- as NaN for a measured figure (size, latency, accuracy, cosine), so a gate on it fails instead of passing or
  being skipped;
- as +inf for an error (max / mean abs error): the only non-finite error `measure.fidelity` records;
- as None where null means "none": a confidence interval of one trial, top-1 agreement of outputs that have
  no classes, an end of a 95% band (`latency.ci95`) that the runs do not bound.
A latency figure or band that no measurement gives (a negative latency, throughput or band, a NaN band, a band
that does not hold its figure) is, with `strict`, a UsageError: the report was edited or damaged.
Numbers keep their type (an int stays an int), so they print as they did. A figure of the wrong type (a
hand-edited or hand-built report) is simply absent; with `strict` (gates: a verdict depends on it) it is a
UsageError, as `Report.load` refuses such a report up front.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from optkit.core.errors import UsageError


def finite(v: Any) -> float | None:
    """v when it is a finite number, else None (absent, NaN, Inf or not a number): what is shown and plotted."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return v


class _Reader:
    """Reads one group of a stage's measurements (a dict) into typed values."""

    def __init__(self, stage: str, group: str, d: Any, strict: bool) -> None:
        self.stage, self.group, self.strict = stage, group, strict
        self.d: dict[str, Any] = d if isinstance(d, dict) else {}

    def wrong(self, key: str, v: Any, what: str = "a number") -> None:
        """A figure of the wrong type: absent, or with `strict` a UsageError."""
        if self.strict:
            shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
            raise UsageError(f"stage {self.stage!r}: figure {self.group}.{key} is {shown}, not {what}")

    def number(self, key: str, null: float | None = math.nan, *, nonneg: bool = False,
               band: bool = False) -> float | None:
        """The figure; `null` is what a recorded null reads as. `nonneg`: a negative value is wrong (a latency, a
        throughput); `band`: a 95% band's half-width, which is neither negative nor NaN."""
        if key not in self.d:
            return None
        v = self.d[key]
        if v is None:
            return null
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.wrong(key, v)
            return None
        if band and not v >= 0:
            self.wrong(key, v, "a 95% band (a number >= 0)")
            return None
        if nonneg and v < 0:
            self.wrong(key, v, "a measured figure (it is never negative)")
            return None
        return v

    def numbers(self, key: str) -> tuple[float, ...] | None:
        """A list of figures (per trial); a null element reads as NaN."""
        v = self.d.get(key)
        if v is None:
            return None
        ok = isinstance(v, list) and all(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool))
                                         for x in v)
        if not ok:
            self.wrong(key, v, "a list of numbers")
            return None
        return tuple(math.nan if x is None else x for x in v)

    def text(self, key: str) -> str | None:
        v = self.d.get(key)
        return v if isinstance(v, str) else None

    def count(self, key: str) -> int | None:
        """A count shown but never judged (threads, trials): an int, else absent."""
        v = self.d.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class Normalisation:
    """Machine-normalised latency on one reference rung: the model's p10 / the reference's, per trial."""
    normalized: float | None = None
    trial_normalized: tuple[float, ...] | None = None
    ci95_pct: float | None = None             # None: one trial, no interval
    low_ms: float | None = None
    bytes: float | None = None                # the reference's size


@dataclass(frozen=True)
class LatencyChange:
    """The paired input/output latency ratio (single-stage commands: both timed call by call)."""
    ratio: float | None = None                # output / input
    ratio_ci95: tuple[float, ...] | None = None
    significant: bool = False
    trials: int | None = None


@dataclass(frozen=True)
class OutputFidelity:
    """Fidelity of one output to the reference model's."""
    cosine: float | None = None
    max_abs_error: float | None = None
    mean_abs_error: float | None = None
    max_rel_error: float | None = None
    top1_agreement: float | None = None
    nonfinite: int | None = None
    checked: bool = True                      # whether the overall figures judge this output


@dataclass(frozen=True)
class TrialPoint:
    """One measured trial of a tune stage (measurements.tune.trials): where it sits on latency x throughput."""
    number: int | None = None
    label: str = ""
    p50_ms: float | None = None
    throughput_per_s: float | None = None
    feasible: bool = False                    # met the SLOs and the memory limit
    pareto: bool = False                      # no other trial is both faster and higher in throughput


@dataclass(frozen=True)
class StageFigures:
    """The figures of one report stage; see the module's doc for what None, NaN and inf mean."""
    measured: frozenset[str] = frozenset()    # the groups with figures: size, latency, accuracy, fidelity
    # size
    size_bytes: float | None = None
    gzip_bytes: float | None = None
    parameters: float | None = None
    initializer_bytes: float | None = None
    sparsity: float | None = None
    # latency: over all timed runs of all trials
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    mean_ms: float | None = None
    std_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    throughput_per_s: float | None = None
    runs: float | None = None
    batch: float | None = None
    threads: int | None = None
    trials: int | None = None
    runtime: str | None = None                # the runtime that ran the model, with its version ("openvino 2026.4.0")
    # latency: the 95% band (low, high) of p50_ms / p90_ms / p99_ms / throughput_per_s from the runs themselves
    # (order statistics; optkit.measure.latency.bands), None for an end the runs do not bound
    ci95: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    # latency: per trial, with the 95% half-width of their mean in % (None: one trial)
    trial_p50_ms: tuple[float, ...] | None = None
    ci95_pct: float | None = None
    low_ms: float | None = None               # the median of the trials' 10th percentiles
    trial_low_ms: tuple[float, ...] | None = None
    low_ci95_pct: float | None = None
    # latency: machine-normalised on the primary reference rung, and on every rung timed
    normalized: float | None = None
    trial_normalized: tuple[float, ...] | None = None
    normalized_ci95_pct: float | None = None
    reference: str | None = None
    references: dict[str, Normalisation] = field(default_factory=dict)
    latency_change: LatencyChange | None = None
    # accuracy: the stage's own metric and its value, and every float the group holds by name
    metric: str | None = None
    accuracy: float | None = None
    scores: dict[str, float] = field(default_factory=dict)
    # the 95% interval of the drop from the reference (the input) to this stage, from a paired bootstrap over the
    # rows: metrics with no per-sample loss (f1, spearman, pearson; measure.textmetrics)
    accuracy_drop_ci95: tuple[float, ...] | None = None
    # fidelity to the reference model's outputs (overall: the worst of the judged outputs)
    cosine: float | None = None
    top1_agreement: float | None = None       # None also when the outputs have no classes
    max_abs_error: float | None = None
    mean_abs_error: float | None = None
    outputs: dict[str, OutputFidelity] = field(default_factory=dict)
    # memory: RSS in MiB above the measuring process's baseline, after loading and at the peak while running
    load_mb: float | None = None
    memory_mb: float | None = None
    # under load: `concurrency` requests in flight over `sessions` sessions
    concurrency: int | None = None
    sessions: int | None = None
    connections: int | None = None            # a served model (bench --url): one HTTP connection per request
    load_throughput_per_s: float | None = None
    load_p50_ms: float | None = None
    load_p99_ms: float | None = None
    load_ci95: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)  # as ci95, under load
    # tune: the trials measured (complete, not a repeat of another) and the chosen one's number
    tune_trials: tuple[TrialPoint, ...] = ()
    tune_best: int | None = None

    @classmethod
    def of(cls, stage: Any, *, strict: bool = False) -> StageFigures:
        """The figures of a report stage (of None: no figure at all). With `strict`, a figure of the wrong type
        is a UsageError instead of absent."""
        m = getattr(stage, "measurements", None)
        if not isinstance(m, dict):
            return cls()
        name = str(getattr(stage, "name", "?"))

        def reader(group: str) -> _Reader:
            if strict and m.get(group) is not None and not isinstance(m[group], dict):
                raise UsageError(f"stage {name!r}: figures {group} are {type(m[group]).__name__}, not an object")
            return _Reader(name, group, m.get(group), strict)

        size, lat, acc, fid = reader("size"), reader("latency"), reader("accuracy"), reader("fidelity")
        mem, conc = reader("memory"), reader("concurrency")
        size_keys = {"size_bytes": "bytes", "gzip_bytes": "gzip_bytes", "parameters": "parameters",
                     "initializer_bytes": "initializer_bytes", "sparsity": "sparsity"}
        lat_keys = ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "std_ms", "min_ms", "max_ms", "throughput_per_s",
                    "runs", "batch", "low_ms", "normalized")
        intervals = ("ci95_pct", "low_ci95_pct", "normalized_ci95_pct")
        metric = acc.d.get("metric")
        if metric is not None and not isinstance(metric, str):
            acc.wrong("metric", metric, "a metric's name")
            metric = None
        lat_values = {k: lat.number(k, nonneg=True) for k in lat_keys}
        load_values = {k: conc.number(k, nonneg=True) for k in BANDED}
        return cls(
            measured=frozenset(r.group for r in (size, lat, acc, fid, mem, conc) if r.d),
            **{f: size.number(k) for f, k in size_keys.items()},
            **lat_values,
            **{k: lat.number(k, None, band=True) for k in intervals},
            ci95=_bands(lat, lat_values),
            **{k: lat.numbers(k) for k in ("trial_p50_ms", "trial_low_ms", "trial_normalized")},
            threads=lat.count("threads"), trials=lat.count("trials"), reference=lat.text("reference"),
            runtime=_runtime(reader("runtime")),
            references=_references(lat),
            latency_change=_latency_change(m.get("latency_change"), name, strict),
            metric=metric,
            accuracy=acc.number(metric) if metric else None,
            scores={k: v for k, v in acc.d.items() if isinstance(v, float)},
            accuracy_drop_ci95=_pair(acc, "drop_ci95"),
            cosine=fid.number("cosine"),
            top1_agreement=fid.number("top1_agreement", None),
            max_abs_error=fid.number("max_abs_error", math.inf),
            mean_abs_error=fid.number("mean_abs_error", math.inf),
            outputs=_outputs(fid.d.get("outputs")),
            load_mb=mem.number("load_mb"), memory_mb=mem.number("peak_mb"),
            concurrency=conc.count("concurrency"), sessions=conc.count("sessions"),
            connections=conc.count("connections"),
            load_throughput_per_s=load_values["throughput_per_s"], load_p50_ms=load_values["p50_ms"],
            load_p99_ms=load_values["p99_ms"], load_ci95=_bands(conc, load_values),
            **_tune(m.get("tune")),
        )

    # ------------------------------------------------------------ derived figures
    @property
    def throughput(self) -> float | None:
        """Samples per second: under load when measured (bench --concurrency), else one call at a time."""
        return self.load_throughput_per_s if self.load_throughput_per_s is not None else self.throughput_per_s

    @property
    def size_mb(self) -> float | None:
        return None if self.size_bytes is None else self.size_bytes / 1e6

    @property
    def fidelity_loss(self) -> float | None:
        """1 - cosine, the budget quantize checks (2.0 for outputs with NaN or Inf: cosine -1)."""
        if self.cosine is None:
            return None
        return max(0.0, 1.0 - self.cosine) if math.isfinite(self.cosine) else math.nan

    @property
    def normalisations(self) -> dict[str | None, Normalisation]:
        """{reference rung: normalised latency}: every rung timed (older reports: the one reference, by its
        description), or {} when latency was not normalised."""
        if self.references:
            return dict(self.references)
        if self.normalized:
            return {self.reference: Normalisation(self.normalized, self.trial_normalized, self.normalized_ci95_pct)}
        return {}


def _runtime(r: _Reader) -> str | None:
    name, version = r.text("name"), r.text("version")
    return None if name is None else f"{name} {version}" if version else name


def _references(lat: _Reader) -> dict[str, Normalisation]:
    refs = lat.d.get("references")
    if not isinstance(refs, dict):
        if refs is not None:
            lat.wrong("references", refs, "an object")
        return {}
    out = {}
    for name, r in refs.items():
        if not isinstance(r, dict):
            lat.wrong(f"references.{name}", r, "an object")
            continue
        rr = _Reader(lat.stage, f"latency.references.{name}", r, lat.strict)
        out[name] = Normalisation(normalized=rr.number("normalized", nonneg=True),
                                  trial_normalized=rr.numbers("trial_normalized"),
                                  ci95_pct=rr.number("ci95_pct", None, band=True), low_ms=rr.number("low_ms"),
                                  bytes=rr.number("bytes"))
    return out


BANDED = ("p50_ms", "p90_ms", "p99_ms", "throughput_per_s")


def _pair(r: _Reader, key: str) -> tuple[float, float] | None:
    """A [low, high] interval of finite numbers, or None (absent, or not one: strict readers refuse it)."""
    v = r.numbers(key)
    if v is None:
        return None
    if len(v) != 2 or not all(math.isfinite(x) for x in v) or v[0] > v[1]:
        r.wrong(key, list(v), "a [low, high] interval")
        return None
    return (float(v[0]), float(v[1]))


def _bands(lat: _Reader, values: dict[str, float | None]) -> dict[str, tuple[float | None, float | None]]:
    """latency.ci95 (or concurrency.ci95): {figure: [low, high]}, each end a number >= 0 or null (unbounded),
    holding the figure."""
    d = lat.d.get("ci95")
    if d is None:
        return {}
    if not isinstance(d, dict):
        lat.wrong("ci95", d, "an object of 95% bands")
        return {}
    out = {}
    for key in BANDED:
        if key not in d:
            continue
        b, v = d[key], values.get(key)
        ok = isinstance(b, list) and len(b) == 2 and all(
            x is None or (isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0) for x in b)
        if ok:
            lo, hi = b
            ok = (lo is None or hi is None or lo <= hi) and (v is None or math.isnan(v) or (
                (lo is None or lo <= v) and (hi is None or v <= hi)))
        if not ok:
            lat.wrong(f"ci95.{key}", b, f"a 95% band [low, high] of numbers >= 0 (or null) holding {key} {v!r}")
            continue
        out[key] = (b[0], b[1])
    return out


def _latency_change(d: Any, stage: str = "", strict: bool = False) -> LatencyChange | None:
    r = _Reader(stage, "latency_change", d, strict)
    if "ratio" not in r.d:
        return None
    ratio, ci = r.number("ratio", nonneg=True), r.numbers("ratio_ci95")
    if ci is not None and ratio is not None and not math.isnan(ratio) and not (
            len(ci) == 2 and 0 < ci[0] <= ratio <= ci[1]):
        r.wrong("ratio_ci95", list(ci), f"a 95% interval [low, high] above 0 holding the ratio {ratio!r}")
        ci = None
    return LatencyChange(ratio=ratio, ratio_ci95=ci, significant=bool(r.d.get("significant")), trials=r.count("trials"))


def _tune(d: Any) -> dict[str, Any]:
    if not isinstance(d, dict) or not isinstance(d.get("trials"), list):
        return {}
    points = []
    for t in d["trials"]:
        if isinstance(t, dict) and t.get("state") == "complete" and "duplicate_of" not in t:
            r = _Reader("", "tune.trials", t.get("figures"), False)
            number = t.get("number")
            points.append(TrialPoint(number=number if isinstance(number, int) else None, label=str(t.get("label", "")),
                                     p50_ms=r.number("p50_ms"), throughput_per_s=r.number("throughput_per_s"),
                                     feasible=t.get("feasible") is True, pareto=t.get("pareto") is True))
    best = (d.get("best") or {}).get("trial") if isinstance(d.get("best"), dict) else None
    return {"tune_trials": tuple(points), "tune_best": best if isinstance(best, int) else None}


def _outputs(d: Any) -> dict[str, OutputFidelity]:
    if not isinstance(d, dict):
        return {}
    out = {}
    for name, e in d.items():
        if isinstance(e, dict):
            r = _Reader("", f"fidelity.outputs.{name}", e, False)
            out[name] = OutputFidelity(
                cosine=r.number("cosine"), max_abs_error=r.number("max_abs_error", math.inf),
                mean_abs_error=r.number("mean_abs_error", math.inf), max_rel_error=r.number("max_rel_error", math.inf),
                top1_agreement=r.number("top1_agreement", None), nonfinite=r.count("nonfinite"),
                checked=e.get("checked", True) is not False)
    return out
