"""Stability of the noise-aware latency gate on this (noisy, shared) machine.

A baseline is measured once on model A; then the same gate (`latency_regression_pct <= 10` by default) is
checked REPEATS times on an unchanged model A (a "fail" or a "cannot judge" verdict is a false alarm) and REPEATS times on model B, which is A with 20% more layers (a real ~20% slowdown that must be
caught every time: "fail" or "cannot judge", never "pass"). Each measurement
is what `optkit run` does: `trials` trials of `runs` timed runs, one thread, with the size-matched
reference workloads timed call by call in the same trials (machine-normalised latency; see
optkit/measure/trials.py and the rule in optkit/pipeline/gates.py).

    .venv/bin/python benchmarks/gate_stability.py [--repeats 10] [--gate "latency_regression_pct <= 10"]
"""
from __future__ import annotations

import argparse
import os
import re
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
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--raw", action="store_true", help="gate on raw latency, not machine-normalised latency")
    ap.add_argument("--save", type=Path, help="folder to write every measured report to (base.json, A1.json, ...)")
    args = ap.parse_args()

    import onnxruntime  # noqa: F401  (imported once here, so each forked measurement starts fast)

    from optkit.core.artifact import Artifact
    from optkit.measure.model import MeasureSettings
    from optkit.measure.trials import latency_trials
    from optkit.pipeline.gates import evaluate, parse_gates
    from optkit.report.schema import ArtifactRef, Report, Stage

    tmp = Path(tempfile.mkdtemp(prefix="optkit-gate-bench-"))
    a = Artifact.load(mlp(tmp / "a.onnx", args.layers))
    b = Artifact.load(mlp(tmp / "b.onnx", round(args.layers * 1.2)))
    settings = MeasureSettings(threads=1, warmup=5, runs=args.runs)
    gate = parse_gates([args.gate])

    secs: list[float] = []

    def measure(art) -> Report:
        t = time.perf_counter()
        lat = latency_trials(art, settings, trials=args.trials, normalize=True)
        secs.append(time.perf_counter() - t)
        if args.raw:
            for k in ("normalized", "references", "reference", "reference_name"):
                lat.pop(k, None)
        return Report(command="bench", stages=[Stage(name="model", output=ArtifactRef(
            path=art.path, format="onnx", sha256=art.sha256), measurements={"latency": lat})])

    t0 = time.perf_counter()
    base = measure(a)
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
        base.save(args.save / "base.json")
    bl = base.stages[0].measurements["latency"]
    print(f"gate: {args.gate}   ({'raw p50' if args.raw else 'machine-normalised'}; "
          f"{args.trials} trials x {args.runs} runs; model A {args.layers} layers, "
          f"B {round(args.layers * 1.2)} layers)")
    print(f"baseline A: p50 {bl['p50_ms']:.3f} ms ±{bl['ci95_pct']:.1f}%, p10 {bl['low_ms']:.3f} ms "
          f"±{bl['low_ci95_pct']:.1f}%, normalised {bl['normalized']:.3f} ±{bl['normalized_ci95_pct']:.1f}% "
          f"(reference {bl['reference_name']}; rungs {', '.join(bl['references'])})")
    print(f"{'run':>3} {'model':>5} {'p50 ms':>8} {'raw Δ%':>7} {'gated Δ%':>9} {'noise ±%':>9}  {'verdict':<12} detail")
    gated: dict[str, list[float]] = {"A": [], "B": []}
    noises: list[float] = []
    counts = {"A": 0, "B": 0}
    judged: dict[str, dict[str, int]] = {"A": {}, "B": {}}
    order = [("A", a), ("B", b)] * args.repeats  # interleaved, so load changes hit both alike
    for i, (label, art) in enumerate(order):
        rep = measure(art)
        if args.save:
            rep.save(args.save / f"{label}{i // 2 + 1}.json")
        (res,) = evaluate(rep, gate, base)
        p50 = rep.stages[0].measurements["latency"]["p50_ms"]
        ci = re.search(r"95% CI ([-+][\d.]+)% \.\. ([-+][\d.]+)%", res.detail)
        noise = (float(ci[2]) - float(ci[1])) / 2 if ci else 0.0
        word = res.verdict
        counts[label] += word != "pass"
        judged[label][word] = judged[label].get(word, 0) + 1
        gated[label].append(res.value)
        noises.append(noise)
        print(f"{i // 2 + 1:>3} {label:>5} {p50:8.3f} {100 * (p50 / bl['p50_ms'] - 1):+7.1f} {res.value:+9.1f} "
              f"{noise:9.1f}  {word.upper() if word == 'fail' else word:<12} {ci[0] if ci else ''}")
    n = args.repeats

    def words(label: str) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(judged[label].items()))

    print(f"\nunchanged model A: {counts['A']}/{n} false alarms ({words('A')});  model B (+20% layers): "
          f"{counts['B']}/{n} caught ({words('B')})   ({time.perf_counter() - t0:.0f} s)")
    print(f"gated change A {min(gated['A']):+.1f} .. {max(gated['A']):+.1f}%, B {min(gated['B']):+.1f} .. "
          f"{max(gated['B']):+.1f}%; noise ±{min(noises):.1f} .. ±{max(noises):.1f}%; "
          f"{np.mean(secs):.1f} s per measurement (max {max(secs):.1f} s); load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
