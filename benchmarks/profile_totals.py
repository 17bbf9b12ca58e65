"""optkit profile: do the per-op totals add up to the p50 latency? (target: within 10%)

    .venv/bin/python benchmarks/profile_totals.py [--threads N] [--runs N]

Models: the sample digits CNN (sample_models/torch_cnn.onnx), mnist.onnx (../shared/realcases), and the
sentence encoder of tests/models_zoo (vocab 8000, width 256, 4 heads, 4 layers, as benchmarks/realmodels.py
exports it) at batch 1 x 64 tokens and batch 8 x 64. Each row: the per-call kernel total from onnxruntime's
profiler (optkit.measure.profile.profile_onnx: the middle half of the profiled calls) with the profiler's own
per-kernel cost taken off (measured here first: "overhead us"), the raw total as recorded, the p50 of a plain
session in the same process with the same threads and feeds, the corrected total's ratio to it (and the raw
one's), PASS when within 10%.

What a corrected total cannot hold: the cost of a call outside every kernel (session.run from Python, binding
the feeds, allocating the outputs), which the p50 includes. The calibration measures it on a one-Relu model
("call us"); a model that misses low by about that much misses for that reason, and the last column says so.
No figure is scaled to fit.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT.parent / "shared" / "realcases"
sys.path.insert(0, str(ROOT))

ENCODER = {"vocab": 8000, "dim": 256, "heads": 4, "layers": 4, "max_len": 128}


def export_encoder(path: Path) -> Path:
    import torch

    from tests.models_zoo import export_onnx, make_sentence_encoder

    torch.backends.mha.set_fastpath_enabled(False)  # the fused fast path does not export
    args = (torch.randint(1, ENCODER["vocab"], (2, 64)), torch.ones(2, 64, dtype=torch.int64))
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            "last_hidden_state": {0: "batch", 1: "sequence"}, "sentence_embedding": {0: "batch"}}
    with torch.no_grad():
        export_onnx(make_sentence_encoder(**ENCODER), args, path, ["input_ids", "attention_mask"],
                    ["last_hidden_state", "sentence_embedding"], axes)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=100)
    args = ap.parse_args()

    from optkit.core.artifact import Artifact
    from optkit.measure.profile import profile_onnx

    tmp = Path(tempfile.mkdtemp(prefix="optkit-bench-profile-"))
    rows = [("sample CNN", ROOT / "sample_models" / "torch_cnn.onnx", {})]
    if (REAL / "mnist.onnx").exists():
        rows.append(("mnist.onnx", REAL / "mnist.onnx", {}))
    encoder = export_encoder(tmp / "encoder.onnx")
    for batch in (1, 8):
        rows.append((f"encoder {batch}x64", encoder, {"input_ids": [batch, 64], "attention_mask": [batch, 64]}))
    from optkit.measure.profile import calibrate_overhead

    cal = calibrate_overhead(args.threads)
    print(f"threads {args.threads}, {args.runs} profiled calls after 10 warm-up calls")
    print(f"profiler overhead {cal['overhead_us']:.2f} us per kernel (a Relu: {cal['profiled_us']:.2f} us "
          f"profiled, {cal['plain_us']:.2f} us plain); a plain call outside its kernels {cal['call_us']:.2f} us")
    print(f"{'model':<14} {'kernels ms':>10} {'raw ms':>9} {'p50 ms':>9} {'ratio':>5} {'raw':>5} {'nodes':>5}  "
          "within 10%")
    misses = 0
    for label, path, shapes in rows:
        p = profile_onnx(Artifact.load(path), runs=args.runs, threads=args.threads, shapes=shapes)
        misses += not p["within_10pct"]
        print(f"{label:<14} {p['total_ms']:>10.4f} {p['total_raw_ms']:>9.4f} {p['p50_ms']:>9.4f} "
              f"{p['total_vs_p50']:>5.2f} {p['raw_vs_p50']:>5.2f} {p['node_count']:>5}  "
              f"{'PASS' if p['within_10pct'] else 'MISS'}{why(p)}")
    print(f"{len(rows) - misses} of {len(rows)} within 10% (corrected kernel totals against the p50)")


def why(p: dict) -> str:
    """Why a row misses, where the figures say: the per-call cost outside every kernel, or a plain p50 and a
    profile that disagree beyond it (the machine's load changed between the two)."""
    if p["within_10pct"]:
        return ""
    gap_us = (p["p50_ms"] - p["total_ms"]) * 1e3
    call_us = p["call_overhead_us"]
    with_call = (p["total_ms"] * 1e3 + call_us) / (p["p50_ms"] * 1e3)
    if gap_us > 0 and abs(with_call - 1) <= 0.10:
        return (f": {gap_us:.1f} us of the p50 is outside the kernels; {call_us:.1f} us is what any call costs "
                f"outside them (session.run, feeds, outputs), {100 * call_us / (p['p50_ms'] * 1e3):.0f}% of this p50")
    return (f": kernels + the {call_us:.1f} us a call costs outside them = {with_call:.2f}x the p50, raw "
            f"{p['raw_vs_p50']:.2f}x: the plain and the profiled runs disagree (the machine's load changed? rerun)")


if __name__ == "__main__":
    main()
