"""Low-level helpers shared by the simplify and quantize passes: ONNX surgery, running models, checks.

Frameworks (onnx, onnxruntime) are imported inside the functions: importing this module is cheap.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from optkit.core.errors import UsageError

# Ops onnxruntime's quantizers act on, per mode (what "nothing to quantize" is checked against).
WEIGHT_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "Attention", "LSTM", "Gather", "EmbedLayerNormalization")
DYNAMIC_OPS = ("Conv", "MatMul", "Attention", "LSTM", "Gather", "EmbedLayerNormalization")
STATIC_ANCHORS = ("Conv", "ConvTranspose", "MatMul", "Gemm")  # ops that carry weights in a static model
# Gemm: rewritten to MatMul (+ Add) first (gemm_to_matmul); Gather: embedding tables (GatherBlockQuantized)
INT4_OPS = ("MatMul", "Gemm", "Gather")
INT4_WEIGHT_INPUT = {"MatMul": 1, "Gemm": 1, "Gather": 0}  # which input carries the constant weight
QUANTIZED_OPS = {
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul", "QGemm",
    "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "MatMulNBits",
    "QAttention", "QLinearAdd", "QLinearMul", "GatherBlockQuantized", "QEmbedLayerNormalization",
}
# onnxruntime's quantizer registries key on the op type alone, and for these mean the com.microsoft contrib
# ops: an ONNX-domain Attention (opset 23) became a QAttention that does not load. Such nodes stay float.
CONTRIB_ONLY = ("Attention", "EmbedLayerNormalization")


def contrib_lookalikes(model) -> list:
    """The nodes of the main graph that share a CONTRIB_ONLY name but are not com.microsoft's."""
    return [n for n in model.graph.node if n.op_type in CONTRIB_ONLY and n.domain != "com.microsoft"]


CONTROL_FLOW = ("Loop", "If", "Scan")
RECURRENT = ("LSTM", "GRU", "RNN")


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


def load_model(path: str | Path):
    import onnx

    from optkit.core.artifact import external_data_files

    external_data_files(path)  # a missing .data file is named (exit 2), not reported as an unreadable model
    try:
        return onnx.load(str(path))
    except Exception as e:  # protobuf raises several types
        raise UsageError(f"cannot read {path} as ONNX: {str(e).splitlines()[0] if str(e) else type(e).__name__}") \
            from None


def save_model(model, path: str | Path) -> None:
    import onnx

    onnx.save(model, str(path))


def opset(model) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def all_nodes(graph):
    """Every node of a graph, subgraphs (Loop, If, Scan bodies) included."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.g is not None and attr.g.ByteSize():
                yield from all_nodes(attr.g)
            for g in attr.graphs:
                yield from all_nodes(g)


def op_counts(model) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in all_nodes(model.graph):
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def has_subgraphs(model) -> bool:
    return any(n.op_type in CONTROL_FLOW for n in model.graph.node)


def name_nodes(model) -> int:
    """Give every unnamed node a unique name (the quantizers' include/exclude lists need names)."""
    seen = {n.name for n in all_nodes(model.graph) if n.name}
    added = 0
    for i, node in enumerate(all_nodes(model.graph)):
        if not node.name:
            base = f"{node.op_type}_{i}"
            name, k = base, 0
            while name in seen:
                k += 1
                name = f"{base}_{k}"
            node.name = name
            seen.add(name)
            added += 1
    return added


def upgrade_opset(model, target: int):
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, target)
    except Exception as e:
        raise UsageError(f"cannot upgrade the model from opset {opset(model)} to {target} "
                         f"(needed for this mode): {str(e).splitlines()[0] if str(e) else type(e).__name__}") \
            from None


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


