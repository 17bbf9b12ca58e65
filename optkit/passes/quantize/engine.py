"""One strategy per quantize mode: the settings it searches, and how onnxruntime (or onnxconverter-common)
builds a candidate file from the prepared float model and one point of that space.

Static INT8 calibrates once per calibration method: the tensor ranges are cached in the scratch folder
(onnxruntime's `calibration_cache_path`) and every other candidate of that method reuses them.
"""
from __future__ import annotations

import contextlib
import itertools
import sys
from dataclasses import replace
from pathlib import Path

from optkit.core.batching import calls
from optkit.onnx import io as onnx_io
from optkit.passes.quantize import bias
from optkit.passes.quantize import ops as qops
from optkit.passes.quantize.candidates import Settings
from optkit.passes.quantize.config import QuantizeConfig

# onnxruntime extra_options for TensorRT-ready QDQ: symmetric int8 (zero points 0), bias left float
TENSORRT_OPTIONS = {"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False}
# the per-channel int32-bias weight-scale adjustment crashes in onnxruntime 1.2x-1.3x
NO_BIAS_ADJUST = {"QDQDisableWeightAdjustForInt32Bias": True, "WeightAdjustForInt32Bias": False}


def calibration_reader(specs: list, feeds: dict):
    """onnxruntime CalibrationDataReader over the calibration samples, in calls the model accepts
    (core.batching.calls). Calls are made as onnxruntime asks for them, so lazily read feeds
    (measure.datasets: `Dataset.bind(specs, stream=True)`) hold one call's inputs at a time; `rewind` starts over."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._it = calls(specs, feeds)

        def get_next(self):
            return next(self._it, None)

        def rewind(self):
            self._it = calls(specs, feeds)

    return Reader()


class Strategy:
    mode = ""

    def __init__(self, cfg: QuantizeConfig, work: Path):
        self.cfg, self.work = cfg, work

    def space(self) -> list[Settings]:
        """The settings to try, cheapest and likeliest first; the first is the default candidate."""
        return [Settings()]

    def slower_tier(self, best: list[Settings]) -> list[Settings]:
        """Settings worth trying only when the first tier misses the budget (e.g. costlier calibrations)."""
        return []

    def build(self, prepared: Path, settings: Settings, dest: Path, calibration=None, exclude=()) -> None:
        raise NotImplementedError

    def _choices(self, value, default: list):
        return [value] if value is not None else default


class Dynamic(Strategy):
    """Weights int8 ahead of time, activations quantized at run time: op types x per-channel x reduce-range.
    The op types: MatMul/attention/recurrent alone first (what int8 kernels make faster), then with Conv and
    Gather too (smaller, but ConvInteger is usually slower than float Conv), each only where the model has them;
    where only Gather (embedding tables) would stay float, everything quantized first (same speed, far smaller)."""

    mode = "dynamic"

    def __init__(self, cfg: QuantizeConfig, work: Path):
        super().__init__(cfg, work)
        self.present: set[str] = set()   # the op types of the prepared model, set by the search's preparation
        self.fused: Path | None = None   # the transformer-fused model (fusion.py), set by the preparation

    def tiers(self) -> list[tuple[tuple[str, ...] | None, tuple[str, ...]]]:
        """(op types to quantize, op types kept float) per tier; the user's op_types_include is one tier as given."""
        cfg = self.cfg
        if cfg.op_types_include:
            return [(None, ())]
        have = [op for op in qops.DYNAMIC_OPS if op in self.present and op not in cfg.op_types_exclude]
        if not have:  # no constant weight the tiers know: onnxruntime's defaults, as the user narrowed them (an
            # empty op_types_to_quantize would mean all of them to onnxruntime)
            return [(tuple(op_types(cfg, "dynamic")) if cfg.op_types_exclude else None, ())]
        fast = tuple(op for op in have if op in qops.DYNAMIC_FAST)
        slow = tuple(op for op in have if op in qops.DYNAMIC_SLOW)
        tiers = [(fast, slow)] if fast else []
        if slow or not fast:
            tiers.append((fast + slow, ()))
        return tiers

    def space(self) -> list[Settings]:
        """Each tier x per-channel x reduce-range; with a fused model, each tier's full-range points built from it
        too, right after their unfused twins (the timing race keeps whichever is faster). A tier that keeps only
        the embedding tables (Gather) float is no faster, only larger: it waits in the slower tier, tried when
        nothing quantized in full meets the budget."""
        tiers = self.tiers()
        return [p for tier in tiers if not self._tables_only(tier, tiers) for p in self._points(*tier)]

    def slower_tier(self, best: list[Settings]) -> list[Settings]:
        tiers = self.tiers()
        return [p for tier in tiers if self._tables_only(tier, tiers) for p in self._points(*tier)]

    @staticmethod
    def _tables_only(tier, tiers) -> bool:
        return len(tiers) > 1 and tuple(tier[1]) == ("Gather",)

    def _points(self, ops, floats) -> list[Settings]:
        cfg = self.cfg
        points = []
        for pc, rr in itertools.product(self._choices(cfg.per_channel, [True, False]),
                                        self._choices(cfg.reduce_range, [False, True])):
            point = Settings(weight_type=cfg.weight_type, per_channel=pc, reduce_range=rr, op_types=ops,
                             float_ops=floats)
            points.append(point)
            if self.fused is not None and not rr and ops is not None:
                points.append(replace(point, fused=True))
        return points

    def build(self, prepared, settings, dest, calibration=None, exclude=()) -> None:
        from onnx import TensorProto
        from onnxruntime.quantization import QuantType, quantize_dynamic

        cfg = self.cfg
        with contextlib.redirect_stdout(sys.stderr):  # onnxruntime prints progress; keep --json clean
            ops = list(settings.op_types) if settings.op_types is not None else op_types(cfg, "dynamic")
            if settings.fused:
                prepared, ops = self.fused, fused_ops(ops, cfg.op_types_exclude)
            # DefaultTensorType: outputs of contrib ops (and of graphs shape inference gives up on) have no type
            # onnxruntime's quantizer can read; every tensor it asks about here is float
            quantize_dynamic(str(prepared), str(dest), op_types_to_quantize=ops,
                             per_channel=settings.per_channel, reduce_range=settings.reduce_range,
                             weight_type=QuantType.QInt8 if settings.weight_type == "int8" else QuantType.QUInt8,
                             nodes_to_quantize=cfg.nodes_include or None, nodes_to_exclude=list(exclude),
                             extra_options={"MatMulConstBOnly": True, "DefaultTensorType": TensorProto.FLOAT})


def fused_ops(ops: list[str], exclude=()) -> list[str]:
    """A tier's op types as the fused model holds them: the attention MatMuls are inside Attention, the
    embedding tables (Gather) inside EmbedLayerNormalization; an op type the user keeps float (`exclude`,
    op_types_exclude) stays float there too."""
    extra = (["Attention"] if "MatMul" in ops else []) + (["EmbedLayerNormalization"] if "Gather" in ops else [])
    return [*ops, *(op for op in extra if op not in ops and op not in exclude)]


class Static(Strategy):
    """Calibrated INT8. For the CPU: format x activation type x per-channel x reduce-range, minmax calibration
    first, percentile and entropy for the best of those when none meets the budget. For TensorRT: symmetric
    signed INT8 QDQ only."""

    mode = "static"

    def __init__(self, cfg: QuantizeConfig, work: Path):
        super().__init__(cfg, work)
        self._means = None   # per-channel means of the layers' float inputs, for bias correction
        self._products: list[str] | None = None   # a transformer's products with weights (_weight_products)

    def _weight_products(self, prepared) -> list[str]:
        """In a transformer (a model with a Softmax or an Attention op), the MatMul and Gemm nodes whose second
        input is a weight; none in any other model."""
        if self._products is None:
            model = onnx_io.load(prepared, external_data=False)
            inits = {i.name for i in model.graph.initializer}
            nodes = model.graph.node
            attention = any(n.op_type in ("Softmax", "Attention", "MultiHeadAttention") for n in nodes)
            self._products = [n.name for n in nodes if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1
                              and n.input[1] in inits and n.name] if attention else []
        return self._products

    def space(self) -> list[Settings]:
        cfg = self.cfg
        if cfg.target == "tensorrt":
            # per-tensor weights by default: with symmetric activations onnxruntime 1.32's per-channel QDQ moved
            # the sample CNN to cosine 0.979 (per-tensor: 0.996); --per-channel asks for it anyway
            return [Settings(format="qdq", activation_type="int8", weight_type="int8", per_channel=bool(cfg.per_channel),
                             reduce_range=False, calibration=cfg.calibration_method)]
        if cfg.runtime == "openvino":
            return self._openvino_space()
        formats = ["qdq", "qoperator"] if cfg.format == "auto" else [cfg.format]
        acts = ["uint8", "int8"] if cfg.activation_type == "auto" else [cfg.activation_type]
        space = []
        for fmt, act in itertools.product(formats, acts):
            # QOperator per-channel trips onnxruntime's int32-bias path on some graphs: per-tensor first there
            channels = self._choices(cfg.per_channel, [True, False] if fmt == "qdq" else [False, True])
            for pc, rr in itertools.product(channels, self._choices(cfg.reduce_range, [False, True])):
                space.append(Settings(format=fmt, activation_type=act, weight_type=cfg.weight_type, per_channel=pc,
                                      reduce_range=rr, calibration=cfg.calibration_method))
        return space

    def _openvino_space(self) -> list[Settings]:
        """What OpenVINO runs as int8: QDQ (its low-precision transformations turn the pairs around a layer into
        an int8 kernel; QOperator ops it runs in float), either activation type, per-channel weights first. No
        7-bit weights: OpenVINO's int8 kernels do not overflow where onnxruntime's u8 x s8 ones may."""
        cfg = self.cfg
        acts = ["uint8", "int8"] if cfg.activation_type == "auto" else [cfg.activation_type]
        return [Settings(format="qdq", activation_type=act, weight_type=cfg.weight_type, per_channel=pc,
                         reduce_range=bool(cfg.reduce_range), calibration=cfg.calibration_method)
                for act in acts for pc in self._choices(cfg.per_channel, [True, False])]

    def slower_tier(self, best: list[Settings]) -> list[Settings]:
        """Bias correction of the best two settings (no new calibration; two, since the best by error alone may be
        the slower activation type on this CPU, and timing decides), then percentile and entropy calibration of
        the same two (unless a method was given)."""
        if self.cfg.target == "tensorrt":
            return []
        tier = [replace(s, bias_correction=True) for s in best]
        if "calibration_method" not in self.cfg.model_fields_set:
            tier += [replace(s, calibration=method) for method in ("percentile", "entropy") for s in best]
        return tier

    def build(self, prepared, settings, dest, calibration=None, exclude=()) -> None:
        if settings.bias_correction:
            prepared = self._bias_corrected(prepared, settings, dest, calibration, exclude)
        self._quantize(prepared, settings, dest, calibration, exclude)

    def _bias_corrected(self, prepared, settings, dest, calibration, exclude) -> Path:
        """The float model with its biases corrected for this setting's weight rounding: built once without the
        correction to read the rounded weights back (bias.py)."""
        model = onnx_io.load(prepared)
        if self._means is None:
            self._means = bias.input_means(model, calibration(), self.work / "bias-means.onnx")
        self._quantize(prepared, replace(settings, bias_correction=None), dest, calibration, exclude)
        if not bias.correct(model, onnx_io.load(dest), self._means):
            raise ValueError("no Conv or Gemm layer with int8 weights to correct")
        out = self.work / f"{Path(dest).stem}.bias-corrected.onnx"
        onnx_io.save(model, out)
        return out

    def _quantize(self, prepared, settings, dest, calibration, exclude) -> None:
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

        cfg = self.cfg
        qt = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
        method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                  "percentile": CalibrationMethod.Percentile}[settings.calibration]
        cache = self.work / f"calibration-{settings.calibration}.json"
        ops, nodes = op_types(cfg, "static", settings.format), cfg.nodes_include or None
        if ops is None and nodes is None and cfg.runtime == "openvino" and self._weight_products(prepared):
            # a transformer on OpenVINO: its products with weights in int8. onnxruntime's default QDQ also wraps
            # the mask's Add and the Softmax, whose -3.4e38 mask values gave NaN sentence embeddings on OpenVINO,
            # and int8 activations on both sides of attention's products cost all-MiniLM-L6-v2 0.02 Spearman
            ops, nodes = ["MatMul", "Gemm"], self._weight_products(prepared)
        with contextlib.redirect_stdout(sys.stderr):
            quantize_static(
                str(prepared), str(dest), None if cache.exists() else calibration(),
                quant_format=QuantFormat.QDQ if settings.format == "qdq" else QuantFormat.QOperator,
                op_types_to_quantize=ops, per_channel=settings.per_channel,
                reduce_range=settings.reduce_range, activation_type=qt[settings.activation_type],
                weight_type=qt[settings.weight_type], nodes_to_quantize=nodes,
                nodes_to_exclude=list(exclude), calibrate_method=method, calibration_cache_path=str(cache),
                extra_options={**NO_BIAS_ADJUST, **(TENSORRT_OPTIONS if cfg.target == "tensorrt" else {})})


