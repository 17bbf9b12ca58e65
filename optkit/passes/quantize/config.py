"""The quantize passes' options and defaults."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, create_model, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_core import ValidationError as PydanticValidationError

from optkit.core.atomic import PathRole, python_file
from optkit.core.registry import MAX_SAMPLES, PassConfig, cli

MODES = ("dynamic", "static", "fp16", "int4")
# Default fidelity budget per mode: 1 - cosine(FP32 outputs, quantized outputs) on the check inputs.
TOLERANCE = {"fp16": 1e-3, "dynamic": 0.01, "static": 0.02, "int4": 0.03}
MIN_OPSET = {"dynamic": 13, "static": 13, "fp16": 0, "int4": 0}  # per-channel QDQ needs 13
LOWER_IS_BETTER = ("mse", "mae")
# The modes each mode-specific setting acts in. Set to anything but its default under another mode it would be
# ignored, so it is refused (exit 2, naming the key and its flag) instead.
STATIC, DYNAMIC, INT8 = ("static",), ("dynamic",), ("static", "dynamic")
APPLIES: dict[str, tuple[str, ...]] = {
    "format": STATIC, "activation_type": STATIC, "calibration_method": STATIC, "calibration_size": STATIC,
    "synthetic_calibration": STATIC, "per_channel": INT8, "reduce_range": INT8, "weight_type": INT8,
    "fusion": DYNAMIC, "full_search": INT8, "max_latency_ratio": INT8, "allow_slower": INT8,
    "runtime": INT8, "keep_io_types": ("fp16",), "block_size": ("int4",), "symmetric": ("int4",), "accuracy_level": ("int4",),
}


class QuantizeConfig(PassConfig):
    mode: Literal["dynamic", "static", "fp16", "int4"] = Field(
        default="static", description="dynamic, static, fp16 or int4.", json_schema_extra=cli("--mode"))
    # static / dynamic INT8
    # auto: QDQ and QOperator are both built and the fastest (then smallest) that meets the budgets is kept
    format: Literal["auto", "qdq", "qoperator"] = Field(
        default="auto", description="Static INT8 format: auto (both searched, the fastest within budgets kept), qdq "
                                    "or qoperator.", json_schema_extra=cli("--format"))
    # cpu: tuned for onnxruntime on this CPU (latency-aware); tensorrt: symmetric INT8 QDQ that TensorRT builds
    # (int8 activations and weights, zero points 0, per-channel weights, float bias), no CPU latency search
    target: Literal["cpu", "tensorrt"] = Field(
        default="cpu", description="cpu (onnxruntime, latency-aware) or tensorrt (symmetric int8 QDQ, zero points 0, "
                                   "float bias: what TensorRT builds).", json_schema_extra=cli("--target"))
    # the runtime that will serve the file: candidates are built in the forms it runs as int8, scored and timed on it
    runtime: Literal["onnxruntime", "openvino"] = Field(
        default="onnxruntime", description="The runtime candidates are judged on (static/dynamic INT8): onnxruntime, "
                                           "or openvino (static QDQ, which OpenVINO runs with int8 kernels).",
        json_schema_extra=cli(recipe_only="the command's --runtime sets it"))
    # None / auto: searched (both values tried, measured on this machine; CPU flags decide nothing)
    per_channel: Optional[bool] = Field(default=None, description="Per-channel weights (default: both searched).",
                                        json_schema_extra=cli("--per-channel", secondary="--per-tensor"))
    reduce_range: Optional[bool] = Field(default=None, description="7-bit weights (default: both searched).",
                                         json_schema_extra=cli("--reduce-range", secondary="--no-reduce-range"))
    activation_type: Literal["auto", "uint8", "int8"] = Field(
        default="auto", description="auto (both searched), uint8 or int8.", json_schema_extra=cli("--activation-type"))
    weight_type: Literal["int8", "uint8"] = Field(default="int8", description="int8 or uint8.",
                                                  json_schema_extra=cli("--weight-type"))
    # minmax first; percentile and entropy are tried for the best candidates when none meets the budget,
    # unless a method is given
    calibration_method: Literal["minmax", "entropy", "percentile"] = Field(
        default="minmax", description="minmax, entropy or percentile (default: minmax, then the others when minmax "
                                      "misses the budget).", json_schema_extra=cli("--calibration-method", group="data"))
    calibration_size: int = Field(default=256, ge=1, le=MAX_SAMPLES, description="Calibration samples.",
                                  json_schema_extra=cli("--calibration-size", group="data"))
    # random calibration inputs: only when asked, warned loudly
    synthetic_calibration: bool = Field(default=False, description="Calibrate on random inputs (warned loudly).",
                                        json_schema_extra=cli("--synthetic-calibration", group="data"))
    preprocess: bool = Field(default=True, description="Shape inference + optimization before quantizing.",
                             json_schema_extra=cli("--no-preprocess", sets=False,
                                                   help="Skip shape inference + optimization."))
    # dynamic: onnxruntime's transformer fusions tried as extra candidates (contrib ops: the file then runs on
    # onnxruntime only); the timing race keeps them only where they are faster
    fusion: bool = Field(default=True, description="Dynamic: also try onnxruntime's transformer fusions (Attention, "
                                                   "EmbedLayerNormalization; onnxruntime-only ops).",
                         json_schema_extra=cli("--no-fusion", sets=False,
                                               help="Dynamic: do not try onnxruntime's transformer fusions (keep "
                                                    "standard ONNX ops only)."))
    nodes_include: list[str] = Field(default_factory=list, description="Quantize only these nodes.",
                                     json_schema_extra=cli("--include-node"))
    nodes_exclude: list[str] = Field(default_factory=list, description="Keep these nodes float.",
                                     json_schema_extra=cli("--exclude-node"))
    op_types_include: list[str] = Field(default_factory=list, description="Quantize only these op types.",
                                        json_schema_extra=cli("--include-op"))
    op_types_exclude: list[str] = Field(default_factory=list, description="Keep these op types float.",
                                        json_schema_extra=cli("--exclude-op"))
    # fp16
    keep_io_types: bool = Field(default=True, description="fp16: keep float32 inputs/outputs.",
                                json_schema_extra=cli("--keep-io-types", secondary="--fp16-io"))
    # int4
    block_size: int = Field(default=32, ge=16, le=65536, description="int4: weights per scale.",
                            json_schema_extra=cli("--block-size"))
    symmetric: bool = Field(default=True, description="int4: symmetric weight quantization.",
                            json_schema_extra=cli(recipe_only="int4 expert setting, rarely changed"))
    accuracy_level: Optional[int] = Field(default=None, ge=0, le=4,
                                          description="int4: onnxruntime MatMulNBits accuracy level (0-4).",
                                          json_schema_extra=cli(recipe_only="int4 expert setting, rarely changed"))
    # the check and the accuracy-aware search
    metric: Annotated[Optional[str], PathRole("input", names=python_file)] = Field(
        default=None, description="top1 (or accuracy), top5, f1, spearman, pearson, exact_match, mse, mae, cosine or "
                                  "module:function (a custom metric runs your code).",
                                  json_schema_extra=cli("--metric", group="evaluation"))
    max_accuracy_drop: Optional[float] = Field(default=None, ge=0, le=1e9, description="Budget: metric drop (0.01 = 1 point).",
                                               json_schema_extra=cli("--max-accuracy-drop", group="budgets"))
    # the drop is judged by its upper confidence bound on the eval data, not its point (budget.drop_bound)
    budget_confidence: float = Field(default=0.95, ge=0.5, le=0.999,
                                     description="max_accuracy_drop holds on fresh data with this confidence: a "
                                                 "candidate passes when the one-sided upper bound of its drop is "
                                                 "within the budget (0.5: the measured drop).",
                                     json_schema_extra=cli("--budget-confidence", group="budgets"))
    max_fidelity_loss: Optional[float] = Field(default=None, ge=0, le=2, description="Budget: 1 - cosine to the FP32 outputs.",
                                               json_schema_extra=cli("--max-fidelity-loss", group="budgets"))
    # the mode's fidelity budget (1 - cosine)
    tolerance: Optional[float] = Field(default=None, ge=0, le=2, description="The check's fidelity budget (default per mode).",
                                       json_schema_extra=cli("--tolerance", group="budgets"))
    # keep sensitive nodes in float when the check fails
    fallback: bool = Field(default=False, description="When the check fails, keep sensitive nodes in float until it "
                                                      "holds.", json_schema_extra=cli("--fallback", group="budgets"))
    # settings and fallback steps tried, all told
    max_candidates: int = Field(default=20, ge=1, le=10_000, description="Candidates the search may try.",
                                json_schema_extra=cli("--max-candidates", group="budgets"))
    # seconds the search may take before it stops trying
    time_budget: Optional[float] = Field(default=600, gt=0, le=30 * 86_400, description="Seconds the search may take.",
                                         json_schema_extra=cli("--time-budget", group="budgets"))
    # budgets are judged on the whole eval set unless a subset is asked for (then reported with its size and
    # sampling noise); candidates are first screened on `screen_samples` and only the plausible ones scored
    check_samples: Optional[int] = Field(default=None, ge=1, le=MAX_SAMPLES,
                                         description="Judge budgets on this many eval samples (default: all; a subset "
                                                     "is reported with its sampling noise).",
                                         json_schema_extra=cli("--check-samples", group="evaluation"))
    screen_samples: int = Field(default=64, ge=1, le=MAX_SAMPLES, description="Eval samples each candidate is first screened on.",
                                json_schema_extra=cli(recipe_only="search internals; --check-samples is the knob"))
    check_outputs: list[str] = Field(default_factory=list,
                                     description="Budgets judge this output only (repeatable; default: every output).",
                                     json_schema_extra=cli("--check-output", group="evaluation"))
    measure_candidates: bool = Field(default=True, description="Time the candidates that meet the budgets.",
                                     json_schema_extra=cli(recipe_only="search internals (tests turn it off)"))
    # search the settings space (static, dynamic); off: only the first setting, then the node fallback if asked
    latency_search: bool = Field(default=True, description="Search formats, types, per-channel, reduce-range and "
                                                           "calibration for the fastest within budgets.",
                                 json_schema_extra=cli("--no-latency-search", sets=False,
                                                       help="Build only the first setting (no search over formats, "
                                                            "types, per-channel, reduce-range, calibration)."))
    # static / dynamic INT8 for the CPU: settings this CPU's kernel table (kernels.py, cached per machine) says cannot
    # win are skipped unless none of the others meets the budgets; full_search builds them all
    full_search: bool = Field(default=False, description="Build every setting of the search, also those this CPU's "
                                                         "int8 kernel table says cannot win.",
                              json_schema_extra=cli("--full-search"))
    # size budget: output bytes / input bytes
    max_size_ratio: Optional[float] = Field(default=None, gt=0, le=1000, description="Budget: output size / input size (e.g. "
                                                                            "0.3).",
                                            json_schema_extra=cli("--max-size-ratio", group="budgets"))
    # A static or dynamic INT8 model slower than its parent is an error (exit 3) unless allowed: p50 at batch 1 on one
    # thread must not exceed max_latency_ratio x the parent's beyond the timing noise (the 95% interval of the
    # paired ratio lies wholly above it); the 5% margin covers the lasting offset between two sessions
    max_latency_ratio: float = Field(default=1.05, gt=0, le=1000,
                                     description="Static/dynamic INT8: slower means p50 (batch 1, 1 thread) above this x the "
                                                 "parent's beyond the timing noise.",
                                     json_schema_extra=cli("--max-latency-ratio", group="budgets"))
    allow_slower: bool = Field(default=False, description="Static/dynamic INT8: write the result even when it is slower than "
                                                          "its parent (otherwise exit 3, the model kept as "
                                                          ".REJECTED.onnx).",
                               json_schema_extra=cli("--allow-slower", group="budgets"))
    compact: bool = Field(default=True, description="Short internal names: smaller files, same math.",
                          json_schema_extra=cli(recipe_only="file-size detail; the math is the same either way"))

    @model_validator(mode="after")
    def _settings_apply(self):
        """A setting the mode (or the other settings) would ignore is an error naming it, never dropped silently."""
        for key, modes in APPLIES.items():
            value = getattr(self, key)
            if self.mode not in modes and value != type(self).model_fields[key].get_default(call_default_factory=True):
                _refuse(self, key, value, f"applies to mode {' or '.join(modes)} only, not {self.mode}; remove it")
        if self.full_search and not self.latency_search:
            _refuse(self, "full_search", True, "builds every setting of the search, and latency_search is off "
                    "(--no-latency-search: the first setting only); give one of them")
        if self.runtime == "openvino" and self.target != "cpu":
            _refuse(self, "runtime", self.runtime, f"openvino runs on the CPU; target {self.target} is another "
                    "runtime's: give one of them")
        if self.runtime == "openvino" and self.mode == "dynamic":
            _refuse(self, "runtime", self.runtime, "onnxruntime's dynamic int8 ops run in float on OpenVINO (slower "
                    "than FP32): use mode static with calibration data (for a text model, its text rows)")
        if self.runtime == "openvino" and self.format == "qoperator":
            _refuse(self, "format", self.format, "OpenVINO runs int8 from QDQ graphs: use format qdq (or auto)")
        if self.full_search and self.target != "cpu":
            _refuse(self, "full_search", True, f"target {self.target} builds one setting (no search); remove it")
        return self


def _refuse(cfg, key: str, value, message: str):
    raise PydanticValidationError.from_exception_data(type(cfg).__name__, [InitErrorDetails(
        type=PydanticCustomError("value_error", message), loc=(key,), input=value)])


def single_mode(mode: str):
    """The config of a single-mode alias: same fields, `mode` fixed."""
    return create_model(f"Quantize{mode.title()}Config", __base__=QuantizeConfig,
                        mode=(Literal[mode], Field(default=mode, description=f"{mode} (fixed by this pass).",  # type: ignore[valid-type]
                                                   json_schema_extra=cli("--mode"))))
