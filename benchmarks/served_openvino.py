"""Served OpenVINO against the prediction its package records (issue 42: "bench --url on it within 0.9x of the
prediction").

For each model: `optkit tune` on OpenVINO (the space given below) writes best.json, whose figures are the
prediction; `optkit package --to triton --tuned best.json` carries it into the lineage (tuned.figures); a real
tritonserver 2.51 serves the package on 127.0.0.1 through tests/_triton.py's stand-in (the Python backend running
OpenVINO on the packaged IR with the config's parameters: pip has no Triton OpenVINO backend); `optkit bench --url`
times it with the tuned concurrency and batch. Printed: the predicted and the served p50 and throughput (the last
round's), served/predicted throughput (>= 0.9 is "within 0.9x"), and, since the prediction was measured minutes
earlier under other load, served/in-process throughput in interleaved rounds (`optkit bench MODEL --runtime
openvino` with the tuned threads, then `bench --url`, each round). The served figure carries HTTP, the Python backend's
shared-memory round trip and the server's own threads on the same cores, so a microsecond model (the sample CNN)
is far from its prediction and a millisecond one (EfficientNet-Lite1) near it.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/served_openvino.py [--only cnn|effnet] [--runs 200]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
REAL = ROOT.parent / "shared" / "realcases"
MODELS = {"cnn": (ROOT / "sample_models" / "torch_cnn.onnx", ["threads=1", "batch=1,8", "concurrency=1"]),
          "effnet": (REAL / "efficientnet_lite1.onnx", ["threads=1", "batch=1", "concurrency=1"])}


def optkit(*args) -> dict:
    p = subprocess.run([sys.executable, "-m", "optkit", *map(str, args), "--json"], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=1800)
    if p.returncode:
        sys.exit(f"optkit {' '.join(map(str, args))}: {p.stderr.strip().splitlines()[-1:]}")
    return json.loads(p.stdout)


def one(key: str, runs: int, tmp: Path, rounds_n: int) -> dict:
    import _triton

    model, space = MODELS[key]
    best = tmp / f"{key}.json"
    optkit("tune", model, "--objective", "throughput", "--trials", "6", "--trial-seconds", "1", "-o", best,
           *(a for s in ["runtime=openvino", *space] for a in ("--space", s)))
    optkit("package", model, "--to", "triton", "-o", tmp / "package", "--name", key, "--tuned", best)
    lineage = json.loads((tmp / "package" / key / "1" / "optkit-package.json").read_text())
    setting, predicted = lineage["tuned"]["setting"], lineage["tuned"]["figures"]
    repo = _triton.proof_repository(tmp / "package", tmp / f"repo_{key}")
    (tmp / key).mkdir()
    with _triton.tritonserver(repo, tmp / key, start_timeout=120) as (url, _):
        if not url:
            sys.exit(f"tritonserver refused {key}: {_triton.log_tail(tmp / key)}")
        load = ("--concurrency", setting["concurrency"], "--batch", setting["batch"], "--warmup", "20", "--runs", runs)
        rounds = []
        for _ in range(rounds_n):  # in-process and served, interleaved: other jobs' load moves both alike
            local = _figures(optkit("bench", model, "--runtime", "openvino", "--threads", setting["threads"], *load))
            served = _figures(optkit("bench", "--url", f"{url}/v2/models/{key}", *load))
            rounds.append((local, served))
    ratios = sorted(s["throughput_per_s"] / lo["throughput_per_s"] for lo, s in rounds)
    served = rounds[-1][1]
    return {"model": key, "setting": {k: setting[k] for k in ("runtime", "threads", "batch", "concurrency")},
            "predicted": {k: predicted.get(k) for k in ("p50_ms", "throughput_per_s")},
            "served": {k: served.get(k) for k in ("p50_ms", "throughput_per_s")},
            "served_over_predicted_throughput": served["throughput_per_s"] / predicted["throughput_per_s"],
            "served_over_in_process": ratios}


def _figures(report: dict) -> dict:
    m = report["stages"][0]["measurements"]
    return m["concurrency"] if "concurrency" in m else m["latency"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(MODELS))
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import _triton

    if _triton.missing_openvino():
        sys.exit(_triton.missing_openvino())
    print(f"cpu: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"{'model':8} {'tuned setting':34} {'p50 ms pred / served':>22} {'samples/s pred / served':>25} "
          f"{'served/pred':>11}  served/in-process, interleaved rounds")
    with tempfile.TemporaryDirectory() as tmp:
        for key in [args.only] if args.only else list(MODELS):
            if not MODELS[key][0].exists():
                print(f"{key}: {MODELS[key][0]} is not here")
                continue
            r = one(key, args.runs, Path(tmp), args.rounds)
            p, s = r["predicted"], r["served"]
            t = r["setting"]
            setting = f"{t['runtime']}, {t['threads']} thr, batch {t['batch']}, {t['concurrency']} in flight"
            print(f"{key:8} {setting:34} {p['p50_ms']:10.3f} / {s['p50_ms']:<9.3f} "
                  f"{p['throughput_per_s']:11.1f} / {s['throughput_per_s']:<11.1f} "
                  f"{r['served_over_predicted_throughput']:10.2f}x  "
                  + " ".join(f"{x:.2f}x" for x in r["served_over_in_process"]))


if __name__ == "__main__":
    main()
