"""Gates: thresholds on report figures that turn a run into an exit code.

A gate is written `metric <= value` (or `<`, `>=`, `>`), optionally `metric@stage <= value`; the default
stage is the last one. Three kinds:

- absolute: size_mb, latency_p50_ms / latency_p90_ms / latency_p99_ms, normalized_latency, throughput,
  memory_mb, accuracy, cosine, top1_agreement
- relative to the first stage (the input model): accuracy_drop, size_ratio, speedup
- relative to a baseline report: latency_regression_pct, size_growth_pct, accuracy_drop_vs_baseline

Latency gates are noise-aware: latency is measured in repeated trials (optkit.measure.trials), each
trial giving one contention-robust estimate (the 10th percentile of its runs, optionally divided by a
reference workload timed call by call in the same trial). The trials' spread is the measured noise.

`latency_regression_pct` compares the run's trials with the baseline's trials, using both sides' noise:

- the figure: machine-normalised latency when both reports timed a common reference rung (a baseline
  from another runner stays usable; with two common rungs, their geometric mean per trial), else the
  raw per-trial 10th percentile, else raw p50;
- the estimate: the Hodges-Lehmann shift, i.e. the median of all n*m pairwise differences
  log(run trial) - log(baseline trial), reported as a % change. It is the shift estimator that goes
  with the Mann-Whitney test: one bad trial on either side moves it little;
- the 95% confidence interval: the K-th smallest and K-th largest of those differences, with
  K = floor(n*m/2 - 1.96 * sqrt(n*m*(n+m+1)/12)) (at least 1) from the normal approximation to the
  Mann-Whitney U distribution; that is the distribution-free interval for a shift and needs no
  normality of the trials. With one trial on a side there is no interval (old reports: the combined
  ci95 half-widths are used instead).

Every gate on a figure that carries noise (the latency percentiles, normalised latency, throughput, speedup,
latency_regression_pct) is judged on the figure's 95% band, not on the point:

- pass: the whole band is on the right side of the threshold (`<=`: its upper end is under it; `>=`: its
  lower end is over it);
- fail: the whole band is on the wrong side;
- cannot judge: the band straddles the threshold. The noise is wider than the margin, so the measurement
  does not say which side the figure is on. That is not a pass: it exits 1 like a failure, with its own
  verdict ("cannot judge: the noise (±X) is wider than the margin (Y); measure longer or on a quieter
  runner").

The band is the 95% interval of the figure: for latency_regression_pct the Mann-Whitney interval above, for an
absolute p50 the figure times the relative 95% half-width of the trials' mean (`ci95_pct`, two trials or more),
else the band the runs themselves give (`latency.ci95`: for a percentile the distribution-free interval of order
statistics, for the throughput the normal interval of the mean run time; optkit.measure.latency.bands); the
p90, p99 and throughput are judged on their own runs' band only (widened to the trials' relative spread where
that is wider), never on the p50's: a tune stage's p99 of 100 runs has no upper end, and `latency_p99_ms <= 40`
cannot be judged however steady the trials' p50s; for the throughput under load (bench --concurrency, a recipe's
measure.concurrency, bench --url) the inverse of the t interval of the time per sample of ten equal groups of
the run's calls, which never reaches 0 (`concurrency.ci95`), for speedup the two stages' half-widths combined. A noise-carrying figure with no
band at all (a report edited by hand, or written before optkit recorded bands) is not judged as exact: "cannot
judge: the figure carries no noise band; measure it again with this optkit". A band end the runs do not bound
(e.g. the p99 of fewer than 368 runs has no upper end) cannot be on the right side of a threshold either.
Figures without a measured noise (size, accuracy, fidelity, memory) have a band of zero
width: plain pass or fail; except accuracy_drop on a metric with no per-sample loss (f1, spearman, pearson), judged
on the 95% interval of a paired bootstrap over the rows that the stage's measurement against the input records
(`accuracy.drop_ci95`, measure.textmetrics). A band or a latency that no measurement gives (negative, NaN, the wrong type, a band
that does not hold its figure) is bad input (UsageError, exit 2), read by StageFigures.of(strict=True). A
regression gate on an unchanged model stays a pass as long as the upper end of the interval is under the
threshold: the interval is that of a shift estimate over all trial pairs, a few % wide on a shared machine
(benchmarks/gate_stability.py measures both sides of this). On a heavily overloaded machine (a load average
several times its cores) machine normalisation does not cancel all of the contention: an unchanged model can
measure up to ~+10% against a baseline taken in a quiet moment, and its gate then says "cannot judge", which
is what the measurement supports (it used to pass on the point estimate, and missed real regressions the same
way).
"""
from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from optkit.core.errors import UsageError
from optkit.measure.latency import runs_to_bound
from optkit.report.figures import Normalisation, StageFigures, finite
from optkit.report.schema import GateResult, Report, Stage

OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": lambda v, t: v <= t, "<": lambda v, t: v < t, ">=": lambda v, t: v >= t, ">": lambda v, t: v > t,
}


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str            # absolute, first, baseline
    needs: str           # the figure it reads: size, latency, normalized, accuracy, fidelity
    unit: str
    help: str


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("size_mb", "absolute", "size", "MB", "model size on disk"),
    Metric("latency_p50_ms", "absolute", "latency", "ms", "median latency"),
    Metric("latency_p90_ms", "absolute", "latency", "ms", "90th percentile latency"),
    Metric("latency_p99_ms", "absolute", "latency", "ms", "99th percentile latency"),
    Metric("normalized_latency", "absolute", "normalized", "x ref", "p50 / the reference workload's p50"),
    Metric("throughput", "absolute", "throughput", "samples/s", "samples per second (under load when the stage "
           "measured concurrency, else one call at a time)"),
    Metric("memory_mb", "absolute", "memory", "MiB", "peak memory (RSS) of loading and running the model"),
    Metric("accuracy", "absolute", "accuracy", "", "the eval metric (e.g. top1)"),
    Metric("cosine", "absolute", "fidelity", "", "cosine similarity of outputs to the input model"),
    Metric("top1_agreement", "absolute", "fidelity", "", "share of samples with the input model's top-1"),
    Metric("accuracy_drop", "first", "accuracy", "", "first stage's accuracy minus this stage's"),
    Metric("size_ratio", "first", "size", "x", "this stage's size / the first stage's"),
    Metric("speedup", "first", "latency", "x", "input / this stage's latency, timed call by call (95% band)"),
    Metric("latency_regression_pct", "baseline", "latency", "%", "latency change vs the baseline report"),
    Metric("size_growth_pct", "baseline", "size", "%", "size change vs the baseline report"),
    Metric("accuracy_drop_vs_baseline", "baseline", "accuracy", "", "baseline accuracy minus this run's"),
)}
ALIASES = {"p50_ms": "latency_p50_ms", "p90_ms": "latency_p90_ms", "p99_ms": "latency_p99_ms",
           "size": "size_mb", "latency_regression": "latency_regression_pct", "size_growth": "size_growth_pct"}

_GATE = re.compile(r"^\s*(?P<metric>[A-Za-z0-9_]+)(?:@(?P<stage>[\w.\-]+))?\s*(?P<op><=|>=|<|>)\s*"
                   r"(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(?P<pct>%)?\s*$")


@dataclass(frozen=True)
class Gate:
    metric: str
    op: str
    threshold: float
    stage: str | None = None

    @property
    def text(self) -> str:
        at = f"@{self.stage}" if self.stage else ""
        return f"{self.metric}{at} {self.op} {self.threshold:g}"


def _metric(name: str) -> str:
    name = ALIASES.get(name, name)
    if name not in METRICS:
        close = difflib.get_close_matches(name, list(METRICS) + list(ALIASES), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(METRICS)}"
        raise UsageError(f"unknown gate metric {name!r}; {hint}")
    return name


