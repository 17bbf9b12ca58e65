"""Runtimes: one module per runtime, registered here by the formats it loads and its name (--runtime), imported
when first used. The first runtime registered for a format is its default."""
from optkit.core.formats import Format
from optkit.runtimes.base import register_runtime

register_runtime((Format.ONNX,), "optkit.runtimes.onnx:OnnxSession", "onnxruntime")
register_runtime((Format.OPENVINO_IR,), "optkit.runtimes.openvino:OpenVINOSession", "openvino")
register_runtime((Format.ONNX,), "optkit.runtimes.openvino:OpenVINOSession", "openvino", default=False)
register_runtime((Format.TFLITE,), "optkit.runtimes.tflite:TFLiteSession", "tflite")
register_runtime((Format.TORCHSCRIPT, Format.TORCH_EXPORT, Format.TORCH_MODULE), "optkit.runtimes.torch:TorchSession",
                 "torch")
register_runtime((Format.KERAS, Format.TF_SAVEDMODEL), "optkit.runtimes.tf:TFSession", "tensorflow")
register_runtime((Format.TRT_ENGINE,), "optkit.runtimes.tensorrt:TensorRTSession", "tensorrt")
register_runtime((Format.HF,), "optkit.runtimes.hf:HFSession", "transformers")
