"""Issue 31: a full-int8 MobileNetV2 at 224x224 (alpha 1.0, random weights, batch-norm statistics and calibration
from the 100 real ImageNet images of ../shared/realcases/imagenet100), converted by `optkit convert` with default
flags and by plain tf2onnx: top-1 agreement with TFLite on the images, the step distribution of each, both
files as a user runs them (a default onnxruntime session: fused int8 kernels, which differ by CPU) and on the
graph's own arithmetic (optimization "basic"), their latency side by side with the TFLite interpreter's, which
file optkit kept (int8, or retyped as uint8) and why, and the verdict on a conversion with the output scale 10% off.

    TF_USE_LEGACY_KERAS=1 .venv/bin/python benchmarks/tflite_int8.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def main() -> None:
    import tf2onnx
    from test_tflite_int8 import images, run_broken
    from test_tflite_int8_deep import mobilenet_v2_int8

    from optkit.core.artifact import Artifact
    from optkit.core.formats import Format
    from optkit.measure.fidelity import step_errors
    from optkit.onnx.session import ort_session
    from optkit.runtimes.tflite import TFLiteSession, dequantize, quantize

    tmp = Path(tempfile.mkdtemp(prefix="optkit-bench-"))
    x = images(100, 224, keras=True)
    model = tmp / "mobilenet_v2_224_int8.tflite"
    mobilenet_v2_int8(model, x, alpha=1.0)
    np.savez(tmp / "data.npz", input_1=x)

    r = subprocess.run([sys.executable, "-m", "optkit", "convert", str(model), "-o", str(tmp / "optkit.onnx"),
                        "--data", str(tmp / "data.npz"), "--json"], capture_output=True, text=True, cwd=ROOT)
    print(f"optkit convert, default flags: exit {r.returncode}")
    if r.returncode:
        print(r.stderr.strip().splitlines()[-1])
        return
    judged = json.loads(r.stdout)["stages"][-1]["measurements"]["validation"]["outputs"]["logits"]["step_error"]
    print(f"  its check (64 images): depth {judged['depth']}, limits from {judged['limits']['from']}: "
          f"{ {k: v for k, v in judged['limits'].items() if k != 'from'} }")

    tfl = TFLiteSession(Artifact(path=str(model), format=Format.TFLITE, sha256=""))
    k = [s.name for s in tfl.outputs].index("logits")
    d_in, d_out = tfl.input_details[0], tfl.output_details[k]
    ref = np.concatenate([tfl.run({"input_1": x[i:i + 1]})[k] for i in range(len(x))])
    kernels = json.loads(r.stdout)["stages"][-1]["measurements"]["validation"]["kernels"]
    vnni = "avx512_vnni" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else None
    print(f"  file kept: {kernels['stored']} (CPU has AVX-512 VNNI: {vnni}); uint8/int8 latency ratio "
          f"{kernels['uint8_latency_ratio']}")
    tf2onnx.convert.from_tflite(str(model), output_path=str(tmp / "plain.onnx"))
    step = d_out["quantization"][0]
    runs = {}
    for level in (None, "basic"):
        ours = ort_session(tmp / "optkit.onnx", optimization=level)
        plain = ort_session(tmp / "plain.onnx", optimization=level)
        runs[("optkit", level)] = (lambda xb, s=ours: s.run(["logits"], {"input_1": xb})[0])
        runs[("plain tf2onnx", level)] = (lambda xb, s=plain: dequantize(
            s.run([d_out["name"]], {d_in["name"]: quantize(xb, d_in)})[0], d_out))
    print(f"\non {len(x)} real images, against the TFLite interpreter (logits, step {step:.4g}):")
    print(f"{'conversion':<14} {'session':<26} {'top-1 agree':>11} {'median':>6} {'p90':>5} {'p99':>5} {'max':>5} "
          f"{'gain':>7}")
    outs = {}
    for (name, level), run in runs.items():
        out = outs[(name, level)] = np.concatenate([run(x[i:i + 1]) for i in range(len(x))])
        q = step_errors(ref, out, step, 8)
        how = "default (fused int8 kernels)" if level is None else "basic (graph arithmetic)"
        print(f"{name:<14} {how:<26} {np.mean(out.argmax(1) == ref.argmax(1)):>11.3f} {q['median']:>6.3g} "
              f"{q['p90']:>5.3g} {q['p99']:>5.3g} {q['max']:>5.3g} {q['gain']:>+7.4f}")
    # latency side by side: rounds of 20 calls of each, interleaved; medians of the rounds, as ratios to TFLite's
    times: dict[str, list[float]] = {"TFLite": [], "optkit": [], "plain tf2onnx": []}
    calls = {"TFLite": lambda xb: tfl.run({"input_1": xb}), "optkit": runs[("optkit", None)],
             "plain tf2onnx": runs[("plain tf2onnx", None)]}
    for _ in range(9):
        for name, call in calls.items():
            t = time.perf_counter()
            for i in range(20):
                call(x[i:i + 1])
            times[name].append((time.perf_counter() - t) / 20)
    base = float(np.median(times["TFLite"]))
    print("latency, one image a call, default sessions: " + ", ".join(
        f"{n} {np.median(v) * 1e3:.2f} ms ({np.median(v) / base:.2f}x TFLite)" for n, v in times.items()))

    print()
    for factor, shift, limits in ((1.1, 0, "plain"), (1.1, 0, "depth"), (1.0, 1, "plain"), (1.0, 1, "depth")):
        out = tmp / f"broken_{factor}_{shift}_{limits}.onnx"
        b = run_broken(model, out, tmp / "data.npz", factor=factor, shift=shift, limits=limits)
        what = f"scale x{factor}" if factor != 1 else f"zero point {shift:+d}"
        last = (b.err.strip().splitlines() or [""])[-1]
        print(f"{what:<14} limits from {limits:<5}: exit {b.rc}, output written: {out.exists()}")
        print(f"    {last}")


if __name__ == "__main__":
    main()