def parse_gate(spec: Any) -> Gate:
    """A gate from `metric[@stage] OP value` or a mapping {metric, stage, max|min|op+value}."""
    if isinstance(spec, str):
        m = _GATE.match(spec)
        if not m:
            raise UsageError(f"cannot read gate {spec!r}; write it as `metric <= value`, e.g. `size_mb <= 5`")
        return Gate(_metric(m["metric"]), m["op"], _threshold(m["value"], spec), m["stage"])
    if hasattr(spec, "model_dump"):
        d = spec.model_dump()
    elif isinstance(spec, dict):
        d = spec
    else:  # e.g. a number or a list in a hand-edited report's recipe
        raise UsageError(f"cannot read gate {spec!r}; write it as `metric <= value`, e.g. `size_mb <= 5`")
    metric = _metric(str(d.get("metric")))
    given = [k for k in ("max", "min", "value") if d.get(k) is not None]
    if len(given) != 1:
        raise UsageError(f"gate on {metric} needs exactly one of max, min, or op with value")
    if given[0] == "max":
        op, value = d.get("op") or "<=", d["max"]
    elif given[0] == "min":
        op, value = d.get("op") or ">=", d["min"]
    else:
        if not d.get("op"):
            raise UsageError(f"gate on {metric} has a value but no op (<=, <, >=, >)")
        op, value = d["op"], d["value"]
    return Gate(metric, op, _threshold(value, f"{metric} {op} {value}"), d.get("stage"))


def _threshold(value: Any, gate: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"gate {gate!r}: threshold {value!r} is not a number") from None
    if not math.isfinite(v):  # NaN compares false with everything; an infinite bound checks nothing
        raise UsageError(f"gate {gate!r}: threshold {value!r} is not a finite number")
    return v


def parse_gates(specs) -> list[Gate]:
    return [parse_gate(s) for s in specs or []]


def gates_of_recipe(loaded) -> list[Gate]:
    return parse_gates(loaded.recipe.gates)


def check_gates_plan(gates: list[Gate], *, stages: list[str], measured: set[str], has_baseline: bool) -> None:
    """Before any work: each gate names a known stage and a figure the run will measure."""
    for g in gates:
        meta = METRICS[g.metric]
        if g.stage and g.stage not in stages:
            raise UsageError(f"gate {g.text!r}: no stage named {g.stage!r}; stages: {', '.join(stages)}")
        if meta.needs not in measured:
            why = {"latency": "latency is not measured (measure.latency: false)",
                   "normalized": "normalised latency is not measured (measure.normalize: false)",
                   "accuracy": "accuracy is not measured (add data.eval)",
                   "fidelity": "fidelity is not measured",
                   "throughput": "throughput is not measured (measure.latency: false and no measure.concurrency)"}.get(meta.needs, f"{meta.needs} is not measured")
            raise UsageError(f"gate {g.text!r} cannot be checked: {why}")
        if meta.kind == "baseline" and not has_baseline:
            raise UsageError(f"gate {g.text!r} compares with a baseline report; set `baseline:` or --baseline")


# ---------------------------------------------------------------- reading figures

@dataclass(frozen=True)
class Band:
    """A 95% band (lo, hi) in the figure's unit; an end the measurement does not bound is infinite, and `open`
    says why (shown when the gate cannot be judged for it)."""
    lo: float
    hi: float
    open: str = ""

    @classmethod
    def of(cls, lo: float | None, hi: float | None, why: str = "") -> Band:
        """From a report's [low, high], where null is an end the measurement does not bound."""
        return cls(-math.inf if lo is None else lo, math.inf if hi is None else hi, why)


NO_BAND = "the figure carries no noise band; measure it again with this optkit"
QUANTILES = {"p50_ms": 0.50, "p90_ms": 0.90, "p99_ms": 0.99}


def _noise_rel(f: StageFigures, normalized: bool = False) -> float | None:
    """Relative 95% half-width of the stage's latency over its trials (None: one trial or an older report)."""
    rel = f.normalized_ci95_pct if normalized else f.ci95_pct
    return None if rel is None else rel / 100


