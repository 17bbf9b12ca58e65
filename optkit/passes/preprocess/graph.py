"""The ONNX wiring of `preprocess.onnx`: a preprocess spec (optkit.measure.preprocess.Preprocess) as ONNX ops in
front of a model's image input, and post-processing (classifier top-k, detector threshold + top-k) behind its
outputs. Pure graph edits on an onnx.ModelProto; the checks live in the pass (optkit.passes.preprocess)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optkit.core.errors import UsageError
from optkit.measure.preprocess import Preprocess, pair
from optkit.passes.preprocess.resize import resize_and_crop

P = "optkit_preprocess/"   # every node and tensor this module adds is named under this prefix
MIN_OPSET = 18             # Resize's antialias (PIL's filters when shrinking) and axes
ELEM = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7, "float16": 10,
        "float64": 11}
NAME_OF = {v: k for k, v in ELEM.items()}


def dims(value_info) -> list[Any]:
    """A value's dims: ints where fixed, the dim's name (or None) where not."""
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return []
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]


def shown(ds: list[Any]) -> str:
    return "[" + ",".join(str(d) if d is not None else "?" for d in ds) + "]"


@dataclass
class ImageInput:
    """The model's image input as the spec reads it."""

    name: str
    elem: int             # ONNX element type
    shape: list[Any]      # its dims
    layout: str           # nchw / nhwc
    channels: int
    size: tuple[int, int] | None   # fixed (height, width) the spec produces, None when it varies per image


def image_input(model, pre: Preprocess) -> ImageInput:
    """The one input the spec feeds, checked against the spec: one rank-4 input, its channel count, dtype and
    fixed size. A misfit is a UsageError naming the spec key to change."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    if len(inputs) != 1 or len(dims(inputs[0])) != 4 or inputs[0].type.tensor_type.elem_type not in NAME_OF:
        listed = ", ".join(f"{i.name!r} {shown(dims(i))}" for i in inputs) or "none"
        raise UsageError(f"the model has no single image-like input (one rank-4 [N,C,H,W] or [N,H,W,C] tensor; it "
                         f"has {listed}); preprocessing goes in front of a model with one image input")
    inp = inputs[0]
    shape = dims(inp)
    channels = 1 if pre.color == "gray" else 3
    axis = 1 if pre.layout == "nchw" else 3
    have = shape[axis]
    if isinstance(have, int) and have != channels:
        other = 3 if pre.layout == "nchw" else 1
        hint = (f"; the model takes {have} channels: set color {'gray' if have == 1 else 'rgb'}" if have in (1, 3)
                else "")
        if isinstance(shape[other], int) and shape[other] == channels:
            hint = f"; its axis {other} has {channels}: set layout {'nhwc' if pre.layout == 'nchw' else 'nchw'}"
        raise UsageError(f"--preprocess color {pre.color} gives {channels} channel{'s' if channels > 1 else ''} "
                         f"but input {inp.name!r} {shown(shape)} has {have} at axis {axis} (layout {pre.layout})"
                         + hint)
    elem = inp.type.tensor_type.elem_type
    model_dtype = NAME_OF[elem]
    if pre.dtype != model_dtype and not (pre.dtype == "float32" and model_dtype in ("float16", "float64")
                                         and "dtype" not in pre.model_fields_set):
        raise UsageError(f"--preprocess dtype {pre.dtype} does not fit input {inp.name!r}, which takes "
                         f"{model_dtype}; give dtype: {model_dtype}")
    size = produced_size(pre)
    hw = shape[2:4] if pre.layout == "nchw" else shape[1:3]
    fixed = [d if isinstance(d, int) else None for d in hw]
    if any(d is not None for d in fixed):
        if size is None:
            raise UsageError(f"--preprocess gives images of varying size but input {inp.name!r} {shown(shape)} "
                             f"takes {shown(hw)} (height, width); add center_crop (or resize [height, width])")
        for got, want, what in zip(size, fixed, ("height", "width")):
            if want is not None and got != want:
                key = "center_crop" if pre.center_crop is not None else "resize"
                raise UsageError(f"--preprocess {key} gives {size[0]}x{size[1]} (height x width) but input "
                                 f"{inp.name!r} {shown(shape)} takes {what} {want}; give {key} "
                                 f"{want if fixed[0] == fixed[1] else list(fixed)}")
    return ImageInput(inp.name, elem, shape, pre.layout, channels, size)


def produced_size(pre: Preprocess) -> tuple[int, int] | None:
    """The (height, width) every image has after the spec's resize and crop; None when it varies per image."""
    if pre.center_crop is not None:
        return pair(pre.center_crop)
    if pre.resize is not None and not isinstance(pre.resize, int):
        return pair(pre.resize)
    return None


