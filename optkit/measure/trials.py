"""Noise-aware latency: repeated trials, a 95% confidence interval, and machine-normalised latency.

Why it is measured this way (a shared, busy CI runner is the normal case, not the exception):

- **Lower tail, not median.** Contention (other processes, preemption, cache thrash) only ever *adds*
  time to a call; it never makes one faster than the code allows. So within a trial the stable estimate
  of the true cost is a low quantile (LOW_Q, the 10th percentile) of many short runs: the runs that
  happened to see a quiet machine. The median and mean move with the load; the 10th percentile barely
  does, and unlike the bare minimum it is not a single lucky (or mis-timed) call.
- **Fine interleaving with a reference workload.** With `normalize`, every model call is followed right
  away by one call of each reference workload (seeded ONNX MLPs on onnxruntime, same threads), so the
  model and the references see the same machine state. A trial's normalised latency is
  p10(model) / p10(reference). A slower runner, a lower CPU clock or a steady neighbour moves both and
  cancels in the ratio; that is what lets a baseline taken on one runner be used on another.
- **A reference sized to the model.** A reference that fits in cache while the model does not is hit
  differently by a neighbour that thrashes the cache. The references therefore come from a fixed ladder
  (REFERENCE_LADDER: 2**k layers of 256x256 MatMul+Relu, i.e. 256 KiB of weights per layer), and the two
  rungs that bracket the model's size on disk are both timed. The choice depends on the model's bytes
  only, never on timings, so it is the same on every machine; two models within 2x of each other in
  size always share a rung, and the gate compares a baseline and a run only on the rungs they share
  (two shared rungs: their geometric mean per trial, a reference of about the model's size).
  Normalised figures on different rungs are never compared.
- **Fresh sessions per trial** (onnxruntime / TFLite on CPU): where a session's weights land in memory
  moves its speed by several % for its whole life, so one session per measurement would hide a
  systematic error from the interval; a fresh session each trial makes it trial-to-trial noise.
- **Trials give the noise.** Each trial yields one estimate; their spread is the measured noise.
  `normalized` and the per-trial lists let the gate use both sides' noise (see optkit.pipeline.gates: the
  Hodges-Lehmann shift with its Mann-Whitney confidence interval).

Figures (all `*_ms` raw wall time of the model):
- p50_ms ... max_ms: over all timed runs of all trials (as before); throughput_per_s: batch / the median
  trial's mean call time, calls stalled by the scheduler left out (latency.throughput, latency.unstalled_mean)
- trial_p50_ms, ci95_pct: each trial's median and the 95% half-width of their mean, in % of it
- trial_low_ms, low_ms: each trial's 10th percentile and their median (the contention-robust raw figure)
- normalized, trial_normalized, normalized_ci95_pct, reference, reference_p50_ms: on the primary rung
- references: {rung name: {bytes, normalized, trial_normalized, ci95_pct, low_ms}} for both rungs
"""
from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from optkit.core.artifact import Artifact
from optkit.core.isolate import run_isolated
from optkit.measure.latency import LIMIT_S, summarize, t95
from optkit.measure.model import latency_feeds, synthesized
from optkit.onnx.session import ort_session

# the same at 95%/3 (two-sided 98.33%): three comparisons at once, Bonferroni-corrected (measure.paired's race)
_T95_BY3 = [38.188, 7.649, 4.857, 3.961, 3.534, 3.287, 3.128, 3.016, 2.933, 2.870, 2.820, 2.779, 2.746, 2.718,
            2.694, 2.673, 2.655, 2.639, 2.625, 2.613, 2.601, 2.591, 2.582, 2.574, 2.566, 2.559, 2.552, 2.546,
            2.541, 2.536]

LOW_Q = 10                                     # the per-trial estimate: this percentile of the runs
REFERENCE_WIDTH = 256
REFERENCE_BATCH = 8
REFERENCE_LAYER_BYTES = REFERENCE_WIDTH * REFERENCE_WIDTH * 4
REFERENCE_LADDER = tuple(2 ** k for k in range(8))   # 1 .. 128 layers: 256 KiB .. 32 MiB of weights


def t95_by3(dof: int) -> float:
    """The t quantile of one of three comparisons that hold together at 95% (Bonferroni)."""
    return _T95_BY3[dof - 1] if dof <= len(_T95_BY3) else 2.394


def ratio_ci95(ratios: list[float], *, by3: bool = False) -> tuple[float, float, float]:
    """Ratios from paired trials: (median, lo, hi), a 95% t-interval on their logs (lo = hi for one);
    with by3 the interval of one of three comparisons made at once (each at 95%/3)."""
    logs = np.log(np.asarray(ratios, dtype=np.float64))
    centre = float(np.exp(np.median(logs)))
    if len(logs) < 2:
        return centre, centre, centre
    t = t95_by3 if by3 else t95
    half = t(len(logs) - 1) * float(logs.std(ddof=1)) / math.sqrt(len(logs))
    return centre, float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))


