"""Capacity from figures measured here: a real model packaged by optkit, served by a real tritonserver, timed with
`optkit bench --url` at a few concurrencies; then `optkit capacity` on a real public request trace (NASA-HTTP, July
1995, benchmarks/traces/) and on a synthetic trace with a surge, and `optkit package --manifests --capacity`.

Prints, per trace, SLO minutes, replica-hours and peak replicas for fixed-peak, reactive and forecast-assisted
scaling (CAPACITY.json's replay), and the per-replica figures with their noise.

The server is tests/_triton.py's: tritonserver 2.51 from nvidia-pytriton in tools/triton/.venv, the package's
onnxruntime model run by Triton's Python backend (Triton's onnxruntime backend is not on pip), on this machine's
CPU. The server's CPU and memory are read from its process group (psutil) while bench --url loads it: they are the
container's figures a replica needs, which `optkit capacity` takes as --cpu and --memory-mb.

The NASA trace peaks at 6.75 requests/s; its rates are scaled (shape kept) so that its peak needs --peak-replicas
replicas of the measured throughput: a trace of its own size would need one replica all month.

Run: python benchmarks/capacity.py [--model sample_models/torch_cnn.onnx] [--concurrency 1,2,4] [--duration 8]
     [--slo-p99 50] [--peak-replicas 8] [--out /tmp/optkit-capacity]
`optkit capacity` is issue 33's command (branch i33-capacity until it is merged): without it the script stops after
the per-replica figures and says so.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
NASA = ROOT / "benchmarks" / "traces" / "nasa_http_1995_07.csv"


def optkit(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "optkit", *map(str, args)], capture_output=True, text=True, env=env)
    if check and r.returncode != 0:
        raise SystemExit(f"optkit {' '.join(map(str, args))} exited {r.returncode}: {r.stderr.strip()[-400:]}")
    return r


class GroupSampler:
    """CPU seconds and peak RSS of a process and its children (the server and its Python backend stubs)."""

    def __init__(self, pid: int):
        import psutil

        self.root = psutil.Process(pid)
        self.peak_rss = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def procs(self):
        out = [self.root]
        try:
            out += self.root.children(recursive=True)
        except Exception:  # noqa: BLE001 - a child gone between the calls
            pass
        return out

    def cpu_s(self) -> float:
        total = 0.0
        for p in self.procs():
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except Exception:  # noqa: BLE001
                pass
        return total

    def rss(self) -> int:
        total = 0
        for p in self.procs():
            try:
                total += p.memory_info().rss
            except Exception:  # noqa: BLE001
                pass
        return total

    def _run(self):
        while not self._stop.is_set():
            self.peak_rss = max(self.peak_rss, self.rss())
            time.sleep(0.2)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def figure(measurements: dict, *path: str):
    node = measurements
    for p in path:
        if not isinstance(node, dict) or p not in node:
            return None
        node = node[p]
    return node


def measure(args, out: Path) -> dict:
    import _triton

    why = _triton.missing()
    if why:
        raise SystemExit(f"no tritonserver here: {why}")
    model = Path(args.model).resolve()
    name = "model"
    repo = out / "repo"
    optkit("package", model, "--to", "triton", "-o", repo, "--name", name)
    proof = _triton.proof_repository(repo, out / "proof")
    rows = []
    with _triton.tritonserver(proof, out / "server", start_timeout=90, control="explicit") as (url, proc):
        if url is None:
            raise SystemExit(f"tritonserver refused the package: {_triton.log_tail(out / 'server')}")
        with GroupSampler(proc.pid) as g:
            optkit("bench", "--url", f"{url}/v2/models/{name}", "--runs", "20")  # warm the server
            for c in args.concurrency:
                report = out / f"report_c{c}.json"
                cpu0, t0 = g.cpu_s(), time.monotonic()
                optkit("bench", "--url", f"{url}/v2/models/{name}", "--concurrency", c, "--duration", args.duration,
                       "--report", report)
                cores = (g.cpu_s() - cpu0) / (time.monotonic() - t0)
                m = json.loads(report.read_text())["stages"][-1]["measurements"]
                load = m.get("concurrency") or {}
                rows.append({"concurrency": c, "report": str(report), "cores": cores, "rss_mb": g.peak_rss / 1e6,
                             "throughput_per_s": load.get("throughput_per_s"),
                             "throughput_ci95": figure(load, "ci95", "throughput_per_s"),
                             "p99_ms": load.get("p99_ms"), "p99_ci95": figure(load, "ci95", "p99_ms")})
    print(f"\nper-replica figures: {model.name} served by tritonserver (Python backend, onnxruntime CPU), "
          f"bench --url, {args.duration:g} s per concurrency")
    print(f"{'conc':>4} {'throughput/s':>14} {'95% band':>20} {'p99 ms':>8} {'server cores':>13} {'server RSS MB':>14}")
    for r in rows:
        band = r["throughput_ci95"]
        band_s = f"[{band[0]:.1f}, {band[1]:.1f}]" if isinstance(band, list) and len(band) == 2 else "n/a"
        thr = r["throughput_per_s"]
        p99 = r["p99_ms"]
        print(f"{r['concurrency']:>4} {thr if thr is None else f'{thr:.1f}':>14} {band_s:>20} "
              f"{p99 if p99 is None else f'{p99:.2f}':>8} {r['cores']:>13.2f} {r['rss_mb']:>14.0f}")
    ok = [r for r in rows if r["throughput_per_s"] and (r["p99_ms"] or 0) <= args.slo_p99]
    if not ok:
        raise SystemExit(f"no concurrency met p99 <= {args.slo_p99} ms; raise --slo-p99")
    best = max(ok, key=lambda r: r["throughput_per_s"])
    print(f"chosen: concurrency {best['concurrency']} (the most throughput with p99 <= {args.slo_p99:g} ms)")
    return best


def scaled_trace(src: Path, dest: Path, peak_rate: float) -> float:
    lines = src.read_text().splitlines()
    rows = [ln.split(",") for ln in lines[1:]]
    peak = max(float(r[1]) for r in rows)
    k = peak_rate / peak
    dest.write_text("timestamp,requests_per_s\n" + "".join(f"{t},{float(v) * k:.4f}\n" for t, v in rows))
    return k


def surge_trace(dest: Path, peak_rate: float, days: int = 14) -> None:
    """Two weeks per minute: a daily cycle (busier on weekdays), noise, and on the last weekday a surge to the peak
    that the days before never showed (a launch, a sale)."""
    rng = np.random.default_rng(0)
    minutes = days * 1440
    t = np.arange(minutes)
    day = (t // 1440) % 7
    base = 0.25 + 0.35 * (0.5 - 0.5 * np.cos(2 * np.pi * ((t % 1440) - 8 * 60) / 1440))
    base = base * np.where(day < 5, 1.0, 0.6)
    rate = base * peak_rate * 0.5 * (1 + 0.05 * rng.standard_normal(minutes))
    s = (days - 3) * 1440 + 14 * 60
    rate[s:s + 90] = np.maximum(rate[s:s + 90], peak_rate * np.minimum(1, (np.arange(90) + 1) / 15))
    start = np.datetime64("2026-01-05T00:00:00")
    with dest.open("w") as f:
        f.write("timestamp,requests_per_s\n")
        for i in range(minutes):
            f.write(f"{start + np.timedelta64(i, 'm')}Z,{max(rate[i], 0):.4f}\n")


def capacity(args, best: dict, out: Path) -> None:
    if optkit("capacity", "--help", check=False).returncode != 0:
        print("\n*** `optkit capacity` is not in this tree (issue 33, branch i33-capacity): the replay figures are "
              "NOT computed. Run this script on a tree with it. ***")
        return
    thr = best["throughput_per_s"]
    traces = {}
    traces["NASA-HTTP Jul 1995 (scaled)"] = out / "nasa_scaled.csv"
    k = scaled_trace(NASA, traces["NASA-HTTP Jul 1995 (scaled)"], thr * args.peak_replicas / 1.2)
    traces["synthetic surge"] = out / "surge.csv"
    surge_trace(traces["synthetic surge"], thr * args.peak_replicas / 1.2)
    print(f"\nNASA rates x{k:.1f} (peak {6.75 * k:.1f}/s); surge trace peak {thr * args.peak_replicas / 1.2:.1f}/s")
    for label, csv in traces.items():
        cap = out / f"CAPACITY_{csv.stem}.json"
        t0 = time.monotonic()
        optkit("capacity", best["report"], "--history", csv, "-o", cap, "--slo-p99", args.slo_p99, "--cpu",
               f"{best['cores']:.3f}", "--memory-mb", f"{best['rss_mb']:.0f}", "--max-replicas", 200)
        took = time.monotonic() - t0
        doc = json.loads(cap.read_text())
        st = doc["replay"]["strategies"]
        print(f"\n{label}: {doc['replay']['minutes']} minutes replayed ({took:.0f} s); target "
              f"{doc['autoscaling']['target_utilization']}, chosen {doc['autoscaling'].get('strategy')}, "
              f"{len(doc['schedule'])} cron windows; repairs: {doc['replay'].get('repairs')}")
        print(f"{'strategy':>10} {'SLO minutes':>12} {'replica-hours':>14} {'peak replicas':>14}")
        for name in ("fixed", "reactive", "forecast"):
            s = st.get(name)
            if not s:
                print(f"{name:>10} {'(none)':>12}")
                continue
            print(f"{name:>10} {s.get('slo_minutes', 'n/a'):>12} {s.get('replica_hours', math.nan):>14.1f} "
                  f"{s.get('peak_replicas', 'n/a'):>14}")
        repo = out / f"deploy_{csv.stem}"
        shutil.rmtree(repo, ignore_errors=True)
        optkit("package", args.model, "--to", "triton", "-o", repo, "--name", "model", "--manifests",
               "kserve,seldon,kubedl", "--capacity", cap)
        files = sorted(p.name for p in (repo / "model" / "1" / "manifests").iterdir())
        print(f"manifests: {', '.join(files)} in {repo}/model/1/manifests")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "sample_models" / "torch_cnn.onnx"))
    ap.add_argument("--concurrency", default="1,2,4", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--slo-p99", type=float, default=50.0)
    ap.add_argument("--peak-replicas", type=int, default=8)
    ap.add_argument("--out", default="/tmp/optkit-capacity")
    args = ap.parse_args()
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    best = measure(args, out)
    capacity(args, best, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
