"""The quantize passes' options and defaults."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, create_model

from optkit.core.registry import PassConfig

MODES = ("dynamic", "static", "fp16", "int4")
# Default fidelity budget per mode: 1 - cosine(FP32 outputs, quantized outputs) on the check inputs.
TOLERANCE = {"fp16": 1e-3, "dynamic": 0.01, "static": 0.02, "int4": 0.03}
MIN_OPSET = {"dynamic": 13, "static": 13, "fp16": 0, "int4": 0}  # per-channel QDQ needs 13
LOWER_IS_BETTER = ("mse", "mae")


class QuantizeConfig(PassConfig):
    mode: Literal["dynamic", "static", "fp16", "int4"] = "static"
    # static / dynamic INT8
    # auto: QDQ and QOperator are both built and the fastest (then smallest) that meets the budgets is kept
    format: Literal["auto", "qdq", "qoperator"] = "auto"   # auto: both are searched
    # cpu: tuned for onnxruntime on this CPU (latency-aware); tensorrt: symmetric INT8 QDQ that TensorRT builds
    # (int8 activations and weights, zero points 0, per-channel weights, float bias), no CPU latency search
    target: Literal["cpu", "tensorrt"] = "cpu"
    # None / auto: searched (both values tried, measured on this machine; CPU flags decide nothing)
    per_channel: Optional[bool] = None
    reduce_range: Optional[bool] = None
    activation_type: Literal["auto", "uint8", "int8"] = "auto"
    weight_type: Literal["int8", "uint8"] = "int8"
    # minmax first; percentile and entropy are tried for the best candidates when none meets the budget,
    # unless a method is given
    calibration_method: Literal["minmax", "entropy", "percentile"] = "minmax"
    calibration_size: int = Field(default=256, ge=1)
    synthetic_calibration: bool = False     # random calibration inputs: only when asked, warned loudly
    preprocess: bool = True                 # shape inference + optimization before quantizing
    nodes_include: list[str] = Field(default_factory=list)
    nodes_exclude: list[str] = Field(default_factory=list)
    op_types_include: list[str] = Field(default_factory=list)
    op_types_exclude: list[str] = Field(default_factory=list)
    # fp16
    keep_io_types: bool = True
    # int4
    block_size: int = Field(default=32, ge=16)
    symmetric: bool = True
    accuracy_level: Optional[int] = Field(default=None, ge=0, le=4)
    # the check and the accuracy-aware search
    metric: Optional[str] = None
    max_accuracy_drop: Optional[float] = Field(default=None, ge=0)
    max_fidelity_loss: Optional[float] = Field(default=None, ge=0)
    tolerance: Optional[float] = Field(default=None, ge=0)  # the mode's fidelity budget (1 - cosine)
    fallback: bool = False                  # keep sensitive nodes in float when the check fails
    max_candidates: int = Field(default=20, ge=1)         # settings and fallback steps tried, all told
    time_budget: Optional[float] = Field(default=600, gt=0)  # seconds the search may take before it stops trying
    # budgets are judged on the whole eval set unless a subset is asked for (then reported with its size and
    # sampling noise); candidates are first screened on `screen_samples` and only the plausible ones scored
    check_samples: Optional[int] = Field(default=None, ge=1)
    screen_samples: int = Field(default=64, ge=1)
    check_outputs: list[str] = Field(default_factory=list)  # the outputs budgets judge (default: all)
    measure_candidates: bool = True         # time the candidates that meet the budgets (in a child process)
    # search the settings space (static, dynamic); off: only the first setting, then the node fallback if asked
    latency_search: bool = True
    max_size_ratio: Optional[float] = Field(default=None, gt=0)   # size budget: output bytes / input bytes
    # A static INT8 model slower than its parent is an error (exit 3) unless allowed: p50 at batch 1 on one
    # thread must not exceed max_latency_ratio x the parent's beyond the timing noise (the 95% interval of the
    # paired ratio lies wholly above it); the 5% margin covers the lasting offset between two sessions
    max_latency_ratio: float = Field(default=1.05, gt=0)
    allow_slower: bool = False
    compact: bool = True                    # short internal names: smaller files, same math


def single_mode(mode: str):
    """The config of a single-mode alias: same fields, `mode` fixed."""
    return create_model(f"Quantize{mode.title()}Config", __base__=QuantizeConfig,
                        mode=(Literal[mode], mode))  # type: ignore[valid-type]