def ci95_pct(values: list[float]) -> float | None:
    """The 95% half-width of the mean of `values`, in % of the mean (None for fewer than 2)."""
    if len(values) < 2:
        return None
    a = np.asarray(values, dtype=np.float64)
    mean = float(a.mean())
    if mean <= 0:
        return None
    return float(100 * t95(len(a) - 1) * a.std(ddof=1) / math.sqrt(len(a)) / mean)


def reference_name(layers: int) -> str:
    return f"mlp{layers}x{REFERENCE_WIDTH}"


def reference_rungs(model_bytes: int) -> tuple[int, int]:
    """(primary, other): the two ladder rungs (layer counts) bracketing `model_bytes`, nearer one first.

    Depends on the size only, so every machine picks the same rungs for the same model."""
    x = max(model_bytes, 1) / REFERENCE_LAYER_BYTES
    lo = max([r for r in REFERENCE_LADDER if r <= x], default=REFERENCE_LADDER[0])
    hi = min([r for r in REFERENCE_LADDER if r > x], default=REFERENCE_LADDER[-1])
    if lo == hi:                                  # below the first rung or above the last one
        i = REFERENCE_LADDER.index(lo)
        hi = REFERENCE_LADDER[i + 1] if i + 1 < len(REFERENCE_LADDER) else REFERENCE_LADDER[i - 1]
    near_lo = abs(math.log(x / lo)) <= abs(math.log(hi / x))
    return (lo, hi) if near_lo else (hi, lo)


@functools.cache
def reference_model_bytes(layers: int = 8) -> bytes:
    """A fixed ONNX workload: `layers` x (MatMul 256x256 + Relu), batch 8, seeded weights."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1234)
    nodes, inits = [], []
    prev = "x"
    for i in range(layers):
        w = (rng.standard_normal((REFERENCE_WIDTH, REFERENCE_WIDTH)) / 16).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        out = "y" if i == layers - 1 else f"r{i}"
        nodes.append(helper.make_node("Relu", [f"m{i}"], [out]))
        prev = out
    shape = [REFERENCE_BATCH, REFERENCE_WIDTH]
    graph = helper.make_graph(nodes, "optkit_reference",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def _reference_runner(layers: int, threads: int | None):
    sess = ort_session(reference_model_bytes(layers), threads=threads)
    x = np.random.default_rng(0).standard_normal((REFERENCE_BATCH, REFERENCE_WIDTH)).astype(np.float32)
    feeds = {"x": x}
    return lambda: sess.run(None, feeds)


def low(times: list[float]) -> float:
    """The per-trial estimate: the LOW_Q-th percentile."""
    return float(np.percentile(times, LOW_Q))


def latency_trials(artifact: Artifact, settings, *, trials: int = 5, normalize: bool = True,
                   data=None, limit_s: float | None = None) -> dict[str, Any]:
    """Measure latency in `trials` trials of settings.runs runs each, in an isolated child process.

    All trials together stop after `limit_s` seconds (default latency.LIMIT_S) whatever settings.runs asks;
    then `time_limited` is set and `runs_per_trial` is the fewest runs a trial got."""
    return run_isolated(_trials, artifact, settings, trials, normalize, data, limit_s,
                        what=f"benchmarking {artifact.path}")


def _trials(artifact: Artifact, settings, trials: int, normalize: bool, data, limit_s: float | None
            ) -> dict[str, Any]:
    import gc

    # each trial's warm-up and its timed runs get half of the trial's share of the limit
    runner = _Runner(artifact, settings, data, (LIMIT_S if limit_s is None else limit_s) / (2 * trials))
    model_bytes = artifact.size_bytes()
    rungs = reference_rungs(model_bytes) if normalize else ()
    timed = _Timed(refs=len(rungs))
    runner.open(rungs)
    gc_was = gc.isenabled()
    gc.disable()                                  # no collector pauses inside the timed loop
    try:
        for trial in range(trials):
            if runner.fresh and trial:
                runner.open(rungs)
            timed.add(*runner.trial())
    finally:
        if gc_was:
            gc.enable()
    runner.session.close()
    out = summarize(timed.all_times, batch=settings.batch, warmup=settings.warmup, threads=runner.session.threads,
                    provider=runner.session.provider)
    if runner.limited:
        out["time_limited"] = True
    out.update(trials=trials, runs_per_trial=min(timed.counts), trial_p50_ms=timed.trial_p50,
               ci95_pct=ci95_pct(timed.trial_p50), trial_low_ms=timed.trial_low,
               low_ms=float(np.median(timed.trial_low)), low_quantile=LOW_Q, low_ci95_pct=ci95_pct(timed.trial_low))
    if rungs:
        out.update(_normalized(timed, rungs, model_bytes))
    return out


class _Runner:
    """The model's session (fresh each trial on CPU) and its feeds, the reference workloads, and one trial:
    model and references called in turn, call by call, within the trial's share of the time limit."""

    def __init__(self, artifact: Artifact, settings, data, trial_limit: float):
        import time

        self.artifact, self.settings, self.trial_limit = artifact, settings, trial_limit
        self.clock = time.perf_counter
        self.session = settings.open(artifact)
        self.feeds = self._feeds(data)
        self.session.check_feeds(self.feeds)
        # on CPU (onnxruntime, TFLite) every trial opens fresh sessions, which is cheap there: where the
        # weights land in memory moves one session's speed by several %, and fresh sessions turn that into
        # trial-to-trial noise that the median damps and the confidence interval sees
        self.fresh = self.session.provider == "cpu" and self.session.runtime in ("onnxruntime", "tflite")
        self.opened = False
        self.limited = False
        self.refs: list = []

    def _feeds(self, data) -> dict:
        if data is None:
            return synthesized(self.session, self.settings)[0]
        ds = data.load(self.artifact.path)
        return latency_feeds(self.session.inputs, ds.bind(self.session.inputs, stream=True), self.settings.batch,
                             ds.source)

    def open(self, rungs) -> None:
        """(Re)open the session and the references, and warm both up."""
        if self.opened:
            self.session.close()
            self.session = self.settings.open(self.artifact)
        self.opened = True
        self.run, self.timer = self.session.run, self.session.timer()
        self.refs = [_reference_runner(r, self.settings.threads) for r in rungs]
        start = self.clock()
        for _ in range(self.settings.warmup):
            self.session.run(self.feeds)
            if self.clock() - start >= self.trial_limit:
                break
        for ref in self.refs:
            for i in range(max(3, self.settings.warmup)):
                ref()
                if i >= 3 and self.clock() - start >= self.trial_limit:
                    break

    def time_model(self) -> float:
        if self.timer is not None:
            return self.timer(lambda: self.run(self.feeds))
        t0 = self.clock()
        self.run(self.feeds)
        return self.clock() - t0

    def trial(self) -> tuple[list[float], list[list[float]]]:
        """One trial: (the model's call times, each reference's call times)."""
        times, rt = [], [[] for _ in self.refs]
        start = self.clock()
        for _ in range(self.settings.runs):
            if len(times) >= 5 and self.clock() - start >= self.trial_limit:
                self.limited = True
                break
            # model and references alternate call by call, so all see the same machine state
            times.append(self.time_model())
            for j, ref in enumerate(self.refs):
                t0 = self.clock()
                ref()
                rt[j].append(self.clock() - t0)
        return times, rt


