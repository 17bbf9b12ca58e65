"""Quantization side by side: the naive onnxruntime call vs optkit, in one run.

    .venv/bin/python benchmarks/quantize.py            # MNIST (full 10k test set), sample CNN, transformer

Prints size ratio, accuracy drop (or cosine) and latency ratio at batch 1 and 32 (p50 vs the FP32 parent, one
thread, best of 3 interleaved optkit.measure calls: the machine may be shared) for each. optkit runs with
--allow-slower so a slower result is still shown (the CLI exits 3 on it by default). mnist.onnx fixes batch 1.
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

    spec = DataSpec(path=data) if data else None
    s = MeasureSettings(warmup=20, runs=200, threads=1)
    p = measure(Artifact.load(parent), s, data=spec, metric=metric)
    q = measure(Artifact.load(model), s, data=spec, metric=metric, reference=Artifact.load(parent))
    row = {"size": q["size"]["bytes"] / p["size"]["bytes"], "cosine": q["fidelity"]["cosine"]}
    for batch in (1, 32):  # interleaved rounds, best p50 each (the machine is shared)
        bs = MeasureSettings(warmup=10, runs=100 if batch == 1 else 20, threads=1, batch=batch)
        try:
            tp, tq = [], []
            for _ in range(3):
                tp.append(measure(Artifact.load(parent), bs)["latency"]["p50_ms"])
                tq.append(measure(Artifact.load(model), bs)["latency"]["p50_ms"])
            row[f"lat{batch}"] = min(tq) / min(tp)
        except Exception:  # a fixed-batch-1 model (mnist.onnx) cannot run batch 32
            row[f"lat{batch}"] = None
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
    lat = "  ".join(f"lat b{b} " + (f"{row[f'lat{b}']:.2f}x" if row.get(f"lat{b}") else "n/a  ") for b in (1, 32))
    print(f"  {name:<34} size {row['size']:.3f}x  {lat}  cosine {row['cosine']:.5f}  {extra}")


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
                   "--max-samples", "500", "--allow-slower", *extra)
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
        optkit(samples / "torch_cnn.onnx", "-o", out, "--calibration-data", cal, "--eval-data", ev, "--allow-slower")
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
