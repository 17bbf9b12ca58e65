"""Noise-aware latency: repeated trials, a 95% confidence interval, and machine-normalised latency.

Each trial times the model `runs` times; with `normalize`, each trial first times a fixed reference
workload (a small ONNX MLP on onnxruntime with the same threads), so slow-downs of the machine itself
(a busy CI runner, another process) move both and cancel in their ratio. The figures:

- p50_ms ... max_ms: over all timed runs of all trials
- trial_p50_ms: each trial's median; ci95_pct: the 95% half-width of their mean, in % of it
- reference_p50_ms; normalized: the median over trials of each trial's median ratio of a model call to
  the reference call right after it; normalized_ci95_pct
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from optkit.core.artifact import Artifact
from optkit.core.isolate import run_isolated

# two-sided 95% Student t quantiles for 1..30 degrees of freedom
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042]

REFERENCE_WIDTH = 256
REFERENCE_LAYERS = 6


def t95(dof: int) -> float:
    return _T95[dof - 1] if dof <= len(_T95) else 1.96


def ci95_pct(values: list[float]) -> float | None:
    """The 95% half-width of the mean of `values`, in % of the mean (None for fewer than 2)."""
    if len(values) < 2:
        return None
    a = np.asarray(values, dtype=np.float64)
    mean = float(a.mean())
    if mean <= 0:
        return None
    return float(100 * t95(len(a) - 1) * a.std(ddof=1) / math.sqrt(len(a)) / mean)


def reference_model_bytes() -> bytes:
    """A fixed ONNX workload: REFERENCE_LAYERS x (MatMul 256x256 + Relu), batch 8, seeded weights."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1234)
    nodes, inits = [], []
    prev = "x"
    for i in range(REFERENCE_LAYERS):
        w = (rng.standard_normal((REFERENCE_WIDTH, REFERENCE_WIDTH)) / 16).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        out = "y" if i == REFERENCE_LAYERS - 1 else f"r{i}"
        nodes.append(helper.make_node("Relu", [f"m{i}"], [out]))
        prev = out
    graph = helper.make_graph(nodes, "optkit_reference",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, REFERENCE_WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, REFERENCE_WIDTH])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def _reference_runner(threads: int | None):
    import onnxruntime as ort

    from optkit.runtimes.onnx import session_options

    sess = ort.InferenceSession(reference_model_bytes(), sess_options=session_options(threads),
                                providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((8, REFERENCE_WIDTH)).astype(np.float32)
    return lambda: sess.run(None, {"x": x})


def latency_trials(artifact: Artifact, settings, *, trials: int = 5, normalize: bool = True,
                   data=None) -> dict[str, Any]:
    """Measure latency in `trials` trials of settings.runs runs each, in an isolated child process."""
    return run_isolated(_trials, artifact, settings, trials, normalize, data,
                        what=f"benchmarking {artifact.path}")


def _trials(artifact: Artifact, settings, trials: int, normalize: bool, data) -> dict[str, Any]:
    import time

    from optkit.measure.datasets import load_dataset
    from optkit.measure.inputs import synthesize
    from optkit.measure.latency import summarize
    from optkit.runtimes.base import open_session

    session = open_session(artifact, provider=settings.provider, threads=settings.threads)
    feeds = synthesize(session.inputs, settings.shapes, batch=settings.batch, seed=settings.seed)
    if data is not None:
        ds = load_dataset(data.path, data.preprocess, data.labels)
        feeds = {k: v[:settings.batch] for k, v in ds.bind(session.inputs).items()}
    session.check_feeds(feeds)
    run = session.run
    timer = session.timer()
    ref = _reference_runner(settings.threads) if normalize else None

    def time_one(fn) -> float:
        if timer is not None and fn is not ref:
            return timer(fn)
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    model_call = lambda: run(feeds)  # noqa: E731
    for _ in range(settings.warmup):
        model_call()
    if ref is not None:
        for _ in range(max(3, settings.warmup)):
            ref()
    all_times: list[float] = []
    trial_p50, ref_p50, ratios = [], [], []
    for _ in range(trials):
        times, rt, pair = [], [], []
        for _ in range(settings.runs):
            # model and reference alternate call by call, so both see the same machine load;
            # the median of the per-pair ratios ignores the pairs a preemption hit
            t = time_one(model_call)
            times.append(t)
            if ref is not None:
                r = time_one(ref)
                rt.append(r)
                pair.append(t / r)
        trial_p50.append(float(np.median(times)) * 1e3)
        if ref is not None:
            ref_p50.append(float(np.median(rt)) * 1e3)
            ratios.append(float(np.median(pair)))
        all_times += times
    session.close()
    out = summarize(all_times, batch=settings.batch, warmup=settings.warmup, threads=session.threads,
                    provider=session.provider)
    out.update(trials=trials, runs_per_trial=settings.runs, trial_p50_ms=trial_p50, ci95_pct=ci95_pct(trial_p50))
    if ratios:
        out.update(reference_p50_ms=float(np.median(ref_p50)), normalized=float(np.median(ratios)),
                   trial_normalized=ratios, normalized_ci95_pct=ci95_pct(ratios),
                   reference=f"onnxruntime MLP {REFERENCE_LAYERS}x{REFERENCE_WIDTH}, batch 8")
    return out
