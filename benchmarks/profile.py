"""optkit profile: do the per-op totals add up to the p50 latency? (target: within 10%)

    .venv/bin/python benchmarks/profile.py [--threads N] [--runs N]

Models: the sample digits CNN (sample_models/torch_cnn.onnx), mnist.onnx (../shared/realcases), and the
sentence encoder of tests/models_zoo (vocab 8000, width 256, 4 heads, 4 layers, as benchmarks/realmodels.py
exports it) at batch 1 x 64 tokens and batch 8 x 64. Each row: the per-call kernel total from onnxruntime's
profiler (optkit.measure.profile.profile_onnx: the middle half of the profiled calls), the p50 of a plain
session in the same process with the same threads and feeds, their ratio, PASS when within 10%.
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
    print(f"threads {args.threads}, {args.runs} profiled calls after 10 warm-up calls")
    print(f"{'model':<16} {'kernels ms':>10} {'p50 ms':>9} {'ratio':>6} {'nodes':>6}  within 10%")
    misses = 0
    for label, path, shapes in rows:
        p = profile_onnx(Artifact.load(path), runs=args.runs, threads=args.threads, shapes=shapes)
        misses += not p["within_10pct"]
        print(f"{label:<16} {p['total_ms']:>10.4f} {p['p50_ms']:>9.4f} {p['total_vs_p50']:>6.2f} "
              f"{len(p['nodes']):>6}  {'PASS' if p['within_10pct'] else 'MISS'}")
    print(f"{len(rows) - misses} of {len(rows)} within 10%")


if __name__ == "__main__":
    main()