def _latency_band(f: StageFigures, key: str, metric: str) -> tuple[float | Band | None, str]:
    """The 95% band of a latency figure (p50_ms, p90_ms, p99_ms, throughput_per_s) and a detail. The trials'
    half-width (ci95_pct) is that of their p50s: it is the p50's band. Every other figure is judged on its own
    band, that of the runs (latency.ci95), widened to the trials' relative spread where that is wider (a machine
    that drifts between trials moves every percentile); a figure without a band of its own has none (None),
    whatever the p50's: 100 runs do not bound a p99 from above, however steady their p50."""
    v = getattr(f, key)
    rel = _noise_rel(f)
    if rel is not None and key == "p50_ms":
        return (v or 0) * rel, _ci_detail(f)
    b = f.ci95.get(key)
    if b is None:
        return None, "" if rel is None else f"{_ci_detail(f)} is the p50's band, not this figure's"
    lo, hi = b
    runs = int(f.runs) if f.runs is not None and math.isfinite(f.runs) else None
    what = f"the {round(100 * QUANTILES[key])}th percentile" if key in QUANTILES else "the throughput"
    why = ""
    if lo is None or hi is None:
        side = "upper" if hi is None else "lower"
        fewest = f"time at least {runs_to_bound(QUANTILES[key], side)} runs (--runs)" if key in QUANTILES else "time more runs"
        why = f"{runs or 'its'} runs do not bound {what} from {'above' if hi is None else 'below'}; {fewest}"
    band = Band.of(lo, hi, why)
    shown = f"{_q(lo, metric) if lo is not None else 'no lower end'} .. {_q(hi, metric) if hi is not None else 'no upper end'}"
    detail = f"95% band {shown} ({runs or '?'} runs)"
    if rel is not None and v is not None and math.isfinite(v):
        band = Band(min(band.lo, v * (1 - rel)), max(band.hi, v * (1 + rel)), band.open)
        detail += f", p50 {_ci_detail(f)}"
    return band, detail


def _load_band(f: StageFigures) -> tuple[Band | None, str]:
    """The 95% band of the throughput under load (concurrency.ci95, from ten equal groups of the run's calls;
    optkit.measure.concurrency.throughput_band) and a detail; None: the report carries no band."""
    where = f"{f.concurrency} in flight"
    b = f.load_ci95.get("throughput_per_s")
    if b is None:
        return None, where
    lo, hi = b
    why = ("too few calls under load to bound the throughput (under 10): time more runs" if lo is None else
           "the throughput under load is too noisy to bound from above: time more runs" if hi is None else "")
    band = Band.of(lo, hi, why)
    if why:
        return band, f"{where}, no 95% band"
    return band, f"{where}, 95% band {_q(lo, 'throughput')} .. {_q(hi, 'throughput')}"


def _rel_band(f: StageFigures) -> float | None:
    """The relative 95% half-width of a stage's p50 (trials, else its runs' band; inf: a side is unbounded)."""
    rel = _noise_rel(f)
    if rel is not None:
        return rel
    b, v = f.ci95.get("p50_ms"), f.p50_ms
    if b is None or not v or not math.isfinite(v):
        return None
    if b[0] is None or b[1] is None:
        return math.inf
    return max(v - b[0], b[1] - v) / v


def _find(report: Report, name: str | None, what: str) -> Stage:
    if not report.stages:
        raise UsageError(f"{what} has no stages")
    if name is None:  # the last stage measured: a split or capacity stage passes its model through unmeasured
        return next((s for s in reversed(report.stages) if s.measured), report.stages[-1])
    for s in report.stages:
        if s.name == name:
            return s
    raise UsageError(f"{what} has no stage {name!r}; stages: {', '.join(s.name for s in report.stages)}")


