"""simplify side by side: onnxslim alone vs optkit simplify (nodes, size, output equality).

    .venv/bin/python benchmarks/simplify.py
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    import onnx
    import onnxslim
    from test_quantize import build_loop, build_lstm

    from optkit.onnx.graph import op_counts

    tmp = Path(tempfile.mkdtemp(prefix="optkit-bench-"))
    models = [ROOT / "sample_models" / "torch_cnn.onnx", ROOT.parent / "shared" / "realcases" / "mnist.onnx",
              build_lstm(tmp / "lstm.onnx"), build_loop(tmp / "loop.onnx")]
    print(f"{'model':<16} {'nodes in':>8} {'onnxslim':>8} {'optkit':>7} {'size ratio':>10} {'max err':>9}")
    for m in models:
        if not m.exists():
            continue
        slim = sum(op_counts(onnxslim.slim(onnx.load(str(m)))).values())
        out = tmp / f"{m.stem}_s.onnx"
        r = subprocess.run([sys.executable, "-m", "optkit", "simplify", str(m), "-o", str(out), "--json"],
                           capture_output=True, text=True)
        if r.returncode:
            print(f"{m.stem:<16} failed: {r.stderr.strip().splitlines()[-1]}")
            continue
        s = json.loads(r.stdout)["stages"][1]["measurements"]["simplify"]
        print(f"{m.stem:<16} {s['nodes_before']:>8} {slim:>8} {s['nodes_after']:>7} "
              f"{s['bytes_after'] / s['bytes_before']:>9.3f}x {s['max_scaled_error']:>9.1e}")


if __name__ == "__main__":
    main()
