"""Bias correction (Nagel et al. 2019, "Data-Free Quantization", section 4.2): rounding weights to int8 shifts
each output channel's mean by E[(Wq - W) x]. With the per-channel means of each layer's float input, taken on
the calibration data, that shift is known and is taken off the float bias before quantizing again; the
quantized weights are the first build's (read back from its file, so any format or weight type).

Conv (any group count) and Gemm with constant weights and a constant bias (a bias is added where it had none);
nodes whose weights the first build left float are not touched.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
from onnx import numpy_helper

from optkit.onnx import graph
from optkit.onnx import io as onnx_io
from optkit.onnx import session as onnx_session


def layers(model) -> list:
    """The nodes bias correction applies to: Conv and Gemm (no transposed input) with constant weights."""
    inits = {i.name for i in model.graph.initializer}
    uses = Counter(i for n in model.graph.node for i in n.input)
    out = []
    for n in model.graph.node:
        if n.op_type not in ("Conv", "Gemm") or len(n.input) < 2 or n.input[1] not in inits:
            continue
        attrs = {a.name: a for a in n.attribute}
        if n.op_type == "Gemm" and (attrs.get("transA") and attrs["transA"].i
                                    or any(k in attrs for k in ("alpha", "beta"))):
            continue
        if len(n.input) > 2 and n.input[2] and (n.input[2] not in inits or uses[n.input[2]] > 1):
            continue  # a bias computed at run time, or shared by several layers: each would need its own
        out.append(n)
    return out


def input_means(model, reader, scratch: Path) -> dict[str, np.ndarray]:
    """Per-channel (axis 1) mean of every corrected layer's float input over the calibration calls (the model
    that outputs them is written to `scratch`)."""

    names = sorted({n.input[0] for n in layers(model)})
    if not names:
        return {}
    onnx_io.save(graph.with_outputs(model, names), scratch)
    sess = onnx_session.session(scratch, threads=None)
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    reader.rewind()
    while (feeds := reader.get_next()) is not None:
        for name, value in zip(names, sess.run(names, feeds)):
            value = np.asarray(value, dtype=np.float64)
            if value.ndim < 2:
                continue
            flat = np.moveaxis(value, 1, -1).reshape(-1, value.shape[1])
            sums[name] = sums.get(name, 0) + flat.sum(axis=0)
            counts[name] = counts.get(name, 0) + flat.shape[0]
    reader.rewind()
    return {k: sums[k] / counts[k] for k in sums}


def quantized_weight(qmodel, name: str) -> np.ndarray | None:
    """The dequantized weight onnxruntime wrote for float initializer `name` (its `<name>_quantized`, `_scale`
    and `_zero_point` initializers), or None when it left that weight float."""
    inits = {i.name: i for i in qmodel.graph.initializer}
    q, scale = inits.get(f"{name}_quantized"), inits.get(f"{name}_scale")
    if q is None or scale is None:
        return None
    q = numpy_helper.to_array(q).astype(np.float64)
    scale = numpy_helper.to_array(scale).astype(np.float64)
    zp = inits.get(f"{name}_zero_point")
    zp = numpy_helper.to_array(zp).astype(np.float64) if zp is not None else np.zeros_like(scale)
    shape = (-1,) + (1,) * (q.ndim - 1) if scale.ndim == 1 and scale.size > 1 else ()
    return (q - zp.reshape(shape)) * scale.reshape(shape)


def correct(model, qmodel, means: dict[str, np.ndarray]) -> int:
    """Take E[(Wq - W) x] off each layer's bias in `model` (float, edited in place); the layers corrected."""
    inits = {i.name: i for i in model.graph.initializer}
    done = 0
    for n in layers(model):
        mu = means.get(n.input[0])
        w = numpy_helper.to_array(inits[n.input[1]]).astype(np.float64)
        wq = quantized_weight(qmodel, n.input[1])
        if mu is None or wq is None or wq.shape != w.shape:
            continue
        dw = wq - w
        if n.op_type == "Gemm":
            trans_b = any(a.name == "transB" and a.i for a in n.attribute)
            shift = (dw if trans_b else dw.T) @ mu
        else:
            group = next((a.i for a in n.attribute if a.name == "group"), 1)
            per = dw.reshape(dw.shape[0], dw.shape[1], -1).sum(axis=2)   # [out, in/group]
            if mu.size != per.shape[1] * group:
                continue
            g_out = per.shape[0] // group
            shift = np.einsum("goi,gi->go", per.reshape(group, g_out, -1), mu.reshape(group, -1)).reshape(-1)
        if len(n.input) > 2 and n.input[2]:
            bias = numpy_helper.to_array(inits[n.input[2]]).astype(np.float64)
            inits[n.input[2]].CopyFrom(numpy_helper.from_array((bias - shift).astype(np.float32), n.input[2]))
        else:
            name = f"{n.name or n.input[1]}_bias_corrected"
            model.graph.initializer.append(numpy_helper.from_array((-shift).astype(np.float32), name))
            if len(n.input) == 2:
                n.input.append(name)
            else:
                n.input[2] = name
        done += 1
    return done