def compact(model) -> int:
    """Shrink the file without touching the math: short internal tensor names, no node names, no value_info,
    no doc strings. Returns bytes saved. Models with subgraphs keep their names (bodies use outer names)."""
    before = model.ByteSize()
    g = model.graph
    del g.value_info[:]
    for node in all_nodes(g):
        node.doc_string = ""
    g.doc_string = ""
    if has_subgraphs(model):
        return before - model.ByteSize()
    _drop_zero_points(g)
    _dedupe_initializers(g)
    keep = {v.name for v in g.input} | {v.name for v in g.output} | {""}
    mapping: dict[str, str] = {}
    skipped: list[str] = []

    def short(name: str) -> str:
        if name in keep:
            return name
        if name not in mapping:
            new = np.base_repr(len(mapping) + len(skipped), 36).lower()
            while new in keep:  # never collide with an input or output name
                skipped.append(new)
                new = np.base_repr(len(mapping) + len(skipped), 36).lower()
            mapping[name] = new
        return mapping[name]

    for init in g.initializer:
        init.name = short(init.name)
    for node in g.node:
        node.name = ""
        for i, n in enumerate(node.input):
            node.input[i] = short(n)
        for i, n in enumerate(node.output):
            node.output[i] = short(n)
    _prune(model)
    return before - model.ByteSize()


def _drop_zero_points(g) -> int:
    """DequantizeLinear's zero point is optional and defaults to 0 of the input's type: an all-zero INT32
    zero point (quantized biases) is bytes for nothing. QuantizeLinear keeps its zero point
    (it sets the output type). Returns the number of inputs dropped."""
    from onnx import TensorProto, numpy_helper

    inits = {i.name: i for i in g.initializer}
    dropped = 0
    for node in g.node:
        if node.op_type != "DequantizeLinear" or len(node.input) < 3 or node.input[2] not in inits:
            continue
        zp, x = inits[node.input[2]], inits.get(node.input[0])
        # INT32 (quantized bias) only: without an INT8 weight zero point onnxruntime stops fusing DQ -> Gemm into
        # QGemm (and then trips on its own per-axis bias DQ), so those stay
        if zp.data_type != TensorProto.INT32 or (x is not None and x.data_type != zp.data_type):
            continue
        scale = inits.get(node.input[1])
        if scale is None or (x is None and list(scale.dims) not in ([], [1])):
            continue
        if list(scale.dims) not in ([], [1]):  # per-axis: only where scale and axis agree (onnxruntime checks
            axis = next((at.i for at in node.attribute if at.name == "axis"), 1)  # them once the zp is gone)
            dims = list(x.dims)
            if not dims or not -len(dims) <= axis < len(dims) or dims[axis] != int(np.prod(scale.dims)):
                continue
        if not np.any(numpy_helper.to_array(zp)):
            del node.input[2]
            dropped += 1
    return dropped


def _dedupe_initializers(g) -> int:
    """Point every use of a byte-identical initializer (same type, shape, data) at one copy."""
    seen: dict[tuple, str] = {}
    alias: dict[str, str] = {}
    for init in g.initializer:
        anon = type(init)()
        anon.CopyFrom(init)
        anon.name = ""
        key = (init.data_type, tuple(init.dims), anon.SerializeToString())
        if key in seen:
            alias[init.name] = seen[key]
        else:
            seen[key] = init.name
    if not alias:
        return 0
    for node in g.node:
        for i, n in enumerate(node.input):
            if n in alias:
                node.input[i] = alias[n]
    return len(alias)


def _prune(model) -> None:
    """Drop unused initializers, initializers listed as graph inputs (IR >= 4), and unused opset imports."""
    g = model.graph
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    keep = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    names = {i.name for i in keep}
    if model.ir_version >= 4:
        inputs = [v for v in g.input if v.name not in names]
        del g.input[:]
        g.input.extend(inputs)
    domains = {n.domain or "" for n in g.node}
    ops_ = [o for o in model.opset_import if (o.domain or "") in domains or o.domain in ("", "ai.onnx")]
    del model.opset_import[:]
    model.opset_import.extend(ops_)


def is_quantized(model) -> list[str]:
    """The quantized op types a model already holds (empty when it is a float model)."""
    return sorted({n.op_type for n in all_nodes(model.graph) if n.op_type in QUANTIZED_OPS})


def float_io(model) -> bool:
    import onnx

    return any(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for v in model.graph.input)


# ---------------------------------------------------------------- running models


def session(path: str | Path, threads: int | None = 1, optimize: bool = True):
    import onnxruntime as ort

    from optkit.runtimes.onnx import session_options

    try:
        return ort.InferenceSession(str(path), sess_options=session_options(threads, optimize),
                                    providers=["CPUExecutionProvider"])
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"cannot load {path} with onnxruntime: {first}") from None


