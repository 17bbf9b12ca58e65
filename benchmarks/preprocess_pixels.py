"""Pixels of the bounded resize + centre crop `optkit preprocess` writes (issue 39, W1) against PIL (optkit's PIL
path) and against the graph before the bound (onnxruntime's Resize of the whole image, then the crop), on many
image sizes and aspect ratios (1:11 to 11:1, odd and even, shrinking and enlarging), per filter: how many pixels
differ and by how much.

    .venv/bin/python benchmarks/preprocess_pixels.py                 # resize 272, crop 240 (EfficientNet-Lite1's)
    .venv/bin/python benchmarks/preprocess_pixels.py --resize 32 --crop 24
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def session(pre, bounded: bool):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from optkit.passes.preprocess import resize as rz
    from optkit.passes.preprocess.graph import Builder

    b = Builder(set())
    if bounded:
        y = rz.resize_and_crop(b, "image", pre, symbolic=True)
    else:  # the graph before the bound
        y = b.op("Resize", ["image", "", "", rz._shorter_side(b, b.op("Shape", ["image"], start=1, end=3), pre.resize)],
                 axes=[1, 2], **rz.RESAMPLE[pre.resample])
        crop = b.const([pre.center_crop] * 2, np.int64)
        y = rz._slice(b, y, b.op("Div", [b.op("Sub", [b.op("Shape", [y], start=1, end=3), crop]),
                                         b.const([2, 2], np.int64)]), (pre.center_crop, pre.center_crop))
    b.op("Identity", [y], out=["out"])
    vi = helper.make_tensor_value_info
    g = helper.make_graph(b.nodes, "g", [vi("image", TensorProto.UINT8, [1, None, None, 3])],
                          [vi("out", TensorProto.UINT8, [1, None, None, 3])], b.inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def pil(a: np.ndarray, pre) -> np.ndarray:
    from PIL import Image

    from optkit.measure.preprocess import prepare

    return prepare(Image.fromarray(a), pre, "image").astype(np.uint8)  # layout nhwc: [h, w, c]


def main() -> None:
    from PIL import Image

    from optkit.measure.preprocess import Preprocess

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--resize", type=int, default=272)
    ap.add_argument("--crop", type=int, default=240)
    args = ap.parse_args()
    side, crop = args.resize, args.crop
    sizes = set()
    for h in [*range(max(1, crop // 8), side * 3, max(1, side // 9)), 1, 2, 3, side - 1, side, side + 1]:
        for aspect in (1.0, 1.37, 0.61, 3.3, 0.2, 11.0):
            w = max(1, round(h * aspect))
            s = side / min(h, w)
            if h * w <= 4e6 and max(1, round(h * s)) * max(1, round(w * s)) <= 6e7:
                sizes.add((h, w))
    print(f"resize {side}, center_crop {crop}: {len(sizes)} image sizes")
    for mode in ("bilinear", "bicubic", "nearest"):
        pre = Preprocess(resize=side, center_crop=crop, resample=mode, layout="nhwc", scale=1)
        bounded, whole = session(pre, True), session(pre, False)
        rows = {k: dict(images=0, pixels=0, vs_whole=0, max_whole=0, vs_pil=0, max_pil=0, whole_vs_pil=0,
                        max_whole_pil=0) for k in ("enlarging", "shrinking")}
        rng = np.random.default_rng(0)
        for h, w in sorted(sizes):
            small = rng.integers(0, 256, (max(2, h // 4), max(2, w // 4), 3), dtype=np.uint8)
            a = np.asarray(Image.fromarray(small).resize((w, h), Image.BILINEAR)).astype(np.int16)
            a = np.clip(a + rng.integers(-20, 21, a.shape), 0, 255).astype(np.uint8)
            got = bounded.run(None, {"image": a[None]})[0][0].astype(int)
            old = whole.run(None, {"image": a[None]})[0][0].astype(int)
            ref = pil(a, pre).astype(int)
            r = rows["enlarging" if min(h, w) < side else "shrinking"]
            r["images"] += 1
            r["pixels"] += got.size
            for key, x, y in (("whole", got, old), ("pil", got, ref), ("whole_pil", old, ref)):
                r["vs_" + key if key != "whole_pil" else "whole_vs_pil"] += int((x != y).sum())
                r["max_" + key] = max(r["max_" + key], int(np.abs(x - y).max()))
        for kind, r in rows.items():
            print(f"{mode:8s} {kind:9s} {r['images']:4d} images, {r['pixels']:,} values: bounded vs whole-image "
                  f"Resize {r['vs_whole']:,} differ (max {r['max_whole']}); bounded vs PIL {r['vs_pil']:,} (max "
                  f"{r['max_pil']}); whole-image Resize vs PIL {r['whole_vs_pil']:,} (max {r['max_whole_pil']})",
                  flush=True)


if __name__ == "__main__":
    main()
