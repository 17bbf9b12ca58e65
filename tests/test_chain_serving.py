"""The #32 chain end to end, as a user runs it, on the sample digits CNN (no ../shared needed):
`optkit preprocess` (uint8 grey images of any size in, top-3 out) -> `optkit split` (auto cut) -> `optkit package
--to triton` (an ensemble of the parts) -> a real tritonserver (tests/_triton.py) answering uint8 images like the
original model answers the same images prepared by optkit's PIL path (within the preprocess pass's tolerance)."""
from __future__ import annotations

import hashlib
import json

import _triton
import numpy as np
import onnxruntime as ort
import pytest

from conftest import SAMPLES, no_result_files, one_error_line, run_cli

SPEC = "{color: gray, resize: [8, 8], resample: bilinear, scale: 0.0039215686}"
SIZES = [(8, 8), (12, 12), (16, 13), (24, 20), (11, 30)]   # at, above and off the model's 8x8: the graph resizes


def _images() -> list[np.ndarray]:
    """Real digits (the sample eval set) as uint8 grey images of several sizes, as a client would have them."""
    from PIL import Image

    x = np.load(SAMPLES / "digits_eval_nchw.npz")["input"]
    out = []
    for i, (h, w) in enumerate(SIZES):
        im = Image.fromarray(np.round(x[i, 0] * 255).astype(np.uint8), "L").resize((w, h), Image.BILINEAR)
        out.append(np.asarray(im, dtype=np.uint8))
    return out


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    _triton.skip_unless_tool()
    tmp = tmp_path_factory.mktemp("chain")
    model = tmp / "digits_u8.onnx"
    r = run_cli("preprocess", SAMPLES / "torch_cnn.onnx", "-o", model, "--preprocess", SPEC, "--top-k", "3", "--json")
    assert r.rc == 0, r.err
    r = run_cli("split", model, "-o", tmp / "split", "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    r = run_cli("package", tmp / "split", "--to", "triton", "-o", tmp / "repo", "--name", "digits",
                "--shape", "image=1x16x12x1", "--json")
    assert r.rc == 0, r.err
    proof = _triton.proof_repository(tmp / "repo", tmp / "proof")
    with _triton.tritonserver(proof, tmp, start_timeout=90) as (url, _):
        assert url, _triton.log_tail(tmp)
        yield url, tmp, model, doc


def test_split_of_preprocessed_model_states_cut_and_hashes(chain):
    _, tmp, _, doc = chain
    assert doc["schema"] == 3 and [p["name"] for p in doc["parts"]] == ["pre", "core"]
    for p in doc["parts"]:
        assert p["sha256"] == hashlib.sha256((tmp / "split" / p["file"]).read_bytes()).hexdigest()
    # the auto cut resizes on the CPU: the 8x8 uint8 image crosses (64 B), not the float tensor (256 B)
    (cut,) = doc["cuts"]
    assert (cut["from"], cut["to"], cut["bytes_per_sample"]) == ("pre", "core", 64)
    assert doc["preprocess_boundary_bytes_per_sample"] == 256
    lin = json.loads((tmp / "repo" / "digits" / "1" / "optkit-package.json").read_text())
    assert lin["split"]["kind"] == "split" and [p["sha256"] for p in lin["split"]["parts"]] == [
        p["sha256"] for p in doc["parts"]]


def test_tritonserver_answers_uint8_images_like_the_original_on_pil_images(chain):
    from PIL import Image

    from optkit.measure.preprocess import parse_preprocess, prepare

    url, _, model, _ = chain
    import onnx

    meta = {m.key: json.loads(m.value) for m in onnx.load(str(model), load_external_data=False).metadata_props}
    spec = parse_preprocess(meta["optkit.preprocess"]["spec"])
    original = ort.InferenceSession(str(SAMPLES / "torch_cnn.onnx"), providers=["CPUExecutionProvider"])
    graph = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for image in _images():
        out = _triton.infer(url, "digits", {"image": image[None, :, :, None]})
        scores = np.array(out["scores"][2], np.float32).reshape(out["scores"][1])[0]
        indices = np.array(out["indices"][2], np.int64).reshape(out["indices"][1])[0]
        # the server runs the parts of the written model: its answer is that model's, to float noise
        want_scores, want_idx = graph.run(None, {"image": image[None, :, :, None]})
        np.testing.assert_allclose(scores, want_scores[0], rtol=1e-5, atol=1e-6)
        assert list(indices) == list(want_idx[0])
        # and that is the original model's on optkit's PIL preprocessing, within the preprocess tolerance
        logits = original.run(None, {"input": prepare(Image.fromarray(image, "L"), spec, "x")[None]})[0][0]
        p = np.exp(logits - logits.max())
        p /= p.sum()
        assert indices[0] == int(np.argmax(p)), image.shape
        np.testing.assert_allclose(scores, p[indices], atol=0.05)


def test_cut_at_preprocess_needs_the_metadata(tmp_path):
    r = run_cli("split", SAMPLES / "torch_cnn.onnx", "-o", tmp_path / "out", "--cut", "preprocess")
    assert r.rc == 2 and "no optkit.preprocess metadata" in one_error_line(r)
    assert no_result_files(tmp_path) == []
