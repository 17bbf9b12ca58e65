"""The graph `optkit preprocess` writes carries its own bound (issue 39, W1): a shorter-side resize + crop works on
the crop, never on the whole resized image; its pixels are PIL's (enlarging; nearest always) or those of a Resize of
the whole image (shrinking); an image past 64M pixels as sent or once resized, or smaller than the crop, fails in
the graph with the reason in the runtime's message; and served by tritonserver a 1 x W request neither grows the
server's memory nor stops it."""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from _bounded import SPEC, group_memory, image_model
from onnx import TensorProto, helper
from PIL import Image

from optkit.measure.preprocess import parse_preprocess, prepare


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _photo(rng, h, w, gray=False):
    """Smooth content with edges and noise (where filters differ), uint8 [h, w, 3] or [h, w]."""
    small = rng.integers(0, 256, (max(2, h // 4), max(2, w // 4), 3), dtype=np.uint8)
    a = np.asarray(Image.fromarray(small).resize((w, h), Image.BILINEAR)).astype(np.int16)
    a = np.clip(a + rng.integers(-20, 21, a.shape), 0, 255).astype(np.uint8)
    return np.asarray(Image.fromarray(a).convert("L")) if gray else a


# (resize, crop): sizes around each, odd and even, every aspect ratio from 1:12 to 12:1, shrinking and enlarging
SIZES = [(h, w) for h in (1, 2, 3, 5, 8, 11, 12, 13, 14, 19, 26, 40, 61) for w in (1, 4, 9, 13, 17, 30, 47, 101)]


@pytest.mark.parametrize("resample", ["bilinear", "bicubic", "nearest"])
@pytest.mark.parametrize("gray", [False, True], ids=["rgb", "gray"])
def test_crop_pixels_are_pils_enlarging_and_the_resizes_shrinking(cli, tmp_path, resample, gray):
    """Through the real command, on 104 image sizes: enlarging, every pixel is PIL's (bilinear, bicubic, nearest);
    shrinking, every pixel is onnxruntime's Resize of the whole image then the crop (nearest: PIL's); in a batch of
    2, each image's own."""
    spec = f"{{resize: 13, center_crop: 11, resample: {resample}, scale: 1{', color: gray' if gray else ''}}}"
    out = tmp_path / "pre.onnx"
    r = cli("preprocess", _model(tmp_path, 11, 11, 1 if gray else 3), "-o", out, "--preprocess", spec)
    assert r.rc == 0, r.err
    pre, sess = parse_preprocess(json.loads(onnx.load(out).metadata_props[0].value)["spec"]), _session(out)
    whole = _whole_resize(resample, 1 if gray else 3)

    def expected(a: np.ndarray) -> np.ndarray:
        if min(a.shape[:2]) < 13 or resample == "nearest":  # enlarging (or nearest): PIL's pixels
            return prepare(Image.fromarray(a), pre, "image")
        x = (a[:, :, None] if gray else a)[None]  # shrinking: Resize of the whole image, then the crop
        return whole.run(None, {"image": x})[0][0].transpose(2, 0, 1).astype(np.float32)

    rng = np.random.default_rng(0)
    differ = 0
    for h, w in SIZES:
        a = _photo(rng, h, w, gray)
        b = np.ascontiguousarray(a[::-1, ::-1])
        got = sess.run(None, {"image": np.stack([a, b])[..., None] if gray else np.stack([a, b])})[0]
        differ += int((got[0] != expected(a)).sum()) + int((got[1] != expected(b)).sum())
    assert differ == 0


def _model(tmp_path, h, w, channels: int = 3, name: str = "id.onnx"):
    """float [batch,C,h,w] -> the same (the written model's output is the preprocessed image itself); h None: any
    size, reduced to its mean."""
    vi = helper.make_tensor_value_info
    if h is None:
        node, shape, out = (helper.make_node("ReduceMean", ["input"], ["out"], keepdims=0),
                            ["batch", channels, "h", "w"], [])
    else:
        node, shape = helper.make_node("Identity", ["input"], ["out"]), ["batch", channels, h, w]
        out = shape
    g = helper.make_graph([node], "m", [vi("input", TensorProto.FLOAT, shape)], [vi("out", TensorProto.FLOAT, out)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / name))
    return tmp_path / name


def _whole_resize(resample: str, channels: int):
    """The graph before the bound: Resize of the whole image to the shorter side's sizes (13), then the crop 11."""
    from optkit.passes.preprocess import resize as rz
    from optkit.passes.preprocess.graph import Builder

    b = Builder(set())
    sizes = rz._shorter_side(b, b.op("Shape", ["image"], start=1, end=3), 13)
    y = b.op("Resize", ["image", "", "", sizes], axes=[1, 2], **rz.RESAMPLE[resample])
    start = b.op("Div", [b.op("Sub", [b.op("Shape", [y], start=1, end=3), b.const([11, 11], np.int64)]),
                         b.const([2, 2], np.int64)])
    b.op("Identity", [rz._slice(b, y, start, (11, 11))], out=["out"])
    vi = helper.make_tensor_value_info
    g = helper.make_graph(b.nodes, "whole", [vi("image", TensorProto.UINT8, [1, None, None, channels])],
                          [vi("out", TensorProto.UINT8, [1, 11, 11, channels])], b.inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("spec, model, shape, says", [
    ("{resize: 13, center_crop: 11}", (11, 11), (1, 1, 500_000, 3), "image larger than 64M pixels (67108864) after resize"),
    ("{resize: 13, center_crop: 11, resample: nearest}", (11, 11), (1, 1, 6_000_000, 3), "after resize"),
    ("{resize: 13}", (None, None), (1, 1, 6_000_000, 3), "after resize"),
    ("{resize: [11, 11], color: gray}", (11, 11), (1, 8193, 8192, 1), "image larger than 64M pixels (67108864) as sent"),
    ("{center_crop: 11}", (None, None), (1, 10, 40, 3), "image smaller than center_crop; send a larger image"),
    ("{color: gray}", (None, None), (1, 8193, 8192, 1), "image larger than 64M pixels (67108864) as sent"),
    ("{resize: 11, center_crop: [11, 13]}", (11, 13), (1, 11, 11, 3), "image smaller than center_crop after resize"),
], ids=["enlarge", "nearest", "no crop", "fixed size", "crop alone", "neither", "crop past the resize"])
def test_past_the_bound_the_graph_fails_saying_why(cli, tmp_path, spec, model, shape, says):
    """Every branch (shorter side with a crop, bilinear and nearest; without a crop; a fixed size; a crop alone; no
    resize or crop into a model of any size) refuses in the graph, before any large tensor: the runtime's error names the reason (the node that fails is
    named for it)."""
    out = tmp_path / "pre.onnx"
    data = []
    if "[11, 13]" in spec:  # checked on landscape images (the crop fits), then sent a square one
        (tmp_path / "data" / "a").mkdir(parents=True)
        Image.fromarray(_photo(np.random.default_rng(0), 11, 30)).save(tmp_path / "data" / "a" / "wide.png")
        data = ["--data", tmp_path / "data"]
    r = cli("preprocess", _model(tmp_path, *model, shape[-1]), "-o", out, "--preprocess", spec, "--check-samples", "2",
            *data)
    assert r.rc == 0, r.err
    with pytest.raises(Exception, match=r"Reshape node.*" + re.escape(says)):
        _session(out).run(None, {"image": np.zeros(shape, np.uint8)})


# ------------------------------------------------------------------ served by the real tritonserver

def _infer(url: str, image: np.ndarray):
    body = {"inputs": [{"name": "image", "shape": list(image.shape), "datatype": "UINT8",
                        "data": image.ravel().tolist()}]}
    req = urllib.request.Request(f"{url}/v2/models/m/infer", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.loads(r.read())["outputs"][0]
    return np.array(out["data"], np.float32).reshape(out["shape"])


def test_served_a_thin_request_neither_grows_the_server_nor_stops_it(cli, tmp_path):
    """EfficientNet-Lite1's spec in front of a model of its input size, packaged (pre + core ensemble) and served by
    tritonserver: a 1x900 request (272 x 244,800 pixels once resized: 200 MB before the bound) is answered as
    onnxruntime answers on the written file, with the server's peak memory unchanged; a 1x6000 one fails with the
    reason; a photo is answered afterwards."""
    import _triton

    _triton.skip_unless_tool()
    u8 = tmp_path / "m_u8.onnx"
    assert cli("preprocess", image_model(tmp_path / "m.onnx"), "-o", u8, "--preprocess", SPEC).rc == 0
    r = cli("package", u8, "--to", "triton", "-o", tmp_path / "repo", "--name", "m", "--shape", "image=1x240x240x3")
    assert r.rc == 0, r.err
    proof = _triton.proof_repository(tmp_path / "repo", tmp_path / "proof")
    rng = np.random.default_rng(0)
    photo = rng.integers(0, 256, (1, 375, 500, 3), dtype=np.uint8)
    thin = rng.integers(0, 256, (1, 1, 900, 3), dtype=np.uint8)
    local = _session(u8)
    with _triton.tritonserver(proof, tmp_path / "work", start_timeout=120) as (url, proc):
        assert url, _triton.log_tail(tmp_path / "work")
        np.testing.assert_allclose(_infer(url, photo), local.run(None, {"image": photo})[0], rtol=1e-5, atol=1e-5)
        before = max(h for _, h in group_memory(proc.pid).values())
        np.testing.assert_allclose(_infer(url, thin), local.run(None, {"image": thin})[0], rtol=1e-5, atol=1e-5)
        grew = max(h for _, h in group_memory(proc.pid).values()) - before
        assert grew < 32 * 2**20, f"the server's peak RSS grew {grew / 2**20:.0f} MiB on a 2,700-byte request"
        with pytest.raises(urllib.error.HTTPError) as e:
            _infer(url, rng.integers(0, 256, (1, 1, 6000, 3), dtype=np.uint8))
        assert "image larger than 64M pixels (67108864) after resize" in e.value.read().decode()
        assert proc.poll() is None
        np.testing.assert_allclose(_infer(url, photo), local.run(None, {"image": photo})[0], rtol=1e-5, atol=1e-5)
