"""Scalar inputs and outputs for Triton: it serves no scalar tensor in a model without batching ("scalar tensors
are not supported"), and a reshape to [] is allowed only with batching. Such a model is served with each scalar
as a [1] tensor: a Reshape between the [1] graph input and the graph's own [] tensor (and the same at a scalar
output). Nothing else in the graph changes; the lineage records both files' sha256."""
from __future__ import annotations

from pathlib import Path

from optkit.core.errors import UsageError
from optkit.onnx import graph
from optkit.package.signature import Signature


def scalars(sig: Signature) -> tuple[list[str], list[str]]:
    """The names of the scalar inputs and outputs."""
    return [t.name for t in sig.inputs if not t.dims], [t.name for t in sig.outputs if not t.dims]


def lift(model: str | Path, sig: Signature):
    """`model` with its scalar inputs and outputs as [1] tensors, a ModelProto whose external data (not loaded)
    stays where the source references it, and one note per tensor lifted."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    ins, outs = scalars(sig)
    proto = onnx.load(str(model), load_external_data=False)
    opset = graph.opset(proto)
    if opset < 5:
        raise UsageError(f"{model}: scalar tensors {', '.join(ins + outs)} need reshaping for Triton, which takes "
                         f"opset 5 or newer (the model's is {opset}): convert it to a newer opset first")
    g = proto.graph
    taken = _names(g)

    def fresh(base: str) -> str:
        name, i = base, 1
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        taken.add(name)
        return name

    def reshape(src: str, dst: str, shape: list[int]) -> list:
        const = fresh(f"{dst}_shape")
        return [helper.make_node("Constant", [], [const], value=numpy_helper.from_array(np.array(shape, np.int64))),
                helper.make_node("Reshape", [src, const], [dst], name=fresh(f"{dst}_reshape"))]

    front, back, notes = [], [], []
    for name in ins:
        inner = fresh(f"{name}_scalar")
        _rename(g, name, inner, outputs=False)
        front += reshape(name, inner, [])
        _set_dims(next(i for i in g.input if i.name == name), [1])
        notes.append(f"input {name!r} is a scalar; Triton serves none without batching: model.onnx takes it as "
                     "[1] (a Reshape to [] in front of the graph)")
    for name in outs:
        if name in {i.name for i in g.input} | {i.name for i in g.initializer}:
            raise UsageError(f"output {name!r} is a scalar passed through from an input or a constant; Triton "
                             "serves no scalar without batching: give the model a [1] output instead")
        inner = fresh(f"{name}_scalar")
        _rename(g, name, inner, outputs=True)
        back += reshape(inner, name, [1])
        _set_dims(next(o for o in g.output if o.name == name), [1])
        notes.append(f"output {name!r} is a scalar; Triton serves none without batching: model.onnx gives it as "
                     "[1] (a Reshape at the end of the graph)")
    nodes = front + list(g.node) + back
    del g.node[:]
    g.node.extend(nodes)
    onnx.checker.check_model(proto)
    return proto, notes


def _names(g) -> set[str]:
    """Every tensor and node name in the graph and its subgraphs."""
    out: set[str] = set()
    for sub in graph.all_graphs(g):
        out |= {v.name for v in (*sub.input, *sub.output, *sub.value_info)} | {i.name for i in sub.initializer}
        for n in sub.node:
            out.update(n.input, n.output, [n.name])
    return out


def _rename(g, old: str, new: str, outputs: bool) -> None:
    """Every use of `old` as a node input, in the graph and in subgraphs that read it from this scope (a subgraph
    declaring a tensor of that name shadows it); with `outputs`, also the node output that produces it."""
    for n in g.node:
        n.input[:] = [new if x == old else x for x in n.input]
        if outputs:
            n.output[:] = [new if x == old else x for x in n.output]
        for sub in graph.subgraphs(n):
            if old not in _declared(sub):
                _rename(sub, old, new, outputs=False)
    for v in g.value_info:
        if v.name == old:
            v.name = new


def _declared(g) -> set[str]:
    return ({i.name for i in g.input} | {i.name for i in g.initializer}
            | {o for n in g.node for o in n.output})


def _set_dims(value_info, dims: list[int]) -> None:
    shape = value_info.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        shape.dim.add().dim_value = d
