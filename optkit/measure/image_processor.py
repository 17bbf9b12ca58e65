"""A Hugging Face image processor (preprocessor_config.json) as optkit's Preprocess: the resize, crop, rescale and
normalise that `optkit preprocess`, eval and the image data loaders apply, read from the model's own file.

What maps: do_resize with size {height, width} (a fixed size) or {shortest_edge} (the shorter side; with
crop_pct, as ConvNeXt's processor does, the shorter side is shortest_edge / crop_pct and the image is then
cropped to shortest_edge), resample nearest / bilinear / bicubic, do_center_crop with crop_size, do_rescale with
rescale_factor, do_normalize with image_mean / image_std. Anything else (another resample filter, a longest_edge
bound, padding) is exit 2 naming the key: a spec that only looks like the model's would move accuracy silently.
"""
from __future__ import annotations

from pathlib import Path

from optkit.core import hffolder
from optkit.core.errors import UsageError
from optkit.measure.preprocess import Preprocess, parse_preprocess

FILE = "preprocessor_config.json"
_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}   # PIL's filter numbers, as the processors store them


def from_folder(folder: str | Path) -> Preprocess:
    """The Preprocess of the image processor in `folder` (a model folder or a preprocessor folder)."""
    folder = Path(folder)
    file = folder / FILE
    if not file.is_file():
        raise UsageError(f"{folder} has no {FILE} (the model's image processor); give --preprocess")
    cfg = hffolder.read_json(file, folder)
    if not isinstance(cfg, dict):
        raise UsageError(f"{file} is not an image processor's configuration")
    return from_config(cfg, str(file))


def from_config(cfg: dict, where: str) -> Preprocess:
    spec: dict = {"scale": float(cfg.get("rescale_factor", 1 / 255)) if cfg.get("do_rescale", True) else 1.0}
    for key in ("do_pad", "longest_edge"):
        if cfg.get(key):
            raise UsageError(f"{where}: {key} is set; optkit's preprocess does not pad or bound the longer side: give "
                             "--preprocess")
    crop = None
    if cfg.get("do_center_crop"):
        crop = _sides(cfg.get("crop_size"), where, "crop_size")
    if cfg.get("do_resize", True):
        size = cfg.get("size")
        if isinstance(size, dict) and "shortest_edge" in size:
            edge = int(size["shortest_edge"])
            if cfg.get("crop_pct") and edge < 384:   # ConvNeXt: resize to edge / crop_pct, then crop edge
                spec["resize"], crop = int(edge / float(cfg["crop_pct"])), edge
            else:
                spec["resize"] = edge
        elif isinstance(size, dict) and "longest_edge" in size:
            raise UsageError(f"{where}: size.longest_edge is set; optkit's preprocess does not bound the longer side: "
                             "give --preprocess")
        else:
            spec["resize"] = _sides(size, where, "size")
        resample = cfg.get("resample", 2)
        if resample not in _RESAMPLE:
            raise UsageError(f"{where}: resample {resample!r} is not nearest (0), bilinear (2) or bicubic (3), the "
                             "filters optkit's preprocess applies; give --preprocess")
        spec["resample"] = _RESAMPLE[resample]
    if crop is not None:
        spec["center_crop"] = crop
    if cfg.get("do_normalize", True) and cfg.get("image_mean") is not None:
        spec["mean"], spec["std"] = cfg["image_mean"], cfg.get("image_std", 1.0)
    return parse_preprocess(spec, where)


def _sides(v, where: str, key: str):
    if isinstance(v, dict) and "height" in v and "width" in v:
        return [int(v["height"]), int(v["width"])]
    if isinstance(v, int):
        return [v, v]
    raise UsageError(f"{where}: {key} {v!r} is not {{height, width}} or a number of pixels")
