"""Stability of the noise-aware latency gate on this (noisy, shared) machine.

A baseline is measured once on model A; then the same gate (`latency_regression_pct <= 10` by default) is
checked REPEATS times on an unchanged model A (any failure is a false alarm) and REPEATS times on model B,
which is A with 20% more layers (a real ~20% slowdown that must be caught every time). Each measurement
is what `optkit run` does: `trials` trials of `runs` timed runs, with the fixed reference workload timed
in the same trials (machine-normalised latency).

    .venv/bin/python benchmarks/gate_stability.py [--repeats 10] [--gate "latency_regression_pct <= 10"]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def mlp(path: Path, layers: int, width: int = 384, batch: int = 4) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "input"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        prev = "logits" if i == layers - 1 else f"r{i}"
        nodes.append(helper.make_node("Relu", [f"m{i}"], [prev]))
    graph = helper.make_graph(nodes, f"mlp{layers}",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, width])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--gate", default="latency_regression_pct <= 10")
    ap.add_argument("--layers", type=int, default=10, help="layers of model A (B has 20%% more)")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--raw", action="store_true", help="gate on raw p50, not machine-normalised latency")
    args = ap.parse_args()

    from optkit.core.artifact import Artifact
    from optkit.gates import evaluate, parse_gates
    from optkit.measure.model import MeasureSettings
    from optkit.measure.trials import latency_trials
    from optkit.report.schema import ArtifactRef, Report, Stage

    import onnxruntime  # noqa: F401  (imported once here, so each forked measurement starts fast)

    tmp = Path(tempfile.mkdtemp(prefix="optkit-gate-bench-"))
    a = Artifact.load(mlp(tmp / "a.onnx", args.layers))
    b = Artifact.load(mlp(tmp / "b.onnx", round(args.layers * 1.2)))
    settings = MeasureSettings(threads=1, warmup=5, runs=args.runs)
    gate = parse_gates([args.gate])

    def measure(art) -> Report:
        lat = latency_trials(art, settings, trials=args.trials, normalize=True)
        if args.raw:
            lat.pop("normalized", None)
        return Report(command="bench", stages=[Stage(name="model", output=ArtifactRef(
            path=art.path, format="onnx", sha256=art.sha256), measurements={"latency": lat})])

    t0 = time.perf_counter()
    base = measure(a)
    bl = base.stages[0].measurements["latency"]
    print(f"gate: {args.gate}   ({'raw p50' if args.raw else 'machine-normalised'}; "
          f"{args.trials} trials x {args.runs} runs; model A {args.layers} layers, "
          f"B {round(args.layers * 1.2)} layers)")
    print(f"baseline A: p50 {bl['p50_ms']:.3f} ms ±{bl['ci95_pct']:.1f}%, normalised {bl['normalized']:.3f} "
          f"±{bl['normalized_ci95_pct']:.1f}%")
    print(f"{'run':>3} {'model':>5} {'p50 ms':>8} {'raw Δ%':>7} {'gated Δ%':>9} {'noise ±%':>9}  verdict")
    counts = {"A": 0, "B": 0}
    order = [("A", a), ("B", b)] * args.repeats  # interleaved, so load changes hit both alike
    for i, (label, art) in enumerate(order):
        rep = measure(art)
        (res,) = evaluate(rep, gate, base)
        p50 = rep.stages[0].measurements["latency"]["p50_ms"]
        noise = float(res.detail.split('±')[-1]) if '±' in res.detail else 0.0
        failed = not res.passed
        counts[label] += failed
        verdict = "FAIL" if failed else "pass"
        print(f"{i // 2 + 1:>3} {label:>5} {p50:8.3f} {100 * (p50 / bl['p50_ms'] - 1):+7.1f} {res.value:+9.1f} "
              f"{noise:9.1f}  {verdict}")
    n = args.repeats
    print(f"\nunchanged model A: {counts['A']}/{n} false failures;  model B (+20% layers): {counts['B']}/{n} caught"
          f"   ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