class Builder:
    """Nodes and initializers under the prefix P, appended to a graph at the end; `branch()` gives a builder for
    an If's subgraph (its own nodes; names and initializers shared with the main graph)."""

    prefix = P

    def __init__(self, taken: set[str]):
        self.nodes, self.inits, self.taken, self.n = [], [], set(taken), 0

    def name(self, base: str) -> str:
        self.n += 1
        out = f"{P}{base}_{self.n}"
        while out in self.taken:
            self.n += 1
            out = f"{P}{base}_{self.n}"
        self.taken.add(out)
        return out

    def const(self, value, dtype, base: str = "c") -> str:
        from onnx import numpy_helper

        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, out: list[str] | None = None,
           name: str | None = None, **attrs) -> Any:
        from onnx import helper

        outs = out or [self.name(op_type.lower()) for _ in range(n_out)]
        if op_type == "Split":
            attrs.setdefault("num_outputs", n_out)
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name or self.name(op_type), **attrs))
        return outs[0] if n_out == 1 else outs

    def branch(self) -> Builder:
        sub = Builder(set())
        sub.taken, sub.inits = self.taken, self.inits  # one name space: the loop in name() keeps names unique
        return sub

    def graph(self, name: str, output: str, elem: int, shape: list) -> Any:
        from onnx import helper

        return helper.make_graph(self.nodes, f"{P}{name}", [], [helper.make_tensor_value_info(output, elem, shape)])


def all_names(model) -> set[str]:
    g = model.graph
    names = {i.name for i in g.input} | {o.name for o in g.output} | {i.name for i in g.initializer}
    for n in g.node:
        names.update(n.input)
        names.update(n.output)
        names.add(n.name)
    return names


def opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def upgrade_opset(model, target: int = MIN_OPSET):
    """The model at default-domain opset >= `target` (onnx's version converter where it is lower), IR >= 8 at
    opset 18 and later."""
    from onnx import version_converter

    current = opset(model)
    if current < target:
        model = version_converter.convert_version(model, target)
    # IR 4 lets the added initializers be no graph inputs; opset 18 needs IR 8
    model.ir_version = max(model.ir_version, 8 if target >= 18 else 4)
    return model, current


