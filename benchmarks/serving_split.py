"""EfficientNet-Lite1 served by tritonserver two ways, in one run on one machine: with its preprocessing (and top-5)
in the graph, written by `optkit preprocess` and packaged as a pre (CPU) + core ensemble (uint8 NHWC image
requests), against the float32 model packaged as one model (float32 NCHW requests the client prepared), both with
the setting `optkit tune` picks for the core, timed by `optkit bench --url` at that setting's concurrency, the
cases interleaved (A B C A B C) so a shared machine's drift falls on all of them.

    .venv/bin/python benchmarks/serving_split.py                       # tune 12 trials, 2 rounds of 200 calls
    .venv/bin/python benchmarks/serving_split.py --trials 0            # no tune: package defaults, --concurrency
    .venv/bin/python benchmarks/serving_split.py --gpu                 # where a GPU and the onnxruntime backend are

The chain, every step an optkit command (printed as it runs):
  optkit preprocess MODEL -o lite1_u8.onnx --preprocess SPEC --top-k 5
  optkit split lite1_u8.onnx -o split --cut preprocess          # what `optkit package lite1_u8.onnx` cuts at
  optkit tune split/core.onnx -o core.best.json --space batch=1 --trials N
  optkit tune MODEL -o f32.best.json --space <the core's best setting> --trials 1    # the same setting, its sha256
  optkit package split --to triton --tuned core.best.json --name effnet_u8
  optkit package MODEL --to triton --tuned f32.best.json --name effnet_f32
  optkit bench --url .../effnet_u8 --shape image=1x240x240x3 --concurrency C     # the model's size
  optkit bench --url .../effnet_u8 --shape image=1x375x500x3 --concurrency C     # a typical photo (imagenet median)
  optkit bench --url .../effnet_f32 --concurrency C                              # float32 [1,3,240,240]

Needs ../shared/realcases/efficientnet_lite1.onnx and the Triton tool folder (tools/triton/.venv, see
tests/_triton.py: without a GPU its Python backend runs each model's ONNX file with onnxruntime on the CPU; the
ensemble's scheduling is the server's own). batch stays 1: the ensemble takes images of any size, and Triton
batches only requests of one shape.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
MODEL = ROOT.parent / "shared" / "realcases" / "efficientnet_lite1.onnx"
SPEC = "{resize: 272, resample: bicubic, center_crop: 240, mean: 127, std: 128, scale: 1}"
PHOTO = (375, 500)      # imagenet100's median decoded photo (height, width)
CASES = {               # name: (served model, --shape of the request, what the client sends)
    "u8_model_size": ("effnet_u8", "image=1x240x240x3", "uint8 240x240x3 (the model's size), pre+core ensemble"),
    "u8_photo": ("effnet_u8", f"image=1x{PHOTO[0]}x{PHOTO[1]}x3",
                 f"uint8 {PHOTO[0]}x{PHOTO[1]}x3 (a typical photo), pre+core ensemble"),
    "f32": ("effnet_f32", None, "float32 1x3x240x240 (client-prepared), one model"),
}


def optkit(*args: str) -> subprocess.CompletedProcess:
    shown = " ".join(str(a) if " " not in str(a) else repr(str(a)) for a in args)
    print(f"$ optkit {shown}", file=sys.stderr, flush=True)
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "optkit", *map(str, args)], capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        sys.exit(f"optkit {' '.join(map(str, args[:2]))} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    print(f"  ({time.monotonic() - t:.0f} s)", file=sys.stderr, flush=True)
    return r


def bench(url: str, case: str, concurrency: int, args) -> dict:
    name, shape, _ = CASES[case]
    r = optkit("bench", "--url", f"{url}/v2/models/{name}", *(("--shape", shape) if shape else ()),
               "--concurrency", str(concurrency), "--warmup", "20", "--runs", str(args.runs), "--json")
    return json.loads(r.stdout)["stages"][0]["measurements"]


def tune(tmp: Path, args) -> tuple[list[str], list[str], dict | None]:
    """--tuned flags for the ensemble and the float32 model (the core's best setting for both), and that setting."""
    if args.trials == 0:
        return [], [], None
    core = tmp / "split" / "core.onnx"
    optkit("tune", core, "-o", tmp / "core.best.json", "--objective", "throughput", "--space", "batch=1",
           "--trials", str(args.trials), "--trial-seconds", "1", "--confirm", "1", "--seed", "0")
    best = json.loads((tmp / "core.best.json").read_text())
    setting = best["best"]["setting"] if "best" in best else best["setting"]
    fixed = _space(setting)
    optkit("tune", MODEL, "-o", tmp / "f32.best.json", "--objective", "throughput", *fixed, "--trials", "1",
           "--trial-seconds", "1", "--confirm", "0", "--seed", "0")
    return ["--tuned", tmp / "core.best.json"], ["--tuned", tmp / "f32.best.json"], setting


def _space(setting: dict) -> list[str]:
    """--space flags that leave tune one choice: the setting given."""
    flat = {**{k: v for k, v in setting.items() if k != "session"}, **setting.get("session", {})}
    keys = ("provider", "threads", "batch", "concurrency", "sessions", "execution_mode", "inter_op_threads",
            "graph_optimization", "cpu_mem_arena", "mem_pattern")
    out = []
    for k in keys:
        v = flat.get(k)
        if v is None:
            continue
        out += ["--space", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=12, help="optkit tune trials on the core (0: no tune)")
    ap.add_argument("--concurrency", type=int, default=None, help="requests in flight (default: the tuned one; "
                                                                     "4 without a tune)")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gpu", action="store_true", help="package the cores with --gpu (KIND_GPU)")
    args = ap.parse_args()
    import _triton

    if not MODEL.exists():
        sys.exit(f"no {MODEL} here")
    if _triton.missing():
        sys.exit(_triton.missing())
    with tempfile.TemporaryDirectory(prefix="serving-split-") as t:
        tmp = Path(t)
        u8 = tmp / "efficientnet_lite1_u8.onnx"
        pre = json.loads(optkit("preprocess", MODEL, "-o", u8, "--preprocess", SPEC, "--top-k", "5",
                                "--json").stdout)
        fig = pre["stages"][1]["measurements"]["preprocess"]["preprocess"]
        split = json.loads(optkit("split", u8, "-o", tmp / "split", "--cut", "preprocess", "--json").stdout)
        tuned_u8, tuned_f32, setting = tune(tmp, args)
        gpu = ["--gpu"] if args.gpu else []
        repo = tmp / "repo"
        ens = optkit("package", tmp / "split", "--to", "triton", "-o", repo, "--name", "effnet_u8",
                     "--shape", "image=1x240x240x3", *tuned_u8, *gpu, "--json")
        optkit("package", MODEL, "--to", "triton", "-o", repo, "--name", "effnet_f32", *tuned_f32, *gpu)
        concurrency = args.concurrency or (int(setting["concurrency"]) if setting else 4)
        parts = [m for m in json.loads(ens.stdout)["notes"] if m.startswith("an ensemble")]
        print(f"packaged: effnet_u8 ({parts[0] if parts else 'one model'}); effnet_f32 (one model)")
        print(f"preprocess check: max scaled difference {fig['max_scaled_error']:.4g} on {fig['images']} images; "
              f"split: pre {split['parts'][0]['ops']}, cut {split['cuts'][0]['bytes_per_sample']:,} B/sample")
        if setting:
            print(f"tuned setting of the core (both served with it): {json.dumps(setting)}")
        proof = _triton.proof_repository(repo, tmp / "proof")
        rows: dict[str, list[dict]] = {c: [] for c in CASES}
        with _triton.tritonserver(proof, tmp, start_timeout=180) as (url, _):
            if not url:
                sys.exit(f"tritonserver refused the repository: {_triton.log_tail(tmp)}")
            for _ in range(args.rounds):
                for case in rows:
                    rows[case].append(bench(url, case, concurrency, args))
    print(f"\nEfficientNet-Lite1 on tritonserver ({'--gpu' if args.gpu else 'Python backend, onnxruntime CPU'}), "
          f"bench --url, concurrency {concurrency}, {args.runs} calls, {args.rounds} interleaved rounds (each shown)")
    print("| request | body B | tensor B | p50 / p99 one call, ms | p50 / p99 at concurrency, ms | req/s at "
          "concurrency |\n|---|---:|---:|---|---|---|")
    for case, ms in rows.items():
        req = ms[0]["request"]
        one = "; ".join(f"{m['latency']['p50_ms']:.1f} / {m['latency']['p99_ms']:.1f}" for m in ms)
        load = "; ".join(f"{m['concurrency']['p50_ms']:.1f} / {m['concurrency']['p99_ms']:.1f}" for m in ms)
        tput = "; ".join(f"{m['concurrency']['throughput_per_s']:.1f}" for m in ms)
        print(f"| {CASES[case][2]} | {req['body_bytes']:,} | {req['tensor_bytes']:,} | {one} | {load} | {tput} |")
    print(json.dumps({"concurrency": concurrency, "setting": setting, "preprocess": fig,
                      "cases": {c: [{"request": m["request"],
                                     "latency": {k: m["latency"].get(k) for k in ("p50_ms", "p99_ms")},
                                     "concurrency": {k: m["concurrency"].get(k) for k in
                                                     ("p50_ms", "p99_ms", "throughput_per_s")}} for m in ms]
                                for c, ms in rows.items()}}))


if __name__ == "__main__":
    main()
