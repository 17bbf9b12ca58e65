"""What the quantize passes know about ONNX graphs and onnxruntime's quantizers: which ops they act on,
graph rewrites they need first, and the fidelity check of a candidate against its parent."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from optkit.measure.fidelity import compare_outputs
from optkit.onnx.graph import all_graphs, all_nodes

# Ops onnxruntime's quantizers act on, per mode (what "nothing to quantize" is checked against).
WEIGHT_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "Attention", "LSTM", "Gather", "EmbedLayerNormalization")
DYNAMIC_OPS = ("Conv", "MatMul", "Gemm", "Attention", "LSTM", "Gather", "EmbedLayerNormalization")
# Dynamic INT8's two tiers of op types. FAST: what onnxruntime's integer kernels make faster on a CPU
# (MatMulInteger, DynamicQuantizeLSTM, QAttention; Gemm is rewritten as MatMul first). SLOW: what dynamic INT8
# makes smaller but rarely faster (ConvInteger is usually slower than float Conv; Gather: embedding tables).
# The search tries FAST alone, then FAST + SLOW, only where the model has them.
DYNAMIC_FAST = ("MatMul", "Attention", "LSTM", "EmbedLayerNormalization")
DYNAMIC_SLOW = ("Conv", "Gather")
STATIC_ANCHORS = ("Conv", "ConvTranspose", "MatMul", "Gemm")  # ops that carry weights in a static model
# Gemm: rewritten to MatMul (+ Add) first (gemm_to_matmul); Gather: embedding tables (GatherBlockQuantized)
INT4_OPS = ("MatMul", "Gemm", "Gather")
INT4_WEIGHT_INPUT = {"MatMul": 1, "Gemm": 1, "Gather": 0}  # which input carries the constant weight
# onnxruntime's quantizer registries key on the op type alone, and for these mean the com.microsoft contrib
# ops: an ONNX-domain Attention (opset 23) became a QAttention that does not load. Such nodes stay float.
CONTRIB_ONLY = ("Attention", "EmbedLayerNormalization")


DYNAMIC_WEIGHT_INPUT = {"Conv": 1, "MatMul": 1, "Gather": 0}  # the input that must be a constant weight


def dynamic_ops(model) -> dict[str, int]:
    """The op types dynamic INT8 would quantize, with their counts: Conv, MatMul and Gather only where their
    weight is a constant float (a Gather of activations, e.g. `y[:, -1]`, is not an embedding table; MatMul of two
    activations stays float under MatMulConstBOnly); contrib look-alikes never."""
    inits = {i.name for g in all_graphs(model.graph) for i in g.initializer if i.data_type == 1}
    kept = contrib_lookalikes(model)  # held while ids are compared: a freed protobuf wrapper's id is reused
    lookalikes = {id(n) for n in kept}
    counts: dict[str, int] = {}
    for n in all_nodes(model.graph):
        if n.op_type not in DYNAMIC_OPS or id(n) in lookalikes:
            continue
        k = DYNAMIC_WEIGHT_INPUT.get(n.op_type)
        if k is not None and (len(n.input) <= k or n.input[k] not in inits):
            continue
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


def contrib_lookalikes(model) -> list:
    """The nodes of the main graph that share a CONTRIB_ONLY name but are not com.microsoft's."""
    return [n for n in model.graph.node if n.op_type in CONTRIB_ONLY and n.domain != "com.microsoft"]


