"""convert.torch, convert.tf and convert.hf: PyTorch, TensorFlow and Hugging Face models to validated ONNX.

Both passes export to a temporary file next to the destination, check it with `onnx.checker` (full shape
inference), run the source framework and onnxruntime on the same inputs (sample data or synthesized ones)
and rename the result into place only when every output is within tolerance. Frameworks are imported inside
`run` (see torch.py and tf.py; common.py holds what they share).
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from optkit.core.artifact import Artifact
from optkit.core.formats import Format
from optkit.core.registry import Pass, PassContext, cli, register
from optkit.passes.convert.common import ConvertConfig, ExportConfig, SynthConfig
from optkit.passes.convert.hf import convert_hf
from optkit.passes.convert.openvino import convert_openvino
from optkit.passes.convert.tf import convert_tf
from optkit.passes.convert.torch import convert_torch
from optkit.runtimes.hf_model import TASKS


@register
class ConvertTorch(Pass):
    name = "convert.torch"
    summary = "PyTorch (factory, TorchScript, ExportedProgram) -> ONNX via torch.onnx, validated"
    accepts = (Format.TORCH_MODULE, Format.TORCHSCRIPT, Format.TORCH_EXPORT)
    produces = Format.ONNX
    extra = "torch"

    class Config(ConvertConfig):
        exporter: Literal["dynamo", "legacy"] = Field(default="dynamo", description="PyTorch exporter: dynamo or "
                                                                                   "legacy.",
                                                      json_schema_extra=cli("--exporter"))
        dynamic: list[str] = Field(default_factory=list,
                                   description="dynamic axes besides the batch (dynamic unless static_batch): "
                                               "NAME:DIM[=LABEL] ('*' for every input); 'batch' is accepted",
                                   json_schema_extra=cli("--dynamic", help="Dynamic axes (PyTorch) besides the "
                                                         "batch: NAME:DIM[=LABEL] (repeatable)."))
        # fall back to the TorchScript exporter when dynamo fails
        fallback: bool = Field(default=True, description="Fall back to the legacy (TorchScript) exporter when "
                                                         "dynamo fails.",
                               json_schema_extra=cli("--no-fallback", sets=False, help="Fail instead of falling "
                                                     "back to the legacy exporter."))

    def run(self, artifact: Artifact, config, ctx: PassContext) -> Artifact:
        return convert_torch(artifact, config, ctx)


@register
class ConvertTF(Pass):
    name = "convert.tf"
    summary = "TensorFlow (SavedModel, Keras .keras/.h5, TFLite float and int8) -> ONNX via tf2onnx, validated"
    accepts = (Format.KERAS, Format.TF_SAVEDMODEL, Format.TFLITE)
    produces = Format.ONNX
    extra = "tf"

    class Config(ConvertConfig):
        signature: str | None = Field(default=None, description="SavedModel signature to convert (default: the "
                                                                "only one, or serving_default).",
                                      json_schema_extra=cli("--signature"))

        @model_validator(mode="before")
        @classmethod
        def _deprecated_dynamic_batch(cls, data):
            """`dynamic_batch` (before static_batch; deprecated): still read, as `static_batch: not it`."""
            if isinstance(data, dict) and "dynamic_batch" in data:
                data = dict(data)
                old = data.pop("dynamic_batch")
                if not isinstance(old, bool):
                    raise ValueError("dynamic_batch (deprecated) must be true or false; write static_batch instead")
                if "static_batch" in data and data["static_batch"] == old:
                    raise ValueError(f"dynamic_batch: {str(old).lower()} (deprecated) contradicts static_batch: "
                                     f"{str(data['static_batch']).lower()}; keep static_batch only")
                data["static_batch"] = not old
            return data

    def run(self, artifact: Artifact, config, ctx: PassContext) -> Artifact:
        return convert_tf(artifact, config, ctx)


@register
class ConvertHF(Pass):
    name = "convert.hf"
    summary = ("Hugging Face transformers / sentence-transformers folder or Hub id -> ONNX via torch.onnx (dynamo), "
               "validated on real text over the unpadded positions")
    accepts = (Format.HF,)
    produces = Format.ONNX
    extra = "hf"

    class Config(ExportConfig):
        task: Literal[tuple(TASKS)] | None = Field(
            default=None, description="What to export (default: from config.json's architectures and "
                                      "sentence-transformers' modules.json): " + ", ".join(TASKS) + ".",
            json_schema_extra=cli("--task", help="Task to export (Hugging Face models; default: from the folder): "
                                  + ", ".join(TASKS) + "."))

    def run(self, artifact: Artifact, config, ctx: PassContext) -> Artifact:
        return convert_hf(artifact, config, ctx)


@register
class ConvertOpenVINO(Pass):
    name = "convert.openvino"
    summary = "ONNX -> OpenVINO IR (.xml + .bin, FP32 weights kept), validated against onnxruntime"
    accepts = (Format.ONNX,)
    produces = Format.OPENVINO_IR
    extra = "openvino"

    Config = SynthConfig

    def run(self, artifact: Artifact, config, ctx: PassContext) -> Artifact:
        return convert_openvino(artifact, config, ctx)
