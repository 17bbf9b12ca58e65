"""Where each node of an ONNX model is meant to run, and why.

Three kinds of node:
  gpu     compute-heavy work the provider runs (convolutions, matrix products, recurrent layers): always in core
  cpu     what must run on the CPU: ops the provider does not support (TensorRT: `optkit trt check`'s table),
          string ops, data-dependent control flow and ops whose output shape depends on the data
  either  light work the provider supports (element-wise, layout, shape arithmetic, reductions, preprocessing):
          the cut decides; between two core nodes it is in core, after a CPU-only node it is on the CPU
Constant nodes belong to no part: each part that reads one gets its own copy, like an initializer.
"""
from __future__ import annotations

from dataclasses import dataclass

from optkit.passes.tensorrt import check

GPU, CPU, EITHER = "gpu", "cpu", "either"
PROVIDERS = ("tensorrt", "cuda", "cpu")

# Work a GPU is for: where a model spends its FLOPs.
HEAVY_OPS = frozenset("""
Conv ConvTranspose ConvInteger DeformConv MatMul MatMulInteger Gemm Einsum Attention LSTM GRU RNN
QLinearConv QLinearMatMul MultiHeadAttention GroupQueryAttention FusedConv FusedMatMul
""".split())
# Control flow and ops whose output shape (or whether they run at all) depends on the values of their inputs:
# the GPU part must have shapes known from the input shapes (TensorRT's engines, CUDA graphs), and a data-dependent
# result has to come back to the host before anyone can size what follows.
DATA_DEPENDENT_OPS = frozenset("""
If Loop Scan NonZero Unique Compress NonMaxSuppression SequenceAt SequenceConstruct SequenceEmpty SequenceErase
SequenceInsert SequenceLength SequenceMap SplitToSequence ConcatFromSequence Optional OptionalGetElement
OptionalHasElement
""".split())
STRING_OPS = frozenset("""
StringConcat StringNormalizer StringSplit RegexFullMatch TfIdfVectorizer LabelEncoder ImageDecoder
""".split())
SHAPE_OPS = frozenset("Shape Size".split())
# onnxruntime's CUDA execution provider: the default-domain ops it has kernels for (onnxruntime 1.2x,
# docs/OperatorKernels.md, "CUDAExecutionProvider"); anything else falls back to its CPU provider.
CUDA_SUPPORTED_OPS = frozenset("""
Abs Add Affine And ArgMax ArgMin Attention AveragePool BatchNormalization BitShift Cast Ceil Celu Clip Concat
ConcatFromSequence Constant ConstantOfShape Conv ConvTranspose Cos CumSum DepthToSpace DequantizeLinear Div
Dropout DynamicQuantizeLinear Einsum Elu Equal Erf Exp Expand EyeLike Flatten Floor GRU Gather GatherElements
GatherND Gelu Gemm GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual GridSample GroupNormalization
HardSigmoid HardSwish Hardmax Identity If InstanceNormalization IsInf IsNaN LRN LSTM LayerNormalization
LeakyRelu Less LessOrEqual Log LogSoftmax Loop MatMul MatMulInteger Max MaxPool Mean Min Mish Mod Mul Neg
NonMaxSuppression NonZero Not OneHot Or PRelu Pad Pow QuantizeLinear RNN RandomNormal RandomNormalLike
RandomUniform RandomUniformLike Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax
ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize ReverseSequence RoiAlign Round
Scan Scatter ScatterElements ScatterND Selu SequenceAt SequenceConstruct SequenceEmpty SequenceErase
SequenceInsert SequenceLength Shape Shrink Sigmoid Sign Sin Size Slice Softmax Softplus Softsign SpaceToDepth
Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile TopK Transpose Trilu Unsqueeze Upsample Where Xor
""".split())


@dataclass
class Place:
    kind: str          # gpu, cpu or either
    why: str


def place(node, provider: str, preprocess: bool = False) -> Place:
    """Where `node` is meant to run under `provider` (tensorrt, cuda or cpu), and why."""
    op, domain = node.op_type, node.domain or ""
    qualified = f"{domain}.{op}" if domain not in ("", "ai.onnx") else op
    if provider == "cpu":
        return Place(CPU, "--provider cpu: everything runs on the CPU")
    if op in STRING_OPS:
        return Place(CPU, f"{qualified}: a string or decoding op (CPU work)")
    if op in DATA_DEPENDENT_OPS:
        return Place(CPU, f"{qualified}: data-dependent control flow or output shape (its result must come back "
                          "to the host before what follows can be sized)")
    if provider == "tensorrt":
        supported, reason = _trt_supported(node)
        if not supported:
            return Place(CPU, reason)
    elif domain not in ("", "ai.onnx") or op not in CUDA_SUPPORTED_OPS:
        return Place(CPU, f"{qualified}: no kernel in onnxruntime's CUDA provider (it would fall back to CPU)")
    if preprocess:
        return Place(EITHER, f"{qualified}: preprocessing (optkit.preprocess): on the CPU in pre when the cut is "
                             "taken at its boundary")
    if op in HEAVY_OPS:
        return Place(GPU, f"{qualified}: compute-heavy, {_NAMES[provider]} runs it")
    if op in SHAPE_OPS:
        return Place(EITHER, f"{qualified}: shape arithmetic on a tiny tensor: placed by the cut")
    return Place(EITHER, f"{qualified}: light op {_NAMES[provider]} supports: placed by the cut")


_NAMES = {"tensorrt": "TensorRT", "cuda": "onnxruntime's CUDA provider"}


def _trt_supported(node) -> tuple[bool, str]:
    """`optkit trt check`'s verdict on one op (its table and plugin rules, not a copy of them)."""
    op, domain = node.op_type, node.domain or ""
    if op in check.TRT_NATIVE_OPS or check._plugin_op(domain, op):
        return True, ""
    if domain not in ("", "ai.onnx"):
        return False, f"{domain}.{op}: not a standard ONNX op; TensorRT would need a plugin"
    if op in check.TRT_UNSUPPORTED_OPS or op not in check.TRT_SUPPORTED_OPS:
        return False, f"{op}: not supported by TensorRT's ONNX parser ({check.TRT_TABLE_SOURCE})"
    return True, ""