class FP16(Strategy):
    mode = "fp16"

    def build(self, prepared, settings, dest, calibration=None, exclude=()) -> None:
        from onnxconverter_common import float16

        cfg = self.cfg
        model = onnx_io.load(prepared)
        block = set(exclude)
        if cfg.nodes_include:
            block |= {n.name for n in model.graph.node if n.name not in cfg.nodes_include}
        out = float16.convert_float_to_float16(model, keep_io_types=cfg.keep_io_types,
                                               node_block_list=sorted(block) or None,
                                               op_block_list=cfg.op_types_exclude or None)
        onnx_io.save(out, dest)


class Int4(Strategy):
    """Weight-only INT4: MatMul (MatMulNBits) and float embedding tables (GatherBlockQuantized)."""

    mode = "int4"

    def __init__(self, cfg: QuantizeConfig, work: Path):
        super().__init__(cfg, work)
        self.gathers: list[str] = []   # set by the search's preparation (qops.int4_gathers)

    def build(self, prepared, settings, dest, calibration=None, exclude=()) -> None:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        cfg = self.cfg
        model = onnx_io.load(prepared)
        # only float embedding tables: any other Gather (shape arithmetic, int tables) is left alone
        exclude = sorted(set(exclude) | {n.name for n in model.graph.node
                                         if n.op_type == "Gather" and n.name not in self.gathers})
        q = MatMulNBitsQuantizer(model, bits=4, block_size=cfg.block_size, is_symmetric=cfg.symmetric,
                                 accuracy_level=cfg.accuracy_level, nodes_to_exclude=exclude,
                                 nodes_to_include=cfg.nodes_include or None,
                                 op_types_to_quantize=("MatMul", "Gather") if self.gathers else ("MatMul",))
        q.process()
        onnx_io.save(q.model.model, dest)


