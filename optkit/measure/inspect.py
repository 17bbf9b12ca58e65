"""`optkit inspect`: what a model is — format, inputs/outputs, opset, op histogram, parameters, size."""
from __future__ import annotations

from collections import Counter
from typing import Any

from optkit.core.artifact import Artifact
from optkit.core.formats import Format
from optkit.core.isolate import run_isolated
from optkit.measure.size import measure_size
from optkit.onnx.graph import all_nodes
from optkit.onnx.io import load as load_onnx
from optkit.runtimes.base import open_session


def inspect_model(artifact: Artifact) -> dict[str, Any]:
    info: dict[str, Any] = {"path": artifact.path, "format": artifact.format.value, "sha256": artifact.sha256}
    if artifact.format == Format.ONNX:
        info.update(_inspect_onnx(artifact))
    else:
        info.update(run_isolated(_inspect_runtime, artifact, what=f"inspecting {artifact.path}"))
    return info


def _inspect_onnx(artifact: Artifact) -> dict[str, Any]:
    model = load_onnx(artifact.path, external_data=False)
    ops = Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in all_nodes(model.graph))
    return {
        "inputs": _onnx_io(model.graph.input, {i.name for i in model.graph.initializer}),
        "outputs": _onnx_io(model.graph.output, set()),
        "opset": {imp.domain or "ai.onnx": imp.version for imp in model.opset_import},
        "ir_version": model.ir_version,
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "nodes": sum(ops.values()),
        "ops": dict(ops.most_common()),
        "size": measure_size(artifact),
    }


def _onnx_io(values, initializers: set) -> list[dict]:
    from onnx import helper

    out = []
    for v in values:
        if v.name in initializers:
            continue
        t = v.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
        out.append({"name": v.name, "shape": shape, "dtype": helper.tensor_dtype_to_np_dtype(t.elem_type).name
                    if t.elem_type else "unknown"})
    return out


def _inspect_runtime(artifact: Artifact) -> dict[str, Any]:
    session = open_session(artifact)
    info: dict[str, Any] = {
        "runtime": session.runtime,
        "inputs": [s.to_dict() for s in session.inputs],
        "outputs": [s.to_dict() for s in session.outputs],
        "size": measure_size(artifact),
    }
    count = getattr(session, "parameter_count", None)
    if count is not None and count() is not None:
        info["size"]["parameters"] = count()
    ops = getattr(session, "op_histogram", None)
    if ops is not None:
        info["ops"] = ops()
        info["nodes"] = sum(info["ops"].values())
    return info