@lru_cache(maxsize=1)
def has_vnni() -> bool:
    """True when the CPU has AVX-512 VNNI or AVX-VNNI (int8 dot products without u8s8 saturation)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
            break
    return bool({"avx512_vnni", "avx_vnni"} & flags)


def gemm_to_matmul(model, exclude=()) -> int:
    """Rewrite Gemm nodes with a constant float B (alpha 1, beta 1, transA 0) as MatMul [+ Add], in place, so
    onnxruntime's MatMulNBits quantizer (which matches MatMul only) can take their weights. transB=1 weights
    are transposed in the file. The MatMul keeps the Gemm's name (exclusions by name still apply).
    Returns the number of nodes rewritten."""
    from onnx import helper, numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    uses: dict[str, int] = {}
    for n in all_nodes(g):
        for x in n.input:
            uses[x] = uses.get(x, 0) + 1
    out, done = [], 0
    for n in g.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        b = inits.get(n.input[1]) if n.op_type == "Gemm" and len(n.input) > 1 else None
        if (b is None or n.name in exclude or b.data_type != 1 or len(b.dims) != 2
                or attrs.get("alpha", 1.0) != 1.0 or attrs.get("transA", 0)
                or (len(n.input) > 2 and n.input[2] and attrs.get("beta", 1.0) != 1.0)):
            out.append(n)
            continue
        name = n.input[1]
        if attrs.get("transB", 0):
            w = numpy_helper.to_array(b).T.copy()
            name = b.name if uses.get(b.name, 0) == 1 else f"{b.name}_T"
            if name == b.name:
                g.initializer.remove(b)
            g.initializer.append(numpy_helper.from_array(w, name))
        has_c = len(n.input) > 2 and bool(n.input[2])
        mm_out = f"{n.output[0]}_mm" if has_c else n.output[0]
        out.append(helper.make_node("MatMul", [n.input[0], name], [mm_out], name=n.name))
        if has_c:
            out.append(helper.make_node("Add", [mm_out, n.input[2]], [n.output[0]], name=f"{n.name}_bias"))
        done += 1
    if done:
        del g.node[:]
        g.node.extend(out)
    return done


def int4_gathers(model) -> list[str]:
    """Gather nodes whose data is a constant 2-D float table (embeddings): what GatherBlockQuantized takes."""
    inits = {i.name: i for i in model.graph.initializer}
    def axis(n) -> int:
        return next((a.i for a in n.attribute if a.name == "axis"), 0)

    return [n.name for n in model.graph.node if n.op_type == "Gather" and n.input[0] in inits
            and inits[n.input[0]].data_type == 1 and len(inits[n.input[0]].dims) == 2 and axis(n) == 0]


def rel_error(ref: np.ndarray, out: np.ndarray) -> float:
    ref = np.asarray(ref, dtype=np.float64).ravel()
    out = np.asarray(out, dtype=np.float64).ravel()
    if ref.size != out.size:
        return float("inf")
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(ref - out) / denom) if denom > 0 else float(np.linalg.norm(out) > 0)


def sample_cosines(ref: list[np.ndarray], out: list[np.ndarray], names: list[str], mask=None,
                   only=None) -> np.ndarray | None:
    """Per sample, the lowest cosine to the parent over the judged float outputs with a sample axis (padded
    positions zeroed); NaN or Inf in a sample makes it -1. None when no output has a sample axis."""
    judged = set(only or names)
    worst = None
    for name, a, b in zip(names, ref, out):
        if name not in judged:
            continue
        if a.ndim < 2 or a.size == 0 or a.shape != b.shape or not np.issubdtype(a.dtype, np.floating):
            continue
        keep = mask.keep(name, a.shape) if mask is not None else None
        if keep is not None:  # padded positions count for nothing
            keep = keep.reshape(*keep.shape, *([1] * (a.ndim - 2)))
            a, b = np.where(keep, a, 0), np.where(keep, b, 0)
        a2 = a.reshape(len(a), -1).astype(np.float64)
        b2 = b.reshape(len(b), -1).astype(np.float64)
        na, nb = np.linalg.norm(a2, axis=1), np.linalg.norm(b2, axis=1)
        ok = (na > 0) & (nb > 0)
        with np.errstate(invalid="ignore", over="ignore"):
            cos = np.where(ok, (a2 * b2).sum(1) / np.where(ok, na * nb, 1), np.where((na == 0) & (nb == 0), 1, 0))
        cos = np.where(np.isfinite(cos), cos, -1.0)  # NaN never passes
        worst = cos if worst is None else np.minimum(worst, cos)
    return worst


def fidelity(ref: list[np.ndarray], out: list[np.ndarray], names: list[str], mask=None, only=None) -> dict[str, Any]:
    """compare_outputs (padding masked, the `only` outputs judged), plus the worst per-sample cosine of the
    judged outputs (a global cosine hides a few ruined samples) and the loss the budgets use."""
    fid = compare_outputs(ref, out, names, mask=mask, only=only)
    per = sample_cosines(ref, out, names, mask, only)
    fid["sample_cosine_min"] = float(per.min()) if per is not None else 1.0
    cosine = fid["cosine"]
    fid["loss"] = max(0.0, 1.0 - cosine) if cosine is not None and np.isfinite(cosine) else 2.0
    return {k: v for k, v in fid.items() if k != "outputs"} | {"outputs": {
        k: {kk: vv for kk, vv in v.items() if kk != "worst_index"} | {"worst_index": v["worst_index"]}
        for k, v in fid["outputs"].items()}}