class _Timed:
    """What the trials measured, trial by trial."""

    def __init__(self, refs: int):
        self.all_times: list[list[float]] = []
        self.trial_p50: list[float] = []
        self.trial_low: list[float] = []
        self.counts: list[int] = []
        self.ref_low: list[list[float]] = [[] for _ in range(refs)]
        self.ratios: list[list[float]] = [[] for _ in range(refs)]
        self.ref_all: list[list[float]] = [[] for _ in range(refs)]

    def add(self, times: list[float], rt: list[list[float]]) -> None:
        self.trial_p50.append(float(np.median(times)) * 1e3)
        self.trial_low.append(low(times) * 1e3)
        for j, ref_times in enumerate(rt):
            self.ref_low[j].append(low(ref_times) * 1e3)
            self.ratios[j].append(low(times) / low(ref_times))
            self.ref_all[j] += ref_times
        self.all_times.append(times)
        self.counts.append(len(times))


def _normalized(timed: _Timed, rungs, model_bytes: int) -> dict[str, Any]:
    references = {
        reference_name(r): {"layers": r, "bytes": r * REFERENCE_LAYER_BYTES,
                            "normalized": float(np.median(timed.ratios[j])), "trial_normalized": timed.ratios[j],
                            "ci95_pct": ci95_pct(timed.ratios[j]), "low_ms": float(np.median(timed.ref_low[j]))}
        for j, r in enumerate(rungs)}
    primary = references[reference_name(rungs[0])]
    return dict(normalized=primary["normalized"], trial_normalized=primary["trial_normalized"],
                normalized_ci95_pct=primary["ci95_pct"], reference_p50_ms=float(np.median(timed.ref_all[0])) * 1e3,
                reference=f"onnxruntime MLP {rungs[0]}x{REFERENCE_WIDTH}, batch {REFERENCE_BATCH}",
                reference_name=reference_name(rungs[0]), references=references, model_bytes=model_bytes)
