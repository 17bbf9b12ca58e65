"""Runtimes: one module per runtime, registered here by the formats it loads (imported when first used)."""
from optkit.core.formats import Format
from optkit.runtimes.base import register_runtime

register_runtime((Format.ONNX,), "optkit.runtimes.onnx:OnnxSession")
register_runtime((Format.TFLITE,), "optkit.runtimes.tflite:TFLiteSession")
register_runtime((Format.TORCHSCRIPT, Format.TORCH_EXPORT, Format.TORCH_MODULE), "optkit.runtimes.torch:TorchSession")
register_runtime((Format.KERAS, Format.TF_SAVEDMODEL), "optkit.runtimes.tf:TFSession")
register_runtime((Format.TRT_ENGINE,), "optkit.runtimes.tensorrt:TensorRTSession")
register_runtime((Format.HF,), "optkit.runtimes.hf:HFSession")