def add_preprocess(model, pre: Preprocess, new_input: str | None) -> tuple[Any, dict[str, Any]]:
    """`model` with `pre` as ONNX ops in front of its image input; the new input `new_input` is uint8
    [N,H,W,C] (C: 3 RGB, 1 for color gray), H and W symbolic unless the spec has no resize and the model's
    size is fixed. Returns (model, the metadata record optkit.preprocess)."""
    from onnx import TensorProto, helper

    img = image_input(model, pre)
    taken = all_names(model)
    if new_input is None:  # "image", or "image_uint8" where the model uses "image" already
        new_input = "image" if "image" not in taken else _free(model, "image_uint8")
    elif new_input in taken:
        raise UsageError(f"--input-name {new_input!r} is already a name in the model; give another")
    b = Builder(taken)
    batch = img.shape[0] if img.shape[0] is not None else "batch"
    hw: list[Any] = ["height", "width"]
    if pre.resize is None and pre.center_crop is None:  # nothing resizes or crops: images come at the model's size
        model_hw = img.shape[2:4] if img.layout == "nchw" else img.shape[1:3]
        hw = [d if isinstance(d, int) else name for d, name in zip(model_hw, hw)]
    x = resize_and_crop(b, new_input, pre, symbolic=any(isinstance(d, str) for d in hw))
    x = b.op("Cast", [x], to=TensorProto.FLOAT)
    if pre.scale != 1:
        x = b.op("Mul", [x, b.const(pre.scale, np.float32, "scale")])
    if pre.color == "bgr":
        x = b.op("Gather", [x, b.const([2, 1, 0], np.int64, "bgr")], axis=3)
    if pre.mean is not None:
        x = b.op("Sub", [x, b.const(pre.mean, np.float32, "mean")])
    if pre.std is not None:
        x = b.op("Div", [x, b.const(pre.std, np.float32, "std")])
    if pre.layout == "nchw":
        x = b.op("Transpose", [x], perm=[0, 3, 1, 2])
    if img.elem != TensorProto.FLOAT:
        x = b.op("Cast", [x], to=img.elem)
    # the last node writes the model's old input name: the model's own nodes read it unchanged
    last = b.nodes[-1] if b.nodes else None
    if last is None:
        raise UsageError("--preprocess does nothing the model's input needs (no resize, crop, scale or layout)")
    last.output[0] = img.name
    g = model.graph
    kept = [i for i in g.input if i.name != img.name]
    # the boundary keeps the old input's declared type and shape ([batch,3,240,240]): shape inference cannot see
    # through the computed resize and crop sizes, and `optkit split` / `optkit package` give a cut tensor the
    # shape inference finds (unknown dims would make the core a model of any shape, with nothing to tune at)
    declared = next(i for i in g.input if i.name == img.name)
    boundary = helper.make_tensor_value_info(img.name, declared.type.tensor_type.elem_type, None)
    boundary.type.CopyFrom(declared.type)
    g.value_info.append(boundary)
    del g.input[:]
    g.input.extend([helper.make_tensor_value_info(new_input, TensorProto.UINT8, [batch, *hw, img.channels])] + kept)
    nodes = list(b.nodes) + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(b.inits)
    record = {"input": new_input, "outputs": [img.name],
              "spec": pre.model_dump(mode="json", exclude_defaults=True)}
    return model, record


@dataclass
class Heads:
    """What post-processing replaced: the outputs before, the outputs now, and how."""

    kind: str                       # "classifier" or "detector"
    replaced: list[str]
    outputs: list[str]
    details: dict[str, Any] = field(default_factory=dict)


def float_outputs(model) -> list[Any]:
    return [o for o in model.graph.output if o.type.tensor_type.elem_type in (1, 10, 11)]


def producer(model, name: str):
    return next((n for n in model.graph.node if name in n.output), None)


def class_scores_output(model, named: str | None) -> Any:
    """The classifier's [N, classes] output: `named`, or the only rank-2 float output with a class axis."""
    outs = {o.name: o for o in model.graph.output}
    if named is not None:
        if named not in outs:
            raise UsageError(f"--scores-output {named!r} is not an output of the model (outputs: "
                             f"{', '.join(outs)})")
        o = outs[named]
        if len(dims(o)) != 2 or o.type.tensor_type.elem_type not in (1, 10, 11):
            raise UsageError(f"--scores-output {named!r} {shown(dims(o))} is not a float [N, classes] output")
        return o
    cands = [o for o in float_outputs(model) if len(dims(o)) == 2 and not (isinstance(dims(o)[1], int)
                                                                         and dims(o)[1] < 2)]
    if not cands:
        listed = ", ".join(f"{o.name!r} {shown(dims(o))}" for o in model.graph.output)
        raise UsageError(f"--top-k: the model has no class-score output (a float [N, classes] tensor; its outputs: "
                         f"{listed}); top-k is for classifiers (detectors: --score-threshold / --max-detections)")
    if len(cands) > 1:
        raise UsageError(f"--top-k: several outputs could hold class scores ({', '.join(o.name for o in cands)}); "
                         "name one with --scores-output")
    return cands[0]