def _value(g: Gate, report: Report, baseline: Report | None) -> tuple[float | None, float | Band | None, str]:
    """(value, 95% band, detail); value None when a figure is missing. The band is a half-width in the value's
    unit (0: a figure without noise), a Band (lo, hi), or None: a noise-carrying figure that carries no band."""
    s = _find(report, g.stage, "the report")
    first = report.stages[0]
    # a verdict depends on these figures: strict (a wrong type is a UsageError); null reads as NaN
    f = StageFigures.of(s, strict=True)
    m = g.metric
    if m == "size_mb":
        return f.size_mb, 0.0, ""
    if m.startswith("latency_p"):
        key = m.removeprefix("latency_")
        return (getattr(f, key), *_latency_band(f, key, m))
    if m == "normalized_latency":
        v, rel = f.normalized, _noise_rel(f, True)
        return v, (None if rel is None else (v or 0) * rel), _ci_detail(f, True)
    if m == "throughput":
        if f.load_throughput_per_s is not None:
            return f.load_throughput_per_s, *_load_band(f)
        return (f.throughput_per_s, *_latency_band(f, "throughput_per_s", m))
    if m == "memory_mb":
        return f.memory_mb, 0.0, "peak RSS above the baseline"
    if m == "accuracy":
        return f.accuracy, 0.0, f.metric or ""
    if m == "cosine":
        return f.cosine, 0.0, ""
    if m == "top1_agreement":  # null: the outputs have no classes (not applicable), so absent
        return f.top1_agreement, 0.0, ""
    if m == "accuracy_drop":
        a, b = StageFigures.of(first, strict=True).accuracy, f.accuracy
        detail = f"{first.name} {_f(a)} -> {s.name} {_f(b)}"
        if f.accuracy_drop_ci95 is not None and s is not first:  # no per-sample loss: a paired bootstrap's band
            lo, hi = f.accuracy_drop_ci95
            return (None if a is None or b is None else a - b), Band(lo, hi), f"{detail}; 95% band {lo:+.4f} .. {hi:+.4f}"
        return (None if a is None or b is None else a - b), 0.0, detail
    if m == "size_ratio":
        a, b = StageFigures.of(first, strict=True).size_bytes, f.size_bytes
        return (None if not a or b is None else b / a), 0.0, f"{first.name} -> {s.name}"
    if m == "speedup":
        change = f.latency_change  # timed call by call against the input: the figure the tables show
        if change is not None and finite(change.ratio) and change.ratio_ci95 and len(change.ratio_ci95) == 2:
            v, (lo, hi) = 1 / change.ratio, change.ratio_ci95
            return v, max(v - 1 / hi, 1 / lo - v), f"against {first.name} call by call: {1 / hi:.3g}-{1 / lo:.3g}x"
        fa = StageFigures.of(first, strict=True)
        a, b = fa.p50_ms, f.p50_ms
        if not a or not b:
            return None, 0.0, ""
        v = a / b
        ra, rb = _rel_band(fa), _rel_band(f)
        detail = f"p50 {a:.4g} -> {b:.4g} ms"
        if ra is None or rb is None:
            return v, None, detail
        rel = math.hypot(ra, rb)
        if math.isinf(rel):
            return v, Band(0.0, math.inf, "too few runs to bound a stage's p50: time at least 6 runs"), detail
        return v, v * rel, detail
    # baseline
    if baseline is None:
        raise UsageError(f"gate {g.text!r} compares with a baseline report; pass --baseline REPORT.json")
    try:
        bs = _find(baseline, s.name, "the baseline report")
    except UsageError:
        bs = baseline.stages[-1]
    fb = StageFigures.of(bs, strict=True)
    if m == "size_growth_pct":
        a, b = fb.size_bytes, f.size_bytes
        return (None if not a or b is None else 100 * (b / a - 1)), 0.0, f"{_mb(a)} -> {_mb(b)}"
    if m == "accuracy_drop_vs_baseline":
        a, b = fb.accuracy, f.accuracy
        return (None if a is None or b is None else a - b), 0.0, f"baseline {_f(a)} -> {_f(b)}"
    return _regression(fb, f)


def shift_ci(base: list[float], cur: list[float]) -> tuple[float, float, float]:
    """Hodges-Lehmann estimate of log(cur) - log(base) with its 95% Mann-Whitney interval (see the top)."""
    d = np.sort(np.subtract.outer(np.log(np.asarray(cur, float)), np.log(np.asarray(base, float))).ravel())
    n, m = len(cur), len(base)
    k = max(1, math.floor(n * m / 2 - 1.96 * math.sqrt(n * m * (n + m + 1) / 12)))
    return float(np.median(d)), float(d[k - 1]), float(d[n * m - k])


