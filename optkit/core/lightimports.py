"""Keep torch out of processes that never use it.

`onnxruntime.tools/__init__.py` imports torch whenever it is installed, only to re-export a helper for
`torch.onnx.export` (pytorch_export_helpers.infer_input_info); onnxruntime's quantization pre-processing
(quant_pre_process) imports `onnxruntime.tools` for its symbolic shape inference. Every `optkit quantize` then paid torch's import (3-11 s on 2 busy
cores) and its teardown at exit (several seconds more) for nothing. The stand-in below takes the helper's place
in sys.modules; called, it imports the real module and hands over to it, so nothing changes for a caller that
uses it.
"""
from __future__ import annotations

import importlib
import sys
import types

HELPERS = "onnxruntime.tools.pytorch_export_helpers"


def _real() -> types.ModuleType:
    if sys.modules.get(HELPERS) is _STAND_IN:
        del sys.modules[HELPERS]
    return importlib.import_module(HELPERS)


def _infer_input_info(*args, **kwargs):
    return _real().infer_input_info(*args, **kwargs)


_STAND_IN = types.ModuleType(HELPERS, "optkit's stand-in: imports the real module when it is used")
_STAND_IN.infer_input_info = _infer_input_info


def _getattr(name: str):
    """Any other name is the real module's (the import machinery's dunder look-ups are not)."""
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(_real(), name)


_STAND_IN.__getattr__ = _getattr


def ort_tools_without_torch() -> None:
    """Import onnxruntime.tools with the stand-in as its torch helper (once; nothing when it is imported already)."""
    if "onnxruntime.tools" in sys.modules or HELPERS in sys.modules:
        return
    sys.modules[HELPERS] = _STAND_IN
    try:
        import onnxruntime.tools
    except BaseException:
        sys.modules.pop(HELPERS, None)
        raise
    onnxruntime.tools.pytorch_export_helpers = _STAND_IN  # as an import of the submodule would set it
