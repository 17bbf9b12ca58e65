"""The served signature of an ONNX model: inputs and outputs with dtypes and dims, read from the graph.

The batch axis is the first dim when it is dynamic in every input and output; where the target batches
(Triton `max_batch_size > 0`) it is dropped from the dims. Other dynamic dims stay -1 (Triton and MLflow
accept them); the warm-up needs them fixed, from `--shape` or the data, and says where each came from.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from optkit.core.errors import UsageError
from optkit.measure.datasets import load_dataset
from optkit.measure.text import is_text_data

# ONNX elem_type -> (Triton data type, numpy dtype name); types a server cannot take are absent.
DTYPES = {
    1: ("TYPE_FP32", "float32"), 2: ("TYPE_UINT8", "uint8"), 3: ("TYPE_INT8", "int8"), 4: ("TYPE_UINT16", "uint16"),
    5: ("TYPE_INT16", "int16"), 6: ("TYPE_INT32", "int32"), 7: ("TYPE_INT64", "int64"), 8: ("TYPE_STRING", "object"),
    9: ("TYPE_BOOL", "bool"), 10: ("TYPE_FP16", "float16"), 11: ("TYPE_FP64", "float64"),
    12: ("TYPE_UINT32", "uint32"), 13: ("TYPE_UINT64", "uint64"), 16: ("TYPE_BF16", "bfloat16"),
}


@dataclass
class Tensor:
    name: str
    elem_type: int
    dims: list[int]                 # whole dims, -1 where dynamic
    dim_names: list[str | None]

    @property
    def triton_type(self) -> str:
        return DTYPES[self.elem_type][0]

    @property
    def numpy_dtype(self) -> str:
        return DTYPES[self.elem_type][1]


@dataclass
class Signature:
    inputs: list[Tensor]
    outputs: list[Tensor]
    batchable: bool                 # the first dim is dynamic in every input and output
    notes: list[str] = field(default_factory=list)

    def served_dims(self, t: Tensor, batching: bool) -> list[int]:
        return t.dims[1:] if batching else list(t.dims)


def read_signature(model: str | Path) -> Signature:
    """Inputs (initializers left out) and outputs of the graph; exit 2 for one a server cannot take."""
    import onnx

    try:
        proto = onnx.load(str(model), load_external_data=False)
    except Exception as e:
        raise UsageError(f"{model}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    return signature_of(proto, model)


def signature_of(proto, model: str | Path) -> Signature:
    """read_signature of a loaded ModelProto (`model` names it in errors)."""
    inits = {i.name for i in proto.graph.initializer}
    inputs = [_tensor(v, "input") for v in proto.graph.input if v.name not in inits]
    outputs = [_tensor(v, "output") for v in proto.graph.output]
    if not inputs or not outputs:
        raise UsageError(f"{model}: the graph has no {'inputs' if not inputs else 'outputs'}; nothing to serve")
    every = inputs + outputs
    batchable = all(t.dims and t.dims[0] == -1 for t in every)
    return Signature(inputs, outputs, batchable)


def _tensor(v, role: str) -> Tensor:
    kind = v.type.WhichOneof("value")
    if kind != "tensor_type":
        raise UsageError(f"{role} {v.name!r} is a {kind or 'untyped value'}, not a tensor; Triton and MLflow serve "
                         "tensors only: export the model with tensor inputs and outputs")
    tt = v.type.tensor_type
    if tt.elem_type not in DTYPES:
        import onnx

        name = onnx.TensorProto.DataType.Name(tt.elem_type) if tt.elem_type else "undefined"
        raise UsageError(f"{role} {v.name!r} has element type {name}, which Triton and MLflow cannot serve; "
                         "cast it to a supported type (float, int, bool, string) in the model")
    if not tt.HasField("shape"):
        raise UsageError(f"{role} {v.name!r} has no shape (not even its rank); a server needs the rank: "
                         "run onnx shape inference or re-export with shapes")
    dims, names = [], []
    for d in tt.shape.dim:
        fixed = d.HasField("dim_value") and d.dim_value > 0
        dims.append(d.dim_value if fixed else -1)
        names.append(d.dim_param or None)
    return Tensor(v.name, tt.elem_type, dims, names)


def warmup_dims(sig: Signature, batching: bool, shapes: dict[str, list[int]], data: str | None,
                model: str | None = None) -> dict:
    """{input: served dims with every dynamic dim fixed}, and notes saying where each fixed dim came from. Text
    data is tokenized by `model`'s own tokenizer: its longest sample fixes the sequence axis.

    Returns (dims by input, notes). A dynamic dim neither --shape nor the data fixes is exit 2, named.
    """
    samples = _data_shapes(data, model) if data else {}
    out, notes = {}, []
    for t in sig.inputs:
        dims = sig.served_dims(t, batching)
        if -1 not in dims:
            out[t.name] = dims
            continue
        given = shapes.get(t.name) or (shapes.get("") if len(sig.inputs) == 1 else None)
        if given is not None:
            whole = list(given)
            fixed = whole[1:] if batching else whole
            source = "--shape"
        elif t.name in samples:
            fixed = list(samples[t.name])  # a sample: the input without its batch axis
            if not batching:
                fixed = [1, *fixed] if len(fixed) == len(dims) - 1 else fixed
            source = f"the data ({Path(data).name})"
        else:
            raise UsageError(f"input {t.name!r} has dynamic dims {_dims_text(t)}; the warm-up needs them fixed: give "
                             f"--shape {t.name}=... or --data with an array named {t.name!r}")
        if len(fixed) != len(dims) or any(d != -1 and d != f for d, f in zip(dims, fixed)):
            raise UsageError(f"input {t.name!r}: {source} gives {fixed} where the served dims are {dims}")
        out[t.name] = fixed
        notes.append(f"warm-up dims of {t.name!r}: {fixed} from {source}")
    return out, notes


def _dims_text(t: Tensor) -> str:
    return "[" + ", ".join(n or "?" if d == -1 else str(d) for d, n in zip(t.dims, t.dim_names)) + "]"


def _data_shapes(data: str, model: str | None) -> dict[str, tuple[int, ...]]:
    import numpy as np

    p = Path(data)
    if is_text_data(p):
        return {k: tuple(a.shape[1:]) for k, a in load_dataset(p, model=model).arrays.items()}
    if p.suffix != ".npz" or not p.is_file():
        raise UsageError(f"--data {data}: the package reads shapes from an .npz file (one array per input) or text "
                         "(.csv, .tsv, .jsonl, .parquet) its model's tokenizer reads")
    try:
        with np.load(p, allow_pickle=False) as z:
            return {k: z[k].shape[1:] for k in z.files}
    except Exception as e:
        raise UsageError(f"--data {data}: not a readable .npz ({type(e).__name__}: {e})") from None