def _regression(fa: StageFigures, fb: StageFigures) -> tuple[float | None, Band | None, str]:
    """% change of latency from the baseline stage's figures (fa) to the run's (fb), its 95% interval (None: a
    side carries no band) and a detail."""
    na, nb = fa.normalisations, fb.normalisations
    common = [k for k in na if k in nb]
    if common:
        # every reference rung both runs timed; several are combined per trial by their geometric mean (a
        # reference "between" them in size), so a cache effect that favours one rung over the other cancels
        def combine(refs: dict[Any, Normalisation], key: str) -> Any:
            vals = [getattr(refs[k], key) for k in common]
            if any(not v for v in vals):
                return None
            if key == "normalized":
                return math.exp(float(np.mean(np.log(vals))))
            return [math.exp(x) for x in np.mean(np.log(np.asarray(vals, float)), axis=0)]

        basis = f"normalised ({'+'.join(str(k or 'reference') for k in common)})"
        ta, tb = combine(na, "trial_normalized"), combine(nb, "trial_normalized")
        pa, pb = combine(na, "normalized"), combine(nb, "normalized")
        ca, cb = (None if any(r[k].ci95_pct is None for k in common) else max(r[k].ci95_pct for k in common)
                  for r in (na, nb))
    elif fa.trial_low_ms and fb.trial_low_ms:
        basis, ta, tb = "raw p10 ms", fa.trial_low_ms, fb.trial_low_ms
        pa, pb, ca, cb = fa.low_ms, fb.low_ms, fa.low_ci95_pct, fb.low_ci95_pct
    else:
        basis, ta, tb = "p50 ms", fa.trial_p50_ms, fb.trial_p50_ms
        pa, pb = fa.p50_ms, fb.p50_ms
        ca, cb = ((None if r is None else 100 * r) for r in (_rel_band(fa), _rel_band(fb)))
    if ta and tb and len(ta) > 1 and len(tb) > 1:
        est, lo, hi = shift_ci(ta, tb)
        v, ci = 100 * math.expm1(est), (100 * math.expm1(lo), 100 * math.expm1(hi))
        detail = f"{basis} {float(np.median(ta)):.4g} -> {float(np.median(tb)):.4g}, {len(ta)}+{len(tb)} trials"
        return v, Band(*ci), detail
    if not pa or not pb:
        return None, None, ""
    v = 100 * (pb / pa - 1)
    if ca is None or cb is None:   # a side without a band: the change cannot be judged as exact
        return v, None, f"{basis} {pa:.4g} -> {pb:.4g}"
    noise = 100 * (pb / pa) * math.hypot(ca / 100, cb / 100)
    if math.isinf(noise):
        return v, Band(-math.inf, math.inf, "too few runs to bound a side's p50: time at least 6 runs"), \
            f"{basis} {pa:.4g} -> {pb:.4g}"
    return v, Band(v - noise, v + noise), f"{basis} {pa:.4g} -> {pb:.4g}"


