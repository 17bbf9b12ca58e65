"""Reading ONNX files with a clear error when they are not ONNX or their external data is missing."""
from __future__ import annotations

from optkit.core.errors import UsageError


def load_onnx(path: str, *, external_data: bool = True):
    import onnx
    from google.protobuf.message import DecodeError

    if external_data:  # a missing or escaping .data file is named, not reported as a corrupt model
        from optkit.core.artifact import external_data_files

        external_data_files(path)
    try:
        model = onnx.load(str(path), load_external_data=external_data)
    except (DecodeError, OSError, ValueError, RuntimeError, onnx.checker.ValidationError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"cannot read {path} as ONNX: {first}; the file is corrupt or truncated") from None
    if not model.graph.node and not model.graph.output:
        raise UsageError(f"cannot read {path} as ONNX: the file holds no graph (corrupt or not ONNX)")
    return model
