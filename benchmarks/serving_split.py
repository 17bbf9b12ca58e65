"""EfficientNet-Lite1 served by tritonserver two ways, in one run on one machine: with its preprocessing in the
graph (uint8 NHWC requests; `optkit package` serves it as a pre (CPU) + core ensemble) against the float32 model
(float32 NCHW requests), each timed by `optkit bench --url` at the same concurrency, the two interleaved (A B A B)
so a shared machine's drift falls on both.

    .venv/bin/python benchmarks/serving_split.py                  # concurrency 4, 2 rounds of 200 calls each
    .venv/bin/python benchmarks/serving_split.py --concurrency 8 --rounds 3 --runs 300

Prints, per model: the request's bytes (the HTTP body with binary tensors, and the tensors alone), p50/p99 one
call at a time, and p50/p99 and throughput under --concurrency. Needs ../shared/realcases/efficientnet_lite1.onnx
and the Triton tool folder (tools/triton/.venv, see tests/_triton.py: its Python backend runs each model's ONNX
file with onnxruntime on the CPU; the ensemble's scheduling is the server's own). The uint8 graph is made here
(cast, (x - 127) / 128, NHWC -> NCHW, with the `optkit.preprocess` metadata, the model card's preprocessing of an
image already resized and cropped to 240x240) until `optkit preprocess` is on main. Not tuned: both served with
optkit package's defaults (1 CPU instance per model, batch 1).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
MODEL = ROOT.parent / "shared" / "realcases" / "efficientnet_lite1.onnx"


def optkit(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "optkit", *map(str, args)], capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        sys.exit(f"optkit {' '.join(map(str, args[:2]))} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return r


def bench(url: str, name: str, args) -> dict:
    r = optkit("bench", "--url", f"{url}/v2/models/{name}", "--concurrency", str(args.concurrency),
               "--warmup", "20", "--runs", str(args.runs), "--json")
    return json.loads(r.stdout)["stages"][0]["measurements"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import _triton
    from test_package_ensemble import with_uint8_preprocessing

    if not MODEL.exists():
        sys.exit(f"no {MODEL} here")
    if _triton.missing():
        sys.exit(_triton.missing())
    with tempfile.TemporaryDirectory(prefix="serving-split-") as t:
        tmp = Path(t)
        u8 = with_uint8_preprocessing(MODEL, tmp / "efficientnet_lite1_u8.onnx", "inputs")
        repo = tmp / "repo"
        ens = optkit("package", u8, "--to", "triton", "-o", repo, "--name", "effnet_u8", "--json")
        optkit("package", MODEL, "--to", "triton", "-o", repo, "--name", "effnet_f32")
        parts = [m for m in json.loads(ens.stdout)["notes"] if m.startswith("an ensemble")]
        print(f"packaged: effnet_u8 ({parts[0] if parts else 'one model'}); effnet_f32 (one model)")
        proof = _triton.proof_repository(repo, tmp / "proof")
        rows: dict[str, list[dict]] = {"effnet_u8": [], "effnet_f32": []}
        with _triton.tritonserver(proof, tmp, start_timeout=120) as (url, _):
            if not url:
                sys.exit(f"tritonserver refused the repository: {_triton.log_tail(tmp)}")
            for _ in range(args.rounds):
                for name in rows:
                    rows[name].append(bench(url, name, args))
    print(f"\nEfficientNet-Lite1 on tritonserver (Python backend, onnxruntime CPU), bench --url, concurrency "
          f"{args.concurrency}, {args.runs} calls, best of {args.rounds} interleaved rounds")
    head = (f"{'model':<34}{'request body B':>15}{'tensor B':>10}{'p50 ms':>9}{'p99 ms':>9}"
            f"{'p50@c ms':>10}{'p99@c ms':>10}{'req/s@c':>9}")
    print(head)
    for name, label in (("effnet_u8", "uint8 NHWC, pre+core ensemble"), ("effnet_f32", "float32 NCHW, one model")):
        ms = rows[name]
        req = ms[0]["request"]
        best = min(ms, key=lambda m: m["latency"]["p50_ms"])
        load = max(ms, key=lambda m: m["concurrency"]["throughput_per_s"])
        print(f"{label:<34}{req['body_bytes']:>15,}{req['tensor_bytes']:>10,}{best['latency']['p50_ms']:>9.2f}"
              f"{best['latency']['p99_ms']:>9.2f}{load['concurrency']['p50_ms']:>10.2f}"
              f"{load['concurrency']['p99_ms']:>10.2f}{load['concurrency']['throughput_per_s']:>9.1f}")
    print(json.dumps({n: [{"request": m["request"], "latency": {k: m["latency"].get(k) for k in
                                                                  ("p50_ms", "p99_ms", "throughput_per_s")},
                           "concurrency": {k: m["concurrency"].get(k) for k in
                                           ("p50_ms", "p99_ms", "throughput_per_s")}} for m in ms]
                      for n, ms in rows.items()}))


if __name__ == "__main__":
    main()
