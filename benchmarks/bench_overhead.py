"""`optkit bench` adds no overhead: a bare onnxruntime loop and `optkit bench` side by side, p50s within 3%.

Both time the same model, batch and thread count; they alternate over several rounds so machine noise hits both.
Run: python benchmarks/bench_overhead.py [MODEL.onnx] [--rounds 5] [--runs 2000]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def bare_p50(model: str, runs: int, warmup: int, threads: int) -> float:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
    feeds = {inp.name: np.random.default_rng(0).random(shape, dtype=np.float32)}
    names = [o.name for o in sess.get_outputs()]
    for _ in range(warmup):
        sess.run(names, feeds)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(names, feeds)
        times.append(time.perf_counter() - t0)
    return float(np.percentile(np.array(times) * 1e3, 50))


def optkit_p50(model: str, runs: int, warmup: int, threads: int) -> float:
    out = subprocess.run([sys.executable, "-m", "optkit", "bench", model, "--runs", str(runs), "--warmup",
                          str(warmup), "--threads", str(threads), "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["stages"][0]["measurements"]["latency"]["p50_ms"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default=str(ROOT / "sample_models" / "torch_cnn.onnx"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    a = parser.parse_args()
    bare, ours = [], []
    for i in range(a.rounds):
        bare.append(bare_p50(a.model, a.runs, a.warmup, a.threads))
        ours.append(optkit_p50(a.model, a.runs, a.warmup, a.threads))
        print(f"round {i + 1}: bare onnxruntime p50 {bare[-1]:.4f} ms   optkit bench p50 {ours[-1]:.4f} ms")
    b, o = statistics.median(bare), statistics.median(ours)
    diff = (o - b) / b
    print(f"median p50: bare {b:.4f} ms, optkit {o:.4f} ms, ratio {o / b:.3f} ({diff:+.1%}); "
          f"target within 3%: {'met' if abs(diff) <= 0.03 else 'MISSED'}")


if __name__ == "__main__":
    main()
