"""Server memory of a model written by `optkit preprocess` with a shorter-side resize + centre crop (EfficientNet-
Lite1's spec), served by tritonserver, under 1 x W uint8 requests (issue 39, W1): the peak RSS (VmHWM) of the
server's processes (tritonserver and its Python backend stubs, where onnxruntime runs each model) before and after
each request, what the server answered, and that it still answers a normal request.

    .venv/bin/python benchmarks/preprocess_served_memory.py                      # W = 900, 6000, 20000
    .venv/bin/python benchmarks/preprocess_served_memory.py --widths 900 6000 --optkit /tmp/old   # another tree

--optkit runs another checkout's optkit (e.g. `git archive 6c9ca45 | tar -x -C /tmp/old`, the graph before the
bound) for the preprocess and package steps; the server, the model and the requests are the same. Never ask for
W = 100,000 of a graph without the bound: it would allocate about 22 GB.

The model is tests/_bounded.image_model (a float [batch,3,240,240] CNN: the input size, not EfficientNet's
weights), so it runs without ../shared; the preprocessing is what memory depends on.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def optkit(tree: Path, *args) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    r = subprocess.run([sys.executable, "-m", "optkit", *map(str, args)], capture_output=True, text=True, env=env,
                       cwd=tree)
    if r.returncode:
        sys.exit(f"optkit {args[0]} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")


def peak(pgid: int) -> tuple[int, int]:
    """(largest VmHWM of one process, sum of VmRSS) of the server's processes, in bytes."""
    import _bounded

    mem = _bounded.group_memory(pgid)
    return max(h for _, h in mem.values()), sum(r for r, _ in mem.values())


def request(url: str, image: np.ndarray) -> str:
    """One KServe v2 infer call (as tests/_triton.infer, with a 10-minute timeout: the graph without the bound
    takes minutes at W = 20,000); what came back."""
    body = {"inputs": [{"name": "image", "shape": list(image.shape), "datatype": "UINT8",
                        "data": image.ravel().tolist()}]}
    req = urllib.request.Request(f"{url}/v2/models/m/infer", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.loads(r.read())["outputs"][0]
        what = f"answered {out['name']} {out['shape']}"
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")
        what = f"HTTP {e.code}: {json.loads(body).get('error', body)[:300] if body.startswith('{') else body[:300]}"
    return f"{what} ({time.monotonic() - t:.1f} s)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[900, 6000, 20000])
    ap.add_argument("--optkit", type=Path, default=ROOT, help="the optkit tree that preprocesses and packages")
    args = ap.parse_args()
    if any(w > 20000 for w in args.widths):
        sys.exit("widths past 20,000 are not tried here (a graph without the bound would take tens of GB)")
    import _bounded
    import _triton

    if _triton.missing():
        sys.exit(_triton.missing())
    with tempfile.TemporaryDirectory(prefix="preprocess-memory-") as t:
        tmp = Path(t)
        model = _bounded.image_model(tmp / "m.onnx")
        optkit(args.optkit, "preprocess", model, "-o", tmp / "m_u8.onnx", "--preprocess", _bounded.SPEC)
        optkit(args.optkit, "package", tmp / "m_u8.onnx", "--to", "triton", "-o", tmp / "repo", "--name", "m",
               "--shape", "image=1x240x240x3")
        proof = _triton.proof_repository(tmp / "repo", tmp / "proof")
        with _triton.tritonserver(proof, tmp, start_timeout=120) as (url, proc):
            if not url:
                sys.exit(f"tritonserver refused the repository: {_triton.log_tail(tmp)}")
            rng = np.random.default_rng(0)
            normal = rng.integers(0, 256, (1, 375, 500, 3), dtype=np.uint8)
            print(f"optkit tree: {args.optkit}")
            print(f"started: peak RSS of one server process {peak(proc.pid)[0] / 2**20:,.0f} MiB, all processes "
                  f"{peak(proc.pid)[1] / 2**20:,.0f} MiB")
            print(f"  1x375x500x3 (a photo): {request(url, normal)}; peak {peak(proc.pid)[0] / 2**20:,.0f} MiB")
            for w in args.widths:
                image = rng.integers(0, 256, (1, 1, w, 3), dtype=np.uint8)
                said = request(url, image)
                hwm, rss = peak(proc.pid)
                print(f"  1x1x{w}x3 ({image.nbytes:,} B): {said}; peak RSS of one process {hwm / 2**20:,.0f} MiB, "
                      f"all processes now {rss / 2**20:,.0f} MiB")
            print(f"  then 1x375x500x3: {request(url, normal)}; server {'up' if proc.poll() is None else 'gone'}")


if __name__ == "__main__":
    main()
