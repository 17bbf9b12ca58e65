"""The checks of `preprocess.onnx`: the preprocessed model against optkit's PIL path + the original model, and the
post-processing against numpy doing the same on the model's own outputs; with the bytes that cross per sample."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from optkit.core.batching import trim
from optkit.core.errors import UsageError, ValidationError
from optkit.core.text import first_line
from optkit.measure.images import image_files, open_image
from optkit.measure.inputs import probe, synthesize
from optkit.measure.preprocess import pair, prepare
from optkit.onnx import session as onnx_session
from optkit.passes.preprocess.graph import produced_size

MAX_PIXELS = 4096 * 4096  # the largest synthesized check image
POST_TOLERANCE = 1e-5   # post-processing against numpy on the same outputs: only float rounding may differ


def check(artifact, pre, heads, paths: dict[str, Path], config, ctx) -> dict[str, Any]:
    """Figures of both checks (ValidationError past a tolerance: the caller writes nothing)."""

    pre_sess = onnx_session.session(paths["pre"])
    final_sess = _post_session(paths["final"], heads) if heads is not None else None
    figures: dict[str, Any] = {}
    if pre is not None:
        images, labels, source = _images(pre, config, ctx)
        feeds = [{pre_sess.get_inputs()[0].name: _client_array(im, pre)} for _, im in images]
        figures["preprocess"] = _check_pre(artifact, pre, images, labels, feeds, pre_sess, config, source, ctx)
        pre_out = [pre_sess.run(None, f) for f in feeds]
    else:
        samples = _samples(pre_sess, artifact, config, ctx)  # the model's own inputs, one sample a call
        pre_out = [pre_sess.run(None, f) for f in samples]
        final_out = [final_sess.run(None, f) for f in samples]
    if heads is not None:
        if pre is not None:
            final_out = [final_sess.run(None, f) for f in feeds]
        figures["postprocess"] = _check_post(heads, pre_sess, final_sess, pre_out, final_out, ctx)
    return figures


def _post_session(path: Path, heads):
    """The session of the model with post-processing; a UsageError in the user's words (not the temporary file's)
    when onnxruntime refuses it, e.g. --top-k larger than the classes a dynamic [N, classes] output has."""
    try:
        return onnx_session.ort_session(path, threads=1)
    except Exception as e:  # noqa: BLE001 - onnxruntime raises several exception types
        why = first_line(e).replace(str(path), "the model").split("] ")[-1][:300].rstrip(".")
        flag = (f"--top-k {heads.details.get('k')}" if heads.kind == "classifier"
                else f"--max-detections {heads.details.get('max_detections')}")
        raise UsageError(f"the model with {flag} in its graph does not load in onnxruntime: {why}; give a smaller "
                         f"{flag.split()[0]}") from None


def _samples(sess, artifact, config, ctx) -> list[dict[str, np.ndarray]]:
    """Feeds of one sample each for a model without preprocessing: from --data, else synthesized."""

    specs = onnx_session.input_specs(sess)
    data = ctx.data.get("eval") or ctx.data.get("calibration")
    if data is not None:
        feeds = trim(specs, data.subset(config.check_samples, ctx.seed).bind(specs))
        n = len(next(iter(feeds.values())))
        return [{k: v[i:i + 1] for k, v in feeds.items()} for i in range(n)]
    shapes, _ = probe(specs, lambda f: sess.run(None, f), ctx.shapes, ctx.values, ctx.seed)
    return [synthesize(specs, shapes, 1, ctx.seed + i, ctx.values) for i in range(min(8, config.check_samples))]


def _images(pre, config, ctx) -> tuple[list, np.ndarray | None, str]:
    """The PIL images to check on: the --data folder's (its labels where they line up), else synthesized ones of
    several sizes around the spec's."""
    from PIL import Image


    data = ctx.data.get("eval") or ctx.data.get("calibration")
    mode = "L" if pre.color == "gray" else "RGB"
    if data is not None:
        folder = Path(data.source)
        if not folder.is_dir():
            raise UsageError(f"--data {data.source}: preprocessing is checked on image files; give a folder of "
                             "images (a class per sub-folder, or labels.csv)")
        files, ys, _ = image_files(folder)
        labels = np.asarray(data.labels) if data.labels is not None and len(data.labels) == len(files) else None
        idx = np.arange(len(files))
        if len(files) > config.check_samples:
            idx = np.sort(np.random.default_rng(ctx.seed).choice(len(files), config.check_samples, replace=False))
        out = []
        for i in idx:
            with open_image(files[i]) as im:
                out.append((files[i].name, im.convert(mode)))
        return out, None if labels is None else labels[idx], str(folder)
    rng = np.random.default_rng(ctx.seed)
    out = []
    for h, w in _sizes(pre)[:config.check_samples]:
        # smooth content with edges and noise: what a photo has, so resize filters differ where they would
        small = rng.integers(0, 256, (max(2, h // 8), max(2, w // 8), 3), dtype=np.uint8)
        im = Image.fromarray(small).resize((w, h), Image.BILINEAR)
        arr = np.asarray(im).astype(np.int16) + rng.integers(-12, 13, (h, w, 3))
        out.append((f"synthesized {h}x{w}", Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).convert(mode)))
    return out, None, "synthesized images"


def _sizes(pre) -> list[tuple[int, int]]:
    """(height, width) of synthesized images: shrinking and enlarging, portrait, landscape and square."""

    if pre.resize is None:
        h, w = pair(pre.center_crop) if pre.center_crop is not None else (64, 64)
        return [(h, w), (h + 7, w + 12), (h + 20, w + 3), (h + 1, w + 1)]
    t = pre.resize if isinstance(pre.resize, int) else max(pre.resize)
    sizes = [(round(t * 1.4), round(t * 1.9)), (round(t * 1.7), round(t * 1.2)), (t + 5, t + 5),
             (max(1, round(t * 0.8)), max(1, round(t * 0.95))), (round(t * 3.1), round(t * 2.3)), (t, round(t * 1.33))]
    return [_within(h, w) for h, w in sizes]


def _within(h: int, w: int) -> tuple[int, int]:
    """(h, w) scaled down, aspect kept, to at most MAX_PIXELS: a spec may resize to 8192, but images of 3x that a
    side (25,000 x 19,000, 1.4 GB each) do not fit in memory; what is left of the size still differs per image."""
    if h * w <= MAX_PIXELS:
        return h, w
    f = (MAX_PIXELS / (h * w)) ** 0.5
    return max(1, int(h * f)), max(1, int(w * f))


def _client_array(im, pre) -> np.ndarray:
    """What a client sends: the decoded image as uint8 [1,H,W,C]."""
    x = np.asarray(im, dtype=np.uint8)
    return np.ascontiguousarray((x[:, :, None] if x.ndim == 2 else x)[None])


def _check_pre(artifact, pre, images, labels, feeds, pre_sess, config, source, ctx) -> dict[str, Any]:

    ref_sess = onnx_session.session(artifact.path)
    ref_name = ref_sess.get_inputs()[0].name
    out_names = [o.name for o in ref_sess.get_outputs()]
    worst, where, changed, agree, right_ref, right_new = 0.0, "", [], 0, 0, 0
    before_bytes, sizes = None, []
    classify = len(pre_sess.get_outputs()[0].shape or []) == 2
    for k, ((name, im), feed) in enumerate(zip(images, feeds)):
        x = prepare(im, pre, name)[None]
        before_bytes = x[0].nbytes
        try:
            ref = ref_sess.run(None, {ref_name: x.astype(_np_type(ref_sess.get_inputs()[0].type), copy=False)})
        except Exception as e:  # noqa: BLE001  the spec's output does not fit the model: the user's spec
            raise UsageError(f"{artifact.path} does not run on {name} prepared by --preprocess: "
                             f"{first_line(e)[:200]}") from None
        try:
            got = pre_sess.run(None, feed)
        except Exception as e:  # noqa: BLE001  e.g. an image smaller than the crop
            raise ValidationError(f"the preprocessed model fails on {name} ({feed[next(iter(feed))].shape[1]}x"
                                  f"{feed[next(iter(feed))].shape[2]}): {first_line(e)[:200]}; nothing was "
                                  "written") from None
        sizes.append(feed[next(iter(feed))][0].nbytes)
        for o, a, b in zip(out_names, ref, got):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            if a.shape != b.shape:
                raise ValidationError(f"output {o!r} is {list(b.shape)} with the preprocessing in the graph but "
                                      f"{list(a.shape)} through PIL on {name}; nothing was written")
            err = float(np.abs(a - b).max()) / max(1.0, float(np.abs(a).max())) if a.size else 0.0
            if err > worst:
                worst, where = err, f"output {o!r} on {name}"
        if classify:
            ta, tb = int(np.argmax(ref[0][0])), int(np.argmax(got[0][0]))
            agree += ta == tb
            if ta != tb:
                changed.append(name)
            if labels is not None:
                right_ref += ta == int(labels[k])
                right_new += tb == int(labels[k])
    n = len(images)
    fig: dict[str, Any] = {"source": source, "images": n, "tolerance": config.tolerance,
                           "max_scaled_error": worst, "worst_at": where,
                           "request_bytes_before": before_bytes,
                           "request_bytes_after_median": int(np.median(sizes)),
                           "request_bytes_after_at_model_size": _at_model_size(pre)}
    fig["request_ratio_median"] = before_bytes / fig["request_bytes_after_median"]
    if classify:
        fig.update({"top1_agreement": agree / n, "top1_changed": changed})
        if labels is not None:
            fig.update({"top1_pil": right_ref / n, "top1_graph": right_new / n, "labelled": n})
    at_size = fig["request_bytes_after_at_model_size"]
    ctx.note(f"preprocessing in the graph vs PIL + the original model on {n} {source}: max scaled difference "
             f"{worst:.3g} (tolerance {config.tolerance:g}; worst: {where})"
             + (f", top-1 agreement {agree}/{n}" if classify else "")
             + (f", top-1 {right_new}/{n} (PIL path {right_ref}/{n})" if classify and labels is not None else ""))
    ctx.note(f"request bytes per sample: {before_bytes:,} ({pre.dtype} prepared) -> uint8 image "
             f"{fig['request_bytes_after_median']:,} at the data's median size"
             + (f", {at_size:,} at the model's size ({before_bytes / at_size:.1f}x smaller)" if at_size else ""))
    if worst > config.tolerance:
        raise ValidationError(f"preprocessing in the graph differs from PIL + the original model by {worst:.3g} "
                              f"(scaled), past tolerance (--tolerance) {config.tolerance:g}, at {where}; nothing "
                              "was written", details=fig)
    if classify and len(changed) > config.max_top1_changes:
        raise ValidationError(f"top-1 changed on {len(changed)} of {n} images ({', '.join(changed[:3])}"
                              f"{', ...' if len(changed) > 3 else ''}), past --max-top1-changes "
                              f"{config.max_top1_changes}; nothing was written", details=fig)
    return fig


def _at_model_size(pre) -> int | None:

    size = produced_size(pre)
    return None if size is None else size[0] * size[1] * (1 if pre.color == "gray" else 3)


def _np_type(ort_type: str) -> np.dtype:
    name = ort_type.removeprefix("tensor(").removesuffix(")")
    return np.dtype({"float": "float32", "double": "float64"}.get(name, name))


def expected(heads, outs: dict[str, np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
    """numpy doing what the graph's post-processing does, on the model's own outputs (one sample); and the
    score each index is ranked by ([N, classes] or [1, anchors])."""
    d = heads.details
    if heads.kind == "classifier":
        x = outs[d["scores_output"]].astype(np.float64)
        if d["softmax"]:
            x = np.exp(x - x.max(axis=-1, keepdims=True))
            x = x / x.sum(axis=-1, keepdims=True)
        order = np.argsort(-x, axis=-1, kind="stable")[:, :d["k"]]
        return [np.take_along_axis(x, order, -1), order], x
    s = np.concatenate([outs[n] for n in d["score_outputs"]], axis=1)
    b = np.concatenate([outs[n] for n in d["box_outputs"]], axis=1)
    best = s.max(axis=2)[0]
    order = np.argsort(-best, kind="stable")[:d["max_detections"]]
    if d["score_threshold"] is not None:
        order = order[best[order] >= np.float32(d["score_threshold"])]
    return [s[:, order], b[:, order], order[None]], best[None]


def _check_post(heads, pre_sess, final_sess, pre_out, final_out, ctx) -> dict[str, Any]:
    names = [o.name for o in pre_sess.get_outputs()]
    new_names = [o.name for o in final_sess.get_outputs()]
    worst, moved, bytes_before, bytes_after = 0.0, 0, [], []
    for outs, got in zip(pre_out, final_out):
        by_name = dict(zip(names, outs))
        got_by = dict(zip(new_names, got))
        want, key = expected(heads, by_name)
        have = [got_by[n] for n in heads.outputs]
        bytes_before.append(sum(by_name[n].nbytes for n in heads.replaced))
        bytes_after.append(sum(h.nbytes for h in have))
        vals_w, vals_h = want[0], have[0]
        if vals_w.shape != vals_h.shape:
            raise ValidationError(f"post-processing gives {list(vals_h.shape)} where numpy gives "
                                  f"{list(vals_w.shape)}; nothing was written")
        idx_w, idx_h = want[-1 if heads.kind == "classifier" else 2], have[-1 if heads.kind == "classifier" else 2]
        if not np.array_equal(idx_w, idx_h):
            # equal scores (a saturated softmax's zeros) may come in either order: an index counts as moved when
            # the score numpy gives it differs from the one numpy ranks there
            at_h = np.take_along_axis(key, idx_h.astype(np.int64), -1)
            at_w = np.take_along_axis(key, idx_w.astype(np.int64), -1)
            moved += int((np.abs(at_h - at_w) > POST_TOLERANCE).sum())
        for w, h in zip(want, have):
            if w.dtype.kind == "f" and w.size:
                worst = max(worst, float(np.abs(w.astype(np.float64) - h.astype(np.float64)).max()))
    fig = {"kind": heads.kind, "outputs": heads.outputs, "replaced": heads.replaced, "max_abs_error": worst,
           "tolerance": POST_TOLERANCE, "indices_differing": moved,
           "response_bytes_before": int(np.median(bytes_before)), "response_bytes_after_median": int(
               np.median(bytes_after)), "response_bytes_after_max": int(max(bytes_after)), "samples": len(pre_out),
           **{k: v for k, v in heads.details.items() if k in ("k", "softmax", "levels", "max_detections",
                                                               "score_threshold")}}
    ctx.note(f"{heads.kind} post-processing vs numpy on the model's outputs ({len(pre_out)} samples): max "
             f"difference {worst:.3g} (tolerance {POST_TOLERANCE:g}), indices differing {moved}; response bytes per "
             f"sample {fig['response_bytes_before']:,} -> {fig['response_bytes_after_median']:,}"
             + (f" (median; max {fig['response_bytes_after_max']:,})" if heads.kind == "detector" else ""))
    if worst > POST_TOLERANCE or moved:
        raise ValidationError(f"post-processing in the graph differs from numpy on the same outputs (max "
                              f"{worst:.3g}, {moved} indices differ); nothing was written", details=fig)
    return fig
