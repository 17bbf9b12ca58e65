"""Transformer fusions before dynamic INT8: onnxruntime's transformer optimizer rewrites a BERT-style encoder's
attention, embedding + LayerNorm, residual + LayerNorm and Gelu subgraphs as its fused contrib ops (Attention,
EmbedLayerNormalization, SkipLayerNormalization, BiasGelu), which its dynamic quantizer then turns into QAttention,
QEmbedLayerNormalization (int8 tables) and MatMulInteger. Whether that is faster on this CPU is measured: the
fused model only adds candidates to the search, whose timing race keeps the fastest.

The optimizer finds the head count only from a constant reshape shape; exported with dynamic axes, that shape is
a Concat, so the heads and width are read here from the graph (fusion_shape) and passed to it.
"""
from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from pathlib import Path

import numpy as np
from onnx import helper, numpy_helper

from optkit.core import logs
from optkit.core.text import first_line
from optkit.onnx import io as onnx_io
from optkit.onnx.graph import name_nodes

log = logging.getLogger("optkit.passes.quantize.search")

# the fused ops that change the kernels run (LayerNormalization alone is a rename onnxruntime makes anyway)
FUSED = ("Attention", "MultiHeadAttention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu",
         "FastGelu", "Gelu")
# the optimizer logs every fusion at INFO and warns where it cannot fuse; optkit says what fused
CHATTY = ("onnxruntime.transformers", "fusion_base", "onnx_model", "onnx_model_bert", "fusion_utils", "optimizer")
SAME_OUTPUTS = 1e-4  # the fused float model's outputs agree with the parent's to this (relative to their scale)


def looks_like_transformer(model) -> bool:
    ops = Counter(n.op_type for n in model.graph.node)
    return bool(ops["Softmax"] and ops["MatMul"] >= 4 and (ops["LayerNormalization"] or ops["ReduceMean"]))


def fusion_shape(model) -> tuple[int, int]:
    """(heads, hidden width) of a BERT-style graph, or (0, 0) where the graph does not say both: the width is the
    commonest LayerNormalization scale length; the heads N from a 4-D Reshape target [batch, seq, N, H] with
    N * H == width, or [batch, seq, -1, H] with H dividing the width (the split of the attention heads)."""
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    for n in model.graph.node:  # Unsqueeze(constant scalar) -> a one-element constant
        if n.op_type == "Unsqueeze" and n.input[0] in consts and consts[n.input[0]].size == 1:
            consts[n.output[0]] = consts[n.input[0]].reshape(1)
    widths = Counter(int(consts[n.input[1]].size) for n in model.graph.node
                     if n.op_type == "LayerNormalization" and len(n.input) > 1 and n.input[1] in consts)
    if not widths:
        return 0, 0
    hidden = widths.most_common(1)[0][0]
    producers = {o: n for n in model.graph.node for o in n.output}
    heads: Counter = Counter()
    for n in model.graph.node:
        if n.op_type != "Reshape" or len(n.input) < 2:
            continue
        shape = n.input[1]
        if shape in consts:
            dims = [int(v) for v in consts[shape].reshape(-1)]
        elif shape in producers and producers[shape].op_type == "Concat":
            parts = [consts.get(i) for i in producers[shape].input]
            dims = [int(p.reshape(-1)[0]) if p is not None and p.size == 1 else -1 for p in parts]
        else:
            continue
        if len(dims) != 4:
            continue
        a, b = dims[2], dims[3]  # [batch, seq, heads, head size]; heads may be -1 (view(..., -1, head_size))
        if 0 < b <= hidden and (a * b == hidden or (a == -1 and hidden % b == 0)):  # one head: b == hidden
            heads[hidden // b] += 1
    # heads unknown: (0, 0) lets the optimizer look for itself (it refuses a width without heads outright, and
    # would then fuse nothing, not even the LayerNorm and Gelu subgraphs)
    return (heads.most_common(1)[0][0], hidden) if heads else (0, 0)


def fuse(prepared: Path, dest: Path) -> dict[str, int] | None:
    """Write the fused model of `prepared` to `dest`; the fused ops it holds ({"Attention": 6, ...}), or None
    when the model is not a transformer this optimizer knows or nothing fused (dest not written)."""
    model = onnx_io.load(prepared)
    if not looks_like_transformer(model):
        return None
    heads, hidden = fusion_shape(model)
    said = io.StringIO()  # the optimizer prints ("failed in shape inference ..."): said at -v, not on the console
    try:
        from onnxruntime.transformers.optimizer import optimize_model

        with contextlib.redirect_stdout(said), logs.quieted(*CHATTY, level=logging.ERROR):
            fused = optimize_model(model, model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0)
    except Exception as e:  # noqa: BLE001 - the optimizer fails on graphs it half recognises
        log.info("transformer fusion skipped: %s", first_line(e)[:160])
        return None
    finally:
        for line in filter(None, (x.strip() for x in said.getvalue().splitlines())):
            log.info("transformer optimizer: %s", line[:200])
    counts = {op: c for op, c in Counter(n.op_type for n in fused.model.graph.node).items() if op in FUSED}
    if not counts:
        return None
    lost = lost_outputs(model, fused.model)
    if lost:  # an intermediate the model also returns (attention probabilities, a layer's hidden state) fused away
        log.info("transformer fusion skipped: it removes what outputs %s come from", ", ".join(lost[:5]))
        return None
    if not any(o.domain == "com.microsoft" for o in fused.model.opset_import):
        fused.model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    name_nodes(fused.model)
    onnx_io.save(fused.model, dest)
    return counts


def lost_outputs(parent, fused) -> list[str]:
    """The parent's graph outputs the fused graph no longer returns or computes."""
    g = fused.graph
    made = {o for n in g.node for o in n.output} | {i.name for i in g.input} | {i.name for i in g.initializer}
    returned = {o.name for o in g.output}
    return [o.name for o in parent.graph.output if o.name not in returned or o.name not in made]


def same_outputs(parent_outputs: list, fused_outputs: list) -> bool:
    """The fused float model computes what its parent does (the optimizer's patterns can match a graph they
    do not fit): every output the same shape and within SAME_OUTPUTS of the parent's scale."""
    if len(parent_outputs) != len(fused_outputs):
        return False
    for a, b in zip(parent_outputs, fused_outputs):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return False
        if a.dtype.kind != "f":
            if not np.array_equal(a, b):
                return False
            continue
        scale = float(np.max(np.abs(a))) if a.size else 0.0
        if not np.all(np.isfinite(b)) or float(np.max(np.abs(a - b), initial=0.0)) > SAME_OUTPUTS * max(scale, 1.0):
            return False
    return True

