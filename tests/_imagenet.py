"""The 100 labelled ImageNet images of ../shared/realcases/imagenet100 as EfficientNet-Lite1 takes them
(SOURCES.md: shorter side resized to 272, bicubic, centre crop 240, RGB, (x - 127) / 128, NCHW; labels are the
ImageNet indices), split for quantization: every 4th image calibrates (25), the other 75 evaluate."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

REALCASES = Path(__file__).resolve().parents[2] / "shared" / "realcases"


def _images(offsets=(None,)):
    """Every image, cropped at each (dx, dy) offset of the resized image (None: the centre); labels."""
    from PIL import Image

    rows = list(csv.DictReader((REALCASES / "imagenet100" / "labels.csv").open()))
    xs, ys = [], []
    for r in rows:
        im = Image.open(REALCASES / "imagenet100" / r["file"]).convert("RGB")
        s = 272 / min(im.size)
        im = im.resize((round(im.width * s), round(im.height * s)), Image.BICUBIC)
        for off in offsets:
            left, top = off or ((im.width - 240) // 2, (im.height - 240) // 2)
            x = np.asarray(im.crop((left, top, left + 240, top + 240)), dtype=np.float32)
            xs.append(((x - 127) / 128).transpose(2, 0, 1))
            ys.append(int(r["imagenet_index"]))
    return np.stack(xs), np.array(ys)


def imagenet100_views(dest: Path) -> tuple[Path, Path]:
    """For a search's cost at scale: calib100.npz (the 100 centre crops) and eval900.npz (9 crops of each image
    on a 3x3 grid of offsets: views of the same images, so for timing, not for accuracy claims)."""
    x, y = _images()
    np.savez(dest / "calib100.npz", inputs=x, labels=y)
    x, y = _images([(dx, dy) for dx in (0, 16, 32) for dy in (0, 16, 32)])
    np.savez(dest / "eval900.npz", inputs=x, labels=y)
    return dest / "calib100.npz", dest / "eval900.npz"


def imagenet100_split(dest: Path) -> tuple[Path, Path]:
    """calib.npz (25 images) and eval.npz (75) in `dest`, each with `inputs` and `labels`."""
    x, y = _images()
    calib = np.arange(len(x)) % 4 == 0
    np.savez(dest / "calib.npz", inputs=x[calib], labels=y[calib])
    np.savez(dest / "eval.npz", inputs=x[~calib], labels=y[~calib])
    return dest / "calib.npz", dest / "eval.npz"
