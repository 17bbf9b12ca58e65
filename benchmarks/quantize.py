"""Quantization side by side: the naive onnxruntime call vs optkit, in one run.

    .venv/bin/python benchmarks/quantize.py            # MNIST (full 10k test set), sample CNN, transformer

Prints size ratio, accuracy drop (or cosine) and latency ratio (p50 vs the FP32 parent, measured by
optkit.measure in a child process) for each.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
REAL = ROOT.parent / "shared" / "realcases"


def figures(model: Path, parent: Path, data: str | None, metric: str | None):
    from optkit.core.artifact import Artifact
    from optkit.measure.model import DataSpec, MeasureSettings, measure

    s = MeasureSettings(warmup=20, runs=300)
    spec = DataSpec(path=data) if data else None
    p = measure(Artifact.load(parent), s, data=spec, metric=metric)
    q = measure(Artifact.load(model), s, data=spec, metric=metric, reference=Artifact.load(parent))
    row = {"size": q["size"]["bytes"] / p["size"]["bytes"],
           "latency": q["latency"]["p50_ms"] / p["latency"]["p50_ms"], "cosine": q["fidelity"]["cosine"]}
    if metric:
        row["drop_pt"] = 100 * (p["accuracy"][metric] - q["accuracy"][metric])
    return row


def optkit(*args) -> None:
    r = subprocess.run([sys.executable, "-m", "optkit", "quantize", *map(str, args), "--json"],
                       capture_output=True, text=True)
    if r.returncode:
        print(f"  optkit failed: {r.stderr.strip().splitlines()[-1]}")


def show(name, row):
    extra = f"top1 drop {row['drop_pt']:+.2f} pt" if "drop_pt" in row else ""
    print(f"  {name:<34} size {row['size']:.3f}x  latency {row['latency']:.2f}x  cosine {row['cosine']:.5f}  {extra}")


def main() -> None:
    import onnx
    from onnx import version_converter
    from onnxruntime.quantization import CalibrationDataReader, quantize_dynamic, quantize_static

    from optkit.measure.datasets import load_dataset

    tmp = Path(tempfile.mkdtemp(prefix="optkit-bench-"))
    if (REAL / "mnist.onnx").exists():
        images = str(REAL / "t10k-images-idx3-ubyte.gz")
        print("MNIST (mnist.onnx, 10k test images; calibration 256 images)")
        x = load_dataset(images).subset(256, 0).arrays[""].reshape(-1, 1, 1, 28, 28)

        class R(CalibrationDataReader):
            def __init__(self):
                self.it = iter({"Input3": a} for a in x)

            def get_next(self):
                return next(self.it, None)

        m13 = tmp / "mnist13.onnx"  # the naive call needs opset >= 10 too; give it the same upgrade
        m = version_converter.convert_version(onnx.load(REAL / "mnist.onnx"), 13)
        onnx.save(m, m13)
        naive = tmp / "naive.onnx"
        quantize_static(str(m13), str(naive), R())
        show("naive quantize_static", figures(naive, REAL / "mnist.onnx", images, "top1"))
        for label, extra in (("optkit static (QDQ, default)", []), ("optkit static --format qoperator",
                                                                    ["--format", "qoperator"])):
            out = tmp / f"ok_{len(extra)}.onnx"
            optkit(REAL / "mnist.onnx", "-o", out, "--calibration-data", images, "--eval-data", images,
                   "--max-samples", "500", *extra)
            if out.exists():
                show(label, figures(out, REAL / "mnist.onnx", images, "top1"))

    samples = ROOT / "sample_models"
    if (samples / "torch_cnn.onnx").exists():
        print("sample CNN (torch_cnn.onnx, digits eval set)")
        ev, cal = str(samples / "digits_eval_nchw.npz"), samples / "digits_calib_nchw.npz"
        xs = np.load(cal)["input"]

        class S(CalibrationDataReader):
            def __init__(self):
                self.it = iter({"input": xs[i:i + 1]} for i in range(len(xs)))

            def get_next(self):
                return next(self.it, None)

        naive = tmp / "cnn_naive.onnx"
        quantize_static(str(samples / "torch_cnn.onnx"), str(naive), S())
        show("naive quantize_static", figures(naive, samples / "torch_cnn.onnx", ev, "top1"))
        out = tmp / "cnn_ok.onnx"
        optkit(samples / "torch_cnn.onnx", "-o", out, "--calibration-data", cal, "--eval-data", ev)
        show("optkit static", figures(out, samples / "torch_cnn.onnx", ev, "top1"))

    from test_quantize import build_transformer

    print("transformer encoder (d_model 256, 4 layers, seq 32, trunc-normal weights)")
    tr = build_transformer(tmp / "tr.onnx", d_model=256, layers=4, seq=32)
    np.savez(tmp / "tr.npz", x=np.random.default_rng(0).standard_normal((32, 32, 256)).astype(np.float32))
    naive = tmp / "tr_naive.onnx"
    quantize_dynamic(str(tr), str(naive))
    show("naive quantize_dynamic", figures(naive, tr, str(tmp / "tr.npz"), None))
    for mode in ("dynamic", "int4"):
        out = tmp / f"tr_{mode}.onnx"
        optkit(tr, "-o", out, "--mode", mode, "--eval-data", tmp / "tr.npz")
        if out.exists():
            show(f"optkit {mode}", figures(out, tr, str(tmp / "tr.npz"), None))


if __name__ == "__main__":
    main()
