"""optkit preprocess: the image preprocess spec as ONNX ops (uint8 images in) and top-k / detection
post-processing in the graph, checked against optkit's PIL path + the original model (#32 parts 1 and 2)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from conftest import no_result_files, one_error_line

DIGITS_SPEC = "{color: gray, resize: [8, 8], resample: bilinear, scale: 0.0039215686}"
LITE1_SPEC = "{resize: 272, resample: bicubic, center_crop: 240, mean: 127, std: 128, scale: 1}"


def _digit_folder(samples, dest, n=40):
    """n real digits as grey PNGs of several sizes (so the graph resizes them), with labels.csv."""
    from PIL import Image

    z = np.load(samples / "digits_eval_nchw.npz")
    dest.mkdir()
    rows = ["file,class_index"]
    for i in range(n):
        im = Image.fromarray(np.round(z["input"][i, 0] * 255).astype(np.uint8), "L")
        side = (8, 12, 16, 24)[i % 4]
        im.resize((side, side + (i % 3)), Image.BILINEAR).save(dest / f"d{i}.png")
        rows.append(f"d{i}.png,{int(z['labels'][i])}")
    (dest / "labels.csv").write_text("\n".join(rows) + "\n")
    return dest


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_digits_uint8_in_topk_out(cli, samples, tmp_path):
    """The sample CNN takes grey uint8 images of any size, answers top-3; every figure is what plain onnxruntime
    gives on the written file."""
    folder = _digit_folder(samples, tmp_path / "digits")
    out = tmp_path / "digits_u8.onnx"
    r = cli("preprocess", samples / "torch_cnn.onnx", "-o", out, "--preprocess", DIGITS_SPEC, "--top-k", "3",
            "--data", folder, "--json")
    assert r.rc == 0, r.err
    fig = json.loads(r.out)["stages"][1]["measurements"]["preprocess"]
    pre, post = fig["preprocess"], fig["postprocess"]
    assert pre["images"] == 40 and pre["max_scaled_error"] <= pre["tolerance"] == 0.05
    assert pre["top1_agreement"] >= 39 / 40 and abs(pre["top1_graph"] - pre["top1_pil"]) <= 1 / 40
    assert pre["request_bytes_before"] == 4 * 64 and pre["request_bytes_after_at_model_size"] == 64
    assert post["response_bytes_before"] == 40 and post["response_bytes_after_median"] == 3 * 4 + 3 * 8
    assert post["max_abs_error"] <= 1e-5 and post["indices_differing"] == 0

    m = onnx.load(out)
    meta = {p.key: json.loads(p.value) for p in m.metadata_props}
    assert meta["optkit.preprocess"] == {"input": "image", "outputs": ["input"], "spec": {
        "color": "gray", "resize": [8, 8], "scale": 0.0039215686}}
    assert meta["optkit.postprocess"]["outputs"] == ["scores", "indices"]
    ins = {i.name: i for i in m.graph.input}
    assert list(ins) == ["image"] and ins["image"].type.tensor_type.elem_type == TensorProto.UINT8
    # reproducible: plain onnxruntime on the written file against the PIL path + the original model
    from PIL import Image

    from optkit.measure.preprocess import parse_preprocess, prepare

    spec = parse_preprocess(meta["optkit.preprocess"]["spec"])
    ref, new = _session(samples / "torch_cnn.onnx"), _session(out)
    for name in ("d1.png", "d2.png", "d7.png"):
        im = Image.open(folder / name).convert("L")
        logits = ref.run(None, {"input": prepare(im, spec, name)[None]})[0][0]
        scores, idx = new.run(None, {"image": np.asarray(im)[None, :, :, None]})
        p = np.exp(logits - logits.max())
        p /= p.sum()
        assert list(idx[0]) == list(np.argsort(-p)[:3])
        np.testing.assert_allclose(scores[0], np.sort(p)[::-1][:3], atol=0.02)


def test_topk_alone_on_synthesized_inputs(cli, samples, tmp_path):
    out = tmp_path / "top.onnx"
    r = cli("preprocess", samples / "torch_cnn.onnx", "-o", out, "--top-k", "2", "--json")
    assert r.rc == 0, r.err
    post = json.loads(r.out)["stages"][1]["measurements"]["preprocess"]["postprocess"]
    assert post["k"] == 2 and post["softmax"] and post["response_bytes_after_median"] == 24
    assert [o.name for o in onnx.load(out).graph.output] == ["scores", "indices"]


def _tiny(tmp_path, name, in_shape, out_shape, op="Identity"):
    """A one-node model: Identity (image in, same out) or a MatMul to a [N,4] output."""
    inits = []
    if op == "MatMul":
        inits = [helper.make_tensor("w", TensorProto.FLOAT, [in_shape[-1], out_shape[-1]],
                                    np.ones(in_shape[-1] * out_shape[-1]).tolist())]
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
    else:
        node = helper.make_node("Identity", ["x"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    path = tmp_path / name
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


@pytest.mark.parametrize("case, args, says", [
    ("rgb spec, 1-channel model", ["--preprocess", "{resize: [8, 8]}"], "color rgb gives 3 channels"),
    ("dtype", ["--preprocess", "{color: gray, resize: [8, 8], dtype: float16}"], "dtype float16 does not fit"),
    ("crop size", ["--preprocess", "{color: gray, resize: 10, center_crop: 6}"], "takes height 8"),
    ("varying size", ["--preprocess", "{color: gray, resize: 8}"], "varying size"),
    ("bad spec", ["--preprocess", "{color: gray, std: 0}"], "std"),
    ("top-k past classes", ["--top-k", "11"], "more than the 10 classes"),
    ("detector flags on a classifier", ["--score-threshold", "0.5"], "no detector head"),
    ("nothing asked", [], "nothing to put in the graph"),
])
def test_bad_input_is_exit_2_one_line_nothing_written(cli, samples, tmp_path, case, args, says):
    r = cli("preprocess", samples / "torch_cnn.onnx", "-o", tmp_path / "out.onnx", *args)
    assert r.rc == 2, (case, r.err)
    assert says in one_error_line(r), (case, r.err)
    assert no_result_files(tmp_path) == []


def test_models_that_do_not_fit(cli, tmp_path):
    flat = _tiny(tmp_path, "flat.onnx", ["n", 16], ["n", 4], op="MatMul")
    image = _tiny(tmp_path, "image.onnx", ["n", 3, 8, 8], ["n", 3, 8, 8])
    before = no_result_files(tmp_path)
    r = cli("preprocess", flat, "-o", tmp_path / "a.onnx", "--preprocess", "{resize: [8, 8]}")
    assert r.rc == 2 and "no single image-like input" in one_error_line(r)
    r = cli("preprocess", image, "-o", tmp_path / "b.onnx", "--top-k", "3")
    assert r.rc == 2 and "no class-score output" in one_error_line(r)
    assert no_result_files(tmp_path) == before


def test_efficientnet_lite1_uint8_top1_and_bytes(cli, realcases, tmp_path):
    """EfficientNet-Lite1 with its preprocessing in the graph: uint8 images in, top-1 0.88 on imagenet100 (±1
    image) like the PIL path, 4x fewer request bytes at the model's size, top-5 out (60 bytes, not 4,000)."""
    out = tmp_path / "lite1_u8.onnx"
    r = cli("preprocess", realcases / "efficientnet_lite1.onnx", "-o", out, "--preprocess", LITE1_SPEC,
            "--top-k", "5", "--data", realcases / "imagenet100", "--json")
    assert r.rc == 0, r.err
    fig = json.loads(r.out)["stages"][1]["measurements"]["preprocess"]
    pre, post = fig["preprocess"], fig["postprocess"]
    assert pre["images"] == 100 and abs(pre["top1_graph"] - 0.88) <= 0.01 and pre["top1_pil"] == 0.88
    assert pre["max_scaled_error"] <= 0.01 and pre["top1_agreement"] >= 0.99
    assert pre["request_bytes_before"] == 691_200 and pre["request_bytes_after_at_model_size"] == 172_800
    assert post["response_bytes_before"] == 4000 and post["response_bytes_after_median"] == 60
    meta = {p.key: json.loads(p.value) for p in onnx.load(out, load_external_data=False).metadata_props}
    assert meta["optkit.preprocess"]["outputs"] == ["inputs"] and meta["optkit.preprocess"]["input"] == "image"
    # plain onnxruntime on the written file: the labelled top-1 the report states
    import csv

    from PIL import Image

    sess = _session(out)
    rows = list(csv.DictReader((realcases / "imagenet100" / "labels.csv").open()))
    right = 0
    for row in rows:
        im = np.asarray(Image.open(realcases / "imagenet100" / row["file"]).convert("RGB"))[None]
        right += int(sess.run(["indices"], {"image": im})[0][0, 0]) == int(row["imagenet_index"])
    assert right / len(rows) == pre["top1_graph"]


def test_detector_threshold_and_top_k(cli, realcases, tmp_path):
    """PicoDet (layout_cdla): 8 per-level outputs (1.7 MB) become the best anchors above a threshold."""
    out = tmp_path / "layout.onnx"
    r = cli("preprocess", realcases / "layout_cdla.onnx", "-o", out, "--score-threshold", "0.3",
            "--max-detections", "50", "--check-samples", "2", "--json")
    assert r.rc == 0, r.err
    post = json.loads(r.out)["stages"][1]["measurements"]["preprocess"]["postprocess"]
    assert post["levels"] == [7600, 1900, 475, 130] and post["response_bytes_before"] == 1_697_640
    assert post["response_bytes_after_max"] <= 50 * (10 * 4 + 32 * 4 + 8)
    assert post["max_abs_error"] == 0 and post["indices_differing"] == 0
    assert [o.name for o in onnx.load(out).graph.output] == ["det_scores", "det_boxes", "det_anchors"]
