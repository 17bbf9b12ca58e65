"""The main graph of a model as the splitter sees it: nodes (Constant nodes aside), who produces and who reads each
tensor (a subgraph's reads of outer tensors count as its node's), and each tensor's type and shape: symbolic as the
model declares it, concrete at the sizes chosen for the dynamic dims (shape inference; a data-dependent dim is
observed on the sample inputs)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from optkit.core.errors import UsageError
from optkit.onnx.graph import subgraphs


@dataclass
class TensorInfo:
    dtype: str | None = None         # numpy dtype name ("float32", "object" for strings)
    shape: list | None = None        # symbolic: ints, dim names (str) or None
    concrete: list | None = None     # ints at the chosen dims
    observed: bool = False           # the concrete shape was measured on the sample inputs (data-dependent)
    elem: int | None = None          # ONNX element type

    def nbytes(self) -> int | None:
        if self.concrete is None or self.dtype is None:
            return None
        size = np.dtype(self.dtype).itemsize if self.dtype != "object" else 0
        return int(math.prod(self.concrete)) * size


@dataclass
class Graph:
    model: object
    nodes: list                                   # main-graph nodes, Constant nodes aside, in file order
    constants: dict = field(default_factory=dict)  # Constant node output -> node
    initializers: set = field(default_factory=set)
    inputs: list = field(default_factory=list)    # graph input names (initializers excluded)
    outputs: list = field(default_factory=list)
    producer: dict = field(default_factory=dict)  # tensor -> node index
    readers: dict = field(default_factory=dict)   # tensor -> [node index]
    reads: list = field(default_factory=list)     # node index -> tensors it reads (outer reads of subgraphs too)
    info: dict = field(default_factory=dict)      # tensor -> TensorInfo

    @property
    def n(self) -> int:
        return len(self.nodes)

    def is_const(self, name: str) -> bool:
        return name in self.initializers or name in self.constants

    def succ(self, i: int) -> set[int]:
        return {j for t in self.nodes[i].output if t for j in self.readers.get(t, ())}

    def pred(self, i: int) -> set[int]:
        return {self.producer[t] for t in self.reads[i] if t in self.producer}

    def closure(self, start, step) -> set[int]:
        seen, todo = set(start), list(start)
        while todo:
            for j in step(todo.pop()):
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        return seen

    def descendants(self, start) -> set[int]:
        return self.closure(start, self.succ)

    def ancestors(self, start) -> set[int]:
        return self.closure(start, self.pred)


def outer_reads(graph, defined: set | None = None) -> list[str]:
    """The names a subgraph reads from enclosing scopes (not its inputs, initializers or its own outputs)."""
    defined = set(defined or ()) | {i.name for i in graph.input} | {i.name for i in graph.initializer}
    out: list[str] = []
    for node in graph.node:
        for name in node.input:
            if name and name not in defined and name not in out:
                out.append(name)
        for sub in subgraphs(node):
            for name in outer_reads(sub, defined):
                if name not in out:
                    out.append(name)
        defined.update(o for o in node.output if o)
    return out


def build(model) -> Graph:
    g = model.graph
    out = Graph(model=model, nodes=[])
    out.initializers = {t.name for t in g.initializer} | {t.values.name for t in g.sparse_initializer}
    out.inputs = [i.name for i in g.input if i.name not in out.initializers]
    out.outputs = [o.name for o in g.output]
    for node in g.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and not node.input:
            out.constants[node.output[0]] = node
            continue
        i = len(out.nodes)
        out.nodes.append(node)
        reads = [t for t in node.input if t]
        for sub in subgraphs(node):
            reads += [t for t in outer_reads(sub) if t not in reads]
        out.reads.append(reads)
        for t in node.output:
            if t:
                out.producer[t] = i
    for i, reads in enumerate(out.reads):
        for t in reads:
            if not out.is_const(t):
                out.readers.setdefault(t, []).append(i)
    return out


_ELEM = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 8: "object",
         9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "float16"}  # bf16 sized as 2 bytes


def _value_infos(model) -> dict[str, tuple]:
    """name -> (dtype, shape, ONNX element type) of every tensor shape inference types (declared inputs/outputs included)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - inference fails on some custom ops: fall back to what the file declares
        inferred = model
    g = inferred.graph
    out = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.elem_type:
            continue
        shape = None
        if tt.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        out[vi.name] = (_ELEM.get(tt.elem_type), shape, tt.elem_type)
    return out


def dim_names(model) -> list[str]:
    """The named dynamic dims of the model's inputs, in order."""
    names: list[str] = []
    for vi in model.graph.input:
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param and d.dim_param not in names:
                names.append(d.dim_param)
    return names


def fix_dims(model, sizes: dict[str, int]):
    """A copy of `model` whose inputs' dynamic dims are fixed: named dims from `sizes`, unnamed ones by
    position (key "input:index")."""
    import onnx

    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    init = {t.name for t in model.graph.initializer}
    for vi in fixed.graph.input:
        if vi.name in init:
            continue
        for k, d in enumerate(vi.type.tensor_type.shape.dim):
            key = d.dim_param or f"{vi.name}:{k}"
            if not d.HasField("dim_value") and key in sizes:
                d.Clear()
                d.dim_value = sizes[key]
    return fixed


def infer(graph: Graph, sizes: dict[str, int]) -> None:
    """Fill graph.info: symbolic types from the model, concrete shapes at `sizes`."""
    symbolic = _value_infos(graph.model)
    concrete = _value_infos(fix_dims(graph.model, sizes))
    names = set(symbolic) | set(concrete)
    for name in names:
        dtype, shape, elem = symbolic.get(name, (None, None, None))
        cdtype, cshape, celem = concrete.get(name, (None, None, None))
        full = cshape is not None and all(isinstance(d, int) and d > 0 for d in cshape)
        if cshape is not None and any(d == 0 for d in cshape if isinstance(d, int)):
            full = all(isinstance(d, int) for d in cshape)
        graph.info[name] = TensorInfo(dtype=dtype or cdtype, shape=shape if shape is not None else None,
                                      concrete=list(cshape) if full else None, elem=elem or celem)


def parse_dims(values: list[str] | None) -> dict[str, int]:
    """`--dim NAME=SIZE` items -> {NAME: SIZE}."""
    out: dict[str, int] = {}
    for item in values or []:
        name, sep, size = item.rpartition("=")
        if not sep or not name.strip():
            raise UsageError(f"bad --dim {item!r}: expected NAME=SIZE, e.g. batch=1 (NAME is a dynamic dim of an "
                             "input, as `optkit inspect` shows it)")
        try:
            value = int(size)
        except ValueError:
            raise UsageError(f"bad --dim {item!r}: SIZE must be a positive integer") from None
        if value <= 0 or value > (1 << 20):
            raise UsageError(f"bad --dim {item!r}: SIZE must be between 1 and {1 << 20:,}")
        if name.strip() in out:
            raise UsageError(f"--dim {item!r} sets {name.strip()} a second time")
        out[name.strip()] = value
    return out