def input_specs(sess) -> list:
    """The session's inputs; a UsageError for those onnxruntime cannot be fed (bfloat16)."""
    from optkit.runtimes.onnx import _spec, check_feedable

    specs = [_spec(i) for i in sess.get_inputs()]
    check_feedable(specs)
    return specs


def run_all(sess, feeds: dict[str, np.ndarray], names: list[str] | None = None, batch: int = 64
            ) -> list[np.ndarray]:
    """Run over every sample, in batches the model accepts (one at a time for a fixed batch of 1)."""
    from optkit.measure.inputs import fixed_batch, join, stackable

    specs = input_specs(sess)
    names = names or [o.name for o in sess.get_outputs()]
    if not stackable(specs):  # no batch axis to split on: the feeds are one whole call
        return [np.asarray(x) for x in sess.run(names, feeds)]
    fixed = fixed_batch(specs)
    step = fixed or batch
    n = len(next(iter(feeds.values())))
    names = names or [o.name for o in sess.get_outputs()]
    chunks = []
    for start in range(0, n - n % step if fixed else n, step):
        chunks.append(sess.run(names, {k: v[start:start + step] for k, v in feeds.items()}))
    if not chunks:
        raise UsageError(f"no sample to run: {n} samples for a model with a fixed batch of {fixed}")
    return [join([c[i] for c in chunks]) for i in range(len(names))]


def run_sets(sess, sets: list[dict[str, np.ndarray]], names: list[str]) -> list[np.ndarray]:
    """Run each feed set as one whole call; each output is the calls' results stacked (or flattened when the
    shapes differ), so models without a batch axis compare as they are."""
    runs = [sess.run(names, feeds) for feeds in sets]
    out = []
    for i in range(len(names)):
        parts = [np.asarray(r[i]) for r in runs]
        try:
            out.append(np.stack(parts))
        except ValueError:
            out.append(np.concatenate([p.ravel() for p in parts]))
    return out


def with_outputs(model, names: list[str]):
    """A copy of the model that also outputs the given tensors (types left to onnxruntime)."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for name in names:
        if name not in have:
            m.graph.output.append(onnx.ValueInfoProto(name=name))
    return m


def rel_error(ref: np.ndarray, out: np.ndarray) -> float:
    ref = np.asarray(ref, dtype=np.float64).ravel()
    out = np.asarray(out, dtype=np.float64).ravel()
    if ref.size != out.size:
        return float("inf")
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(ref - out) / denom) if denom > 0 else float(np.linalg.norm(out) > 0)


def fidelity(ref: list[np.ndarray], out: list[np.ndarray], names: list[str]) -> dict[str, Any]:
    """compare_outputs, plus the worst per-sample cosine (a global cosine hides a few ruined samples)."""
    from optkit.measure.fidelity import compare_outputs

    fid = compare_outputs(ref, out, names)
    worst = 1.0
    for a, b in zip(ref, out):
        if a.ndim < 2 or a.size == 0 or a.shape != b.shape or not np.issubdtype(a.dtype, np.floating):
            continue
        a2 = a.reshape(len(a), -1).astype(np.float64)
        b2 = b.reshape(len(b), -1).astype(np.float64)
        na, nb = np.linalg.norm(a2, axis=1), np.linalg.norm(b2, axis=1)
        ok = (na > 0) & (nb > 0)
        cos = np.where(ok, (a2 * b2).sum(1) / np.where(ok, na * nb, 1), np.where((na == 0) & (nb == 0), 1, 0))
        worst = min(worst, float(cos.min())) if np.isfinite(cos).all() else -1.0  # NaN never passes
    fid["sample_cosine_min"] = worst
    cosine = fid["cosine"]
    fid["loss"] = max(0.0, 1.0 - cosine) if cosine is not None and np.isfinite(cosine) else 2.0
    return {k: v for k, v in fid.items() if k != "outputs"} | {"outputs": {
        k: {kk: vv for kk, vv in v.items() if kk != "worst_index"} | {"worst_index": v["worst_index"]}
        for k, v in fid["outputs"].items()}}


def file_size(path: str | Path) -> int:
    return os.path.getsize(path)
