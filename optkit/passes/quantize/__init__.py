"""ONNX quantization: dynamic INT8, static INT8 (calibrated), FP16 and INT4 weight-only, accuracy-aware.

Every result is checked against its parent on real (or, when none is given, synthesized) inputs; a model whose
outputs moved past the budget is never reported as success. With a budget (`max_accuracy_drop` or
`max_fidelity_loss`) or `fallback`, nodes are ranked by quantization sensitivity and the most sensitive are
kept in float, step by step, until the budget holds (see search.py).
"""
from __future__ import annotations

from pathlib import Path

from optkit.core.artifact import Artifact
from optkit.core.atomic import atomic_path
from optkit.core.formats import Format
from optkit.core.registry import Pass, PassContext, register
from optkit.passes.quantize.candidates import aside_path, check_rejected_path
from optkit.passes.quantize.config import QuantizeConfig, single_mode
from optkit.passes.quantize.search import Quantizer


@register
class QuantizeOnnx(Pass):
    name = "quantize.onnx"
    summary = "Quantize an ONNX model (mode: dynamic, static, fp16, int4), checked against its parent"
    accepts = (Format.ONNX,)
    produces = Format.ONNX
    extra = None
    Config = QuantizeConfig

    def run(self, artifact: Artifact, config: QuantizeConfig, ctx: PassContext) -> Artifact:
        check_rejected_path(aside_path(ctx), inputs=(artifact.path, artifact.meta.get("weights")))
        with Quantizer(artifact, config, ctx) as q:
            chosen = q.execute()
            with atomic_path(ctx.output) as tmp:
                tmp.write_bytes(Path(chosen).read_bytes())
        return artifact.derive(ctx.output, Format.ONNX, self.name, config.model_dump(mode="json"),
                               mode=config.mode)


@register
class QuantizeDynamic(QuantizeOnnx):
    name = "quantize.onnx-dynamic"
    summary = "Dynamic INT8 (weights int8, activations quantized at run time): transformers, LSTMs"
    Config = single_mode("dynamic")


@register
class QuantizeStatic(QuantizeOnnx):
    name = "quantize.onnx-static"
    summary = "Static INT8 with calibration (QDQ by default), accuracy-aware"
    Config = single_mode("static")


@register
class QuantizeFP16(QuantizeOnnx):
    name = "quantize.onnx-fp16"
    summary = "FP16 weights and activations (inputs and outputs stay float32 by default)"
    extra = "quantize"
    Config = single_mode("fp16")


@register
class QuantizeInt4(QuantizeOnnx):
    name = "quantize.onnx-int4"
    summary = "INT4 weight-only MatMul/Gemm (onnxruntime MatMulNBits) and embedding tables (GatherBlockQuantized)"
    Config = single_mode("int4")