STRATEGIES = {s.mode: s for s in (Dynamic, Static, FP16, Int4)}


def strategy_for(cfg: QuantizeConfig, work: Path) -> Strategy:
    return STRATEGIES[cfg.mode](cfg, work)


def op_types(cfg: QuantizeConfig, mode: str, fmt: str | None = None) -> list[str] | None:
    """The op types to quantize when the user narrowed them (None: onnxruntime's defaults)."""
    if not cfg.op_types_include and not cfg.op_types_exclude:
        return None
    if cfg.op_types_include:
        base = list(cfg.op_types_include)
        if mode == "dynamic" and "Gemm" in base and "MatMul" not in base:
            base.append("MatMul")  # dynamic: Gemm nodes were rewritten as MatMul (onnxruntime's only integer GEMM)
    else:
        from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry, QLinearOpsRegistry

        reg = IntegerOpsRegistry if mode == "dynamic" else (QDQRegistry if fmt == "qdq" else QLinearOpsRegistry)
        base = sorted(reg)
    return [t for t in base if t not in cfg.op_types_exclude]


def contrib_excludes(model) -> set[str]:
    """Nodes onnxruntime's quantizers would turn into contrib ops that do not load (qops.CONTRIB_ONLY)."""
    return {n.name for n in qops.contrib_lookalikes(model)}

