"""Post-processing flags bounded by the head they follow (issue 39, W7): a --score-threshold outside the range of
the class scores (0..1 out of a Sigmoid or Softmax) would write a detector that never (or always) detects, and
--max-detections past the head's anchors or --top-k past the classes keeps nothing it asked for: exit 2, one line,
nothing written, from the command, a recipe stage and the Python API alike. Where the range is unknown (the scores
scaled after the Sigmoid) any finite threshold is taken."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import optkit
from optkit.core.errors import UsageError

from conftest import no_result_files, one_error_line

ANCHORS, CLASSES = 16, 3


def detector(path, scale_after: float | None = None):
    """A one-level dense detector: float [1,3,16,16] -> class scores [1,16,3] out of a Sigmoid (times
    `scale_after` when given) and box rows [1,16,4]."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (CLASSES, 3, 4, 4)).astype(np.float32), "wc"),
             numpy_helper.from_array(rng.normal(0, 0.5, (4, 3, 4, 4)).astype(np.float32), "wb"),
             numpy_helper.from_array(np.array([1, -1, ANCHORS], np.int64), "flat"),
             numpy_helper.from_array(np.array([100.0], np.float32), "hundred")]
    nodes = [helper.make_node("Conv", ["x", "wc"], ["c"], strides=[4, 4]),
             helper.make_node("Conv", ["x", "wb"], ["b"], strides=[4, 4]),
             helper.make_node("Reshape", ["c", "flat"], ["c2"]), helper.make_node("Reshape", ["b", "flat"], ["b2"]),
             helper.make_node("Transpose", ["c2"], ["c3"], perm=[0, 2, 1]),
             helper.make_node("Transpose", ["b2"], ["boxes"], perm=[0, 2, 1]),
             helper.make_node("Sigmoid", ["c3"], ["scores" if scale_after is None else "sig"])]
    if scale_after is not None:
        nodes.append(helper.make_node("Mul", ["sig", "hundred"], ["scores"]))
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "det", [vi("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [vi("scores", TensorProto.FLOAT, [1, ANCHORS, CLASSES]),
                           vi("boxes", TensorProto.FLOAT, [1, ANCHORS, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


BAD = [
    (["--score-threshold", "1.5"], "--score-threshold 1.5 is outside 0..1, the range of the class scores (scores, "
                                   "out of a Sigmoid/Softmax): no anchor would ever be kept"),
    (["--score-threshold", "-1"], "--score-threshold -1 is outside 0..1"),
    (["--score-threshold", "1.0000001"], "no anchor would ever be kept"),
    (["--score-threshold", "-1e-9"], "every anchor would be kept"),
    (["--score-threshold", "nan"], "not a finite number"),
    (["--score-threshold", "inf"], "not a finite number"),
    (["--max-detections", "17"], f"--max-detections 17 is more than the {ANCHORS} anchors"),
    (["--score-threshold", "0.5", "--max-detections", "100"], f"more than the {ANCHORS} anchors"),
]


@pytest.mark.parametrize("args, says", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_flag_past_the_head_is_exit_2_from_the_command(cli, tmp_path, args, says):
    model = detector(tmp_path / "det.onnx")
    (tmp_path / "out").mkdir()
    r = cli("preprocess", model, "-o", tmp_path / "out" / "det_post.onnx", *args)
    assert r.rc == 2, r.err
    assert says in one_error_line(r)
    assert no_result_files(tmp_path / "out") == []


def test_a_recipe_stage_and_the_python_api_refuse_the_same(cli, tmp_path):
    model = detector(tmp_path / "det.onnx")
    (tmp_path / "r.yaml").write_text(f"version: 1\nmodel: {{path: {model}}}\nstages:\n  - pass: preprocess.onnx\n"
                                     "    config: {score_threshold: 1.5}\n")
    r = cli("run", tmp_path / "r.yaml", "--workspace", tmp_path / "ws")
    assert r.rc == 2 and "--score-threshold 1.5 is outside 0..1" in one_error_line(r), r.err
    with pytest.raises(UsageError, match="outside 0..1"):
        optkit.run_pass("preprocess.onnx", model, tmp_path / "api.onnx", score_threshold=-0.5)
    with pytest.raises(UsageError, match="more than the 16 anchors"):
        optkit.run_pass("preprocess.onnx", model, tmp_path / "api.onnx", max_detections=40)
    assert not (tmp_path / "api.onnx").exists()


@pytest.mark.parametrize("model, args", [("sigmoid", ["--score-threshold", "0"]),
                                         ("sigmoid", ["--score-threshold", "1", "--max-detections", "16"]),
                                         ("sigmoid", ["--score-threshold", "0.5"]),  # 100 by default: all 16 kept
                                         ("scaled", ["--score-threshold", "50"])],
                         ids=["0", "1 with every anchor", "default max", "scaled scores: range unknown"])
def test_thresholds_inside_the_range_are_taken(cli, tmp_path, model, args):
    path = detector(tmp_path / "det.onnx", scale_after=100.0 if model == "scaled" else None)
    r = cli("preprocess", path, "-o", tmp_path / "det_post.onnx", *args, "--check-samples", "2")
    assert r.rc == 0, r.err
    assert [o.name for o in onnx.load(tmp_path / "det_post.onnx").graph.output] == [
        "det_scores", "det_boxes", "det_anchors"]