def add_topk(model, k: int, named: str | None) -> Heads:
    """Softmax (unless the output comes out of one) then TopK on the class-score output: float scores [N,K] and
    int64 indices [N,K] replace it."""
    from onnx import TensorProto, helper

    out = class_scores_output(model, named)
    classes = dims(out)[1]
    if isinstance(classes, int) and k > classes:
        raise UsageError(f"--top-k {k} is more than the {classes} classes of output {out.name!r}; give 1 to "
                         f"{classes}")
    b = Builder(all_names(model))
    made = producer(model, out.name)
    softmax = made is None or made.op_type != "Softmax"
    x = b.op("Softmax", [out.name], axis=-1) if softmax else out.name
    names = [_free(model, "scores"), _free(model, "indices")]
    b.op("TopK", [x, b.const([k], np.int64, "k")], n_out=2, out=names, axis=-1, largest=1, sorted=1)
    batch = dims(out)[0] if dims(out)[0] is not None else "batch"
    _replace_outputs(model, [out.name], [
        helper.make_tensor_value_info(names[0], out.type.tensor_type.elem_type, [batch, k]),
        helper.make_tensor_value_info(names[1], TensorProto.INT64, [batch, k])], b)
    return Heads("classifier", [out.name], names, {"k": k, "classes": classes, "softmax": softmax,
                                                   "scores_output": out.name})


def _free(model, base: str) -> str:
    taken = all_names(model)
    name, i = base, 1
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    return name


def _replace_outputs(model, old: list[str], new: list, b: Builder) -> None:
    g = model.graph
    keep = [o for o in g.output if o.name not in old]
    at = min(i for i, o in enumerate(g.output) if o.name in old)
    outs = keep[:at] + new + keep[at:]
    del g.output[:]
    g.output.extend(outs)
    g.node.extend(b.nodes)
    g.initializer.extend(b.inits)


def _check_threshold(model, threshold: float | None, scores: list) -> None:
    """--score-threshold inside the range of the scores it is compared with (when that range is known)."""
    ranges = {score_range(model, o.name) for o in scores}
    if threshold is None or len(ranges) != 1 or None in ranges:
        return
    lo, hi = ranges.pop()
    if not lo <= threshold <= hi:
        what = "no anchor would ever be kept" if threshold > hi else "every anchor would be kept"
        raise UsageError(f"--score-threshold {threshold:g} is outside {lo:g}..{hi:g}, the range of the class scores "
                         f"({', '.join(o.name for o in scores)}, out of a Sigmoid/Softmax): {what}; give a threshold "
                         f"in {lo:g}..{hi:g}")


def _squashed(model, name: str, depth: int = 4) -> bool:
    """Whether a Sigmoid or Softmax sits within `depth` producers above `name` (class scores, not box rows)."""
    for _ in range(depth):
        n = producer(model, name)
        if n is None or not n.input:
            return False
        if n.op_type in ("Sigmoid", "Softmax"):
            return True
        name = n.input[0]
    return False


SQUASHING = {"Sigmoid": (0.0, 1.0), "Softmax": (0.0, 1.0), "HardSigmoid": (0.0, 1.0)}
# ops whose output holds only values of their data input(s): a range above them holds below them too
MOVING = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Gather", "GatherElements",
          "GatherND", "Expand", "Tile", "Split", "Concat", "ReduceMax", "ReduceMin", "MaxPool", "TopK"}


def score_range(model, name: str, depth: int = 16) -> tuple[float, float] | None:
    """The range of `name`'s values when it comes out of a Sigmoid or Softmax through ops that only move values
    (Reshape, Transpose, Concat of such, ...); None when anything else sits between (a Mul, a Sub: the range is
    unknown)."""
    n = producer(model, name)
    if n is None or depth == 0:
        return None
    if n.op_type in SQUASHING:
        return SQUASHING[n.op_type]
    if n.op_type not in MOVING:
        return None
    data = n.input if n.op_type == "Concat" else n.input[:1]
    ranges = {score_range(model, i, depth - 1) for i in data if i}
    return ranges.pop() if len(ranges) == 1 else None