def _f(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def _mb(v) -> str:
    return "-" if v is None else f"{v / 1e6:.3f} MB"


def _ci_detail(f: StageFigures, normalized: bool = False) -> str:
    rel = f.normalized_ci95_pct if normalized else f.ci95_pct
    if rel is None:
        return ""
    return f"±{rel:.1f}% over {f.trials} trials"


def evaluate(report: Report, gates: list[Gate], baseline: Report | None = None) -> list[GateResult]:
    """Check every gate; a gate on a figure the report lacks is a usage error (exit 2)."""
    results = []
    for g in gates:
        value, band, detail = _value(g, report, baseline)
        stage = _find(report, g.stage, "the report").name
        if value is None:
            meta = METRICS[g.metric]
            other = {"first": f" or for the first stage {report.stages[0].name!r}",
                     "baseline": " or in the baseline report"}.get(meta.kind, "")
            raise UsageError(f"gate {g.text!r}: the report has no {meta.needs} figures for stage {stage!r}{other}")
        # a NaN figure compares false with everything and an infinite one or an infinite noise passes any
        # bound: neither is a measurement, so the gate fails, never passes
        why = _not_finite(value, band)
        upper = g.op in ("<=", "<")
        # margin: how far the figure is on the right side of the threshold (negative: the wrong side); the verdict
        # also weighs the noise: it is "cannot judge" when the noise is wider than the margin
        margin = None if why else (g.threshold - value if upper else value - g.threshold)
        if why or band is None:   # no band on a noisy figure: not judged as exact (it is no measurement of one)
            results.append(GateResult(gate=g.text, metric=g.metric, stage=stage, value=value, threshold=g.threshold,
                                      op=g.op, passed=False, margin=margin,
                                      detail=why or f"{CANNOT_JUDGE}: {NO_BAND}" + (f"; {detail}" if detail else "")))
            continue
        if isinstance(band, Band):
            lo, hi = min(band.lo, value), max(band.hi, value)
            noise = (hi - lo) / 2
        else:
            lo, hi, noise = value - band, value + band, band
        ok = OPS[g.op]
        worst, best = (hi, lo) if upper else (lo, hi)   # the band's ends on the wrong and the right side
        passed = ok(worst, g.threshold)
        if g.metric == "latency_regression_pct" and isinstance(band, Band):
            detail += f"{'; ' if detail else ''}95% CI {band.lo:+.1f}% .. {band.hi:+.1f}%"
        if not passed and ok(best, g.threshold):
            across = lo if value > g.threshold else hi   # the band's end on the other side of the threshold
            if math.isinf(across):
                reason = band.open if isinstance(band, Band) and band.open else "measure longer"
                detail = f"{CANNOT_JUDGE}: the 95% band has no {'upper' if across > 0 else 'lower'} end ({reason})" + (
                    f"; {detail}" if detail else "")
            else:
                detail = _cannot_judge(g, value, lo, hi) + (f"; {detail}" if detail else "")
        elif noise and isinstance(band, Band) and g.metric != "latency_regression_pct":
            pass   # the detail already shows the band
        elif noise:
            detail = (detail + "; " if detail else "") + f"noise ±{_q(noise, g.metric)}"
        results.append(GateResult(gate=g.text, metric=g.metric, stage=stage, value=value, threshold=g.threshold,
                                  op=g.op, passed=passed, margin=margin, detail=detail))
    return results


CANNOT_JUDGE = "cannot judge"


def _q(x: float, metric: str) -> str:
    """x with the metric's unit: 62 ms, 4.5%, 1.2x."""
    unit = METRICS[metric].unit
    return f"{x:.3g}{'' if unit in ('', '%', 'x') else ' '}{unit}"


def _cannot_judge(g: Gate, value: float, lo: float, hi: float) -> str:
    """The detail of a gate whose 95% band (lo, hi) straddles its threshold. The noise named is the band's reach
    from the figure across the threshold: the half-width of a symmetric band, the far side of an interval."""
    reach = value - lo if value > g.threshold else hi - value
    return (f"{CANNOT_JUDGE}: the noise (±{_q(reach, g.metric)}) is wider than the margin "
            f"({_q(abs(value - g.threshold), g.metric)}); measure longer or on a quieter runner")


def _not_finite(value, band) -> str:
    """Why a gate's figure cannot be compared ('' when it can). A Band may have an infinite end (unbounded by
    the measurement), never a NaN one; a half-width must be finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"value {value!r} is not a number"
    if math.isnan(value):
        return "value is NaN (or recorded as null: not a finite figure)"
    if not math.isfinite(value):
        return f"value is {value} (not a finite figure)"
    if isinstance(band, Band):
        if math.isnan(band.lo) or math.isnan(band.hi):
            return "its noise is not a finite figure"
    elif band is not None and not (isinstance(band, (int, float)) and math.isfinite(band)):
        return "its noise is not a finite figure"
    return ""


def failed(results: list[GateResult]) -> list[GateResult]:
    return [r for r in results if not r.passed]


def describe_metrics() -> list[tuple[str, str, str]]:
    return [(m.name, m.kind, m.help) for m in METRICS.values()]
