"""Size: bytes on disk, gzip bytes (so sparsity shows), parameters and initializer bytes."""
from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import numpy as np

from optkit.core.artifact import Artifact, external_data_files
from optkit.core.formats import Format
from optkit.onnx.graph import all_graphs
from optkit.onnx.io import load as load_onnx


def measure_size(artifact: Artifact) -> dict:
    result = {"bytes": artifact.size_bytes(), "gzip_bytes": gzip_bytes(artifact)}
    result["size_mb"] = result["bytes"] / 1e6
    if artifact.format == Format.ONNX:
        result.update(onnx_parameters(artifact.path))
    return result


def gzip_bytes(artifact: Artifact) -> int | None:
    p = Path(artifact.path)
    if artifact.format == Format.TORCH_MODULE:
        weights = artifact.meta.get("weights")
        if not weights:
            return None
        p = Path(weights)
    if p.is_dir():
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=9) as tar:
            tar.add(p, arcname=p.name)
        return buf.tell()
    files = [p]
    if artifact.format == Format.ONNX:  # the weights of a large model live in its external data files
        files += [f for _, f in external_data_files(p)]
    return sum(len(gzip.compress(f.read_bytes(), compresslevel=9, mtime=0)) for f in files)


def onnx_parameters(path: str) -> dict:
    """Parameters and initializer bytes of an ONNX model (external data included, when present)."""
    from onnx import numpy_helper

    model = load_onnx(path)
    params = 0
    nbytes = 0
    nonzero = 0
    for init in (i for g in all_graphs(model.graph) for i in g.initializer):
        arr = numpy_helper.to_array(init)
        params += arr.size
        nbytes += arr.nbytes
        nonzero += int(np.count_nonzero(arr)) if arr.dtype != object else arr.size
    return {"parameters": params, "initializer_bytes": nbytes,
            "sparsity": (1 - nonzero / params) if params else 0.0}
