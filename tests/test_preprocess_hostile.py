"""optkit preprocess on careless and hostile input: a model that has pre/post-processing in its graph already,
k past any int64 or past the classes a dynamic output has at run time. Exit 2, one line, nothing written."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conftest import one_error_line

SPEC = "{color: gray, resize: 8, center_crop: 8}"


def _dynamic_classes(path):
    """x [batch,3,8,8] -> logits [batch, classes]: 10 classes in fact, a symbolic dim as declared."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((3, 10)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("GlobalAveragePool", ["x"], ["g"]),
                           helper.make_node("Flatten", ["g"], ["f"]),
                           helper.make_node("MatMul", ["f", "w"], ["logits"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "classes"])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def test_preprocessing_twice_is_refused(cli, samples, tmp_path):
    """A second --preprocess would resize and normalize what the first already did; a second --top-k would softmax
    the kept scores and index into the kept rows (silently wrong): both exit 2 naming the metadata."""
    once = tmp_path / "once.onnx"
    r = cli("preprocess", samples / "torch_cnn.onnx", "-o", once, "--preprocess", SPEC, "--top-k", "3")
    assert r.rc == 0, r.err
    for args, flag in ((["--top-k", "2"], "optkit.postprocess"),
                       (["--preprocess", "{color: gray, resize: [8, 8], layout: nhwc, dtype: uint8, scale: 1}"],
                        "optkit.preprocess")):
        out = tmp_path / "twice.onnx"
        r = cli("preprocess", once, "-o", out, *args)
        line = one_error_line(r)
        assert r.rc == 2 and flag in line and "already" in line, r.err
        assert not out.exists()
    # preprocessing then, in a second run, top-k: each once, both records kept
    pre = tmp_path / "pre.onnx"
    assert cli("preprocess", samples / "torch_cnn.onnx", "-o", pre, "--preprocess", SPEC).rc == 0
    both = tmp_path / "both.onnx"
    r = cli("preprocess", pre, "-o", both, "--top-k", "2")
    assert r.rc == 0, r.err
    assert {p.key for p in onnx.load(str(both)).metadata_props} >= {"optkit.preprocess", "optkit.postprocess"}


def test_k_past_int64_or_past_the_classes_is_one_line(cli, tmp_path):
    model = _dynamic_classes(tmp_path / "dyn.onnx")
    out = tmp_path / "out.onnx"
    r = cli("preprocess", model, "-o", out, "--top-k", str(2**70))
    assert r.rc == 2 and "--top-k" in one_error_line(r) and "internal error" not in r.err, r.err
    r = cli("preprocess", model, "-o", out, "--top-k", "50")   # the output's classes are symbolic; 10 at run time
    line = one_error_line(r)
    assert r.rc == 2 and "--top-k 50" in line and "optkit-preprocess-" not in line, r.err
    assert not out.exists()
    r = cli("preprocess", model, "-o", out, "--top-k", "10")
    assert r.rc == 0, r.err


def test_the_largest_resize_is_checked_on_images_that_fit_in_memory():
    """resize 8192 is a valid spec; the check synthesized images up to 3.1x that a side (25,395 x 18,842 x 3,
    1.4 GB each, six held at once) and the process was killed for memory (exit 137, no line)."""
    from optkit.measure.preprocess import parse_preprocess
    from optkit.passes.preprocess.check import MAX_PIXELS, _sizes

    for spec in ({"resize": 8192, "center_crop": 16}, {"resize": [8192, 8192]}, {"resize": 224}):
        sizes = _sizes(parse_preprocess(spec, "--preprocess"))
        assert all(h * w <= MAX_PIXELS for h, w in sizes), sizes
        assert len(set(sizes)) == len(sizes)  # still shrinking, enlarging and several aspects
    assert (314, 426) in _sizes(parse_preprocess({"resize": 224}, "--preprocess"))  # small specs unchanged