def detector_heads(model) -> tuple[list[Any], list[Any]]:
    """(score outputs, box outputs) of a dense detector head: rank-3 float outputs [1, anchors, D] in pairs of
    equal anchor counts per level, the class scores the one behind a Sigmoid/Softmax. A UsageError otherwise."""
    by_n: dict[Any, list[Any]] = {}
    for o in float_outputs(model):
        d = dims(o)
        if len(d) == 3 and isinstance(d[1], int):
            by_n.setdefault(d[1], []).append(o)
    scores, boxes = [], []
    for _, outs in by_n.items():
        sq = [o for o in outs if _squashed(model, o.name)]
        other = [o for o in outs if not _squashed(model, o.name)]
        if len(outs) == 2 and len(sq) == 1:
            scores.append(sq[0])
            boxes.append(other[0])
    listed = ", ".join(f"{o.name!r} {shown(dims(o))}" for o in model.graph.output)
    if not scores:
        raise UsageError(f"--score-threshold / --max-detections: the model has no detector head (per level, a "
                         f"[1, anchors, classes] score output behind a Sigmoid/Softmax and a [1, anchors, box] "
                         f"output; its outputs: {listed}); for a classifier use --top-k")
    if any(dims(o)[0] != 1 for o in scores + boxes):
        raise UsageError(f"--score-threshold / --max-detections need a batch of 1 at the head's outputs ({listed})")
    cls = {dims(o)[2] for o in scores}
    box = {dims(o)[2] for o in boxes}
    if len(cls) != 1 or len(box) != 1:
        raise UsageError(f"the detector head's levels differ in classes or box width ({listed}); nothing to gather "
                         "into one list")
    return scores, boxes


def add_detections(model, threshold: float | None, max_detections: int | None, default: int) -> Heads:
    """Concatenate the levels, keep the `max_detections` anchors (`default`, or all where fewer) with the best
    class score (ties: the lower anchor first), drop those under `threshold`; outputs class-score rows [1,M,C],
    box rows [1,M,B] and the anchor indices [1,M] (into the levels in output order: metadata `levels` gives their
    sizes). A threshold outside the scores' range (a Sigmoid's 0..1), or more detections than the head has
    anchors, is a UsageError: the detector would never (or always) detect."""
    from onnx import TensorProto, helper

    scores, boxes = detector_heads(model)
    total = sum(dims(o)[1] for o in scores)
    if max_detections is not None and max_detections > total:
        raise UsageError(f"--max-detections {max_detections} is more than the {total:,} anchors of the detector "
                         f"head ({', '.join(o.name for o in scores)}); give 1 to {total}")
    _check_threshold(model, threshold, scores)
    k = min(max_detections or default, total)
    b = Builder(all_names(model))
    s = b.op("Concat", [o.name for o in scores], axis=1) if len(scores) > 1 else scores[0].name
    bx = b.op("Concat", [o.name for o in boxes], axis=1) if len(boxes) > 1 else boxes[0].name
    if opset(model) >= 18:
        best = b.op("ReduceMax", [s, b.const([2], np.int64, "axes")], keepdims=0)
    else:  # axes an attribute before opset 18
        best = b.op("ReduceMax", [s], axes=[2], keepdims=0)
    vals, idx = b.op("TopK", [best, b.const([k], np.int64, "k")], n_out=2, axis=1, largest=1, sorted=1)
    if threshold is not None:  # sorted: the kept ones are a prefix
        above = b.op("Cast", [b.op("GreaterOrEqual", [vals, b.const(threshold, np.float32, "threshold")])],
                     to=TensorProto.INT64)
        count = b.op("ReduceSum", [above, b.const([1], np.int64, "axes")], keepdims=0)
        idx = b.op("Slice", [idx, b.const([0], np.int64, "zero"), count, b.const([1], np.int64, "axes")])
    flat = b.op("Squeeze", [idx, b.const([0], np.int64, "axes")])
    names = [_free(model, "det_scores"), _free(model, "det_boxes"), _free(model, "det_anchors")]
    b.op("Gather", [s, flat], out=[names[0]], axis=1)
    b.op("Gather", [bx, flat], out=[names[1]], axis=1)
    b.op("Identity", [idx], out=[names[2]])
    c, w = dims(scores[0])[2], dims(boxes[0])[2]
    _replace_outputs(model, [o.name for o in scores + boxes], [
        helper.make_tensor_value_info(names[0], scores[0].type.tensor_type.elem_type, [1, "detections", c]),
        helper.make_tensor_value_info(names[1], boxes[0].type.tensor_type.elem_type, [1, "detections", w]),
        helper.make_tensor_value_info(names[2], TensorProto.INT64, [1, "detections"])], b)
    return Heads("detector", [o.name for o in scores + boxes], names, {
        "levels": [dims(o)[1] for o in scores], "score_outputs": [o.name for o in scores],
        "box_outputs": [o.name for o in boxes], "max_detections": k, "score_threshold": threshold})
