"""`optkit trt check`: what can be known about a TensorRT build without a GPU.

A static look at an ONNX model (only `onnx` and numpy are used, so a CPU-only CI can run it):
ops TensorRT's ONNX parser does not support, plugin ops (warnings: they build when the plugin is registered),
dynamic input dims without a profile, DOUBLE weights, input dtypes TensorRT cannot bind, and Q/DQ placements
TensorRT's explicit quantization rejects (non-zero zero points, UINT8, per-channel activations, int32 bias,
computed scales, Q without DQ). Each DequantizeLinear is traced back to its producer: a constant float weight
quantized by a QuantizeLinear (per channel, as QAT and ModelOpt export it) is a weight, not an activation.

Each finding has a severity:
  error    the build will fail (or the engine will be wrong): blocks the build
  warning  the build probably works, but check it (precision loss, documented limits)
  info     worth knowing
`optkit trt check` exits 0 when there is no error and 3 when there is (like a failed validation);
`--strict` makes warnings blocking too. The parser on a GPU remains the final word: this table is
TensorRT 10's, and an installed TensorRT may support more.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from optkit.core.errors import UsageError
from optkit.core.shapes import parse_shapes
from optkit.onnx import io as onnx_io
from optkit.onnx.graph import subgraphs

# The ONNX operators TensorRT 10's ONNX parser supports ("Y") and explicitly does not ("N"), default domain.
# Source: onnx/onnx-tensorrt, docs/operators.md, "TensorRT 10.15 supports operators in the inclusive range
# of opset 9 to opset 24" (the operator support matrix of the TensorRT 10.x parser).
TRT_TABLE_SOURCE = "onnx/onnx-tensorrt docs/operators.md (TensorRT 10.15 operator support matrix)"
TRT_OPSET_MIN, TRT_OPSET_MAX = 9, 24
TRT_SUPPORTED_OPS = frozenset("""
Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh Attention AveragePool BatchNormalization
BlackmanWindow Cast CastLike Ceil Celu Clip Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh CumSum
DeformConv DepthToSpace DequantizeLinear Div Dropout Einsum Elu Equal Erf Exp Expand EyeLike Flatten Floor
Gather GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool Greater GreaterOrEqual
GridSample GroupNormalization GRU HammingWindow HannWindow HardSigmoid HardSwish Hardmax Identity If
ImageScaler InstanceNormalization IsInf IsNaN LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax
Loop LRN LSTM LpNormalization LpPool MatMul Max MaxPool Mean MeanVarianceNormalization Min Mish Mod Mul Neg
NonMaxSuppression NonZero Not OneHot Or Pad ParametricSoftplus Pow PRelu QuantizeLinear RandomNormal
RandomNormalLike RandomUniform RandomUniformLike Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum
ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize
ReverseSequence RMSNormalization RNN RoiAlign RotaryEmbedding Round STFT ScaledTanh Scan Scatter
ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh Size Slice Softmax Softplus Softsign
SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh TensorScatter ThresholdedRelu Tile TopK Transpose Trilu
Unsqueeze Upsample Where Xor
""".split())
TRT_UNSUPPORTED_OPS = frozenset("""
AffineGrid Bernoulli BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor Col2Im CenterCropPad Compress
ConcatFromSequence ConvInteger DFT Det DynamicQuantizeLinear ImageDecoder MatMulInteger MaxRoiPool MaxUnpool
MelWeightMatrix Multinomial NegativeLogLikelihoodLoss Optional OptionalGetElement OptionalHasElement
QLinearConv QLinearMatMul RegexFullMatch SequenceAt SequenceConstruct SequenceEmpty SequenceErase
SequenceInsert SequenceLength SequenceMap SoftmaxCrossEntropyLoss SplitToSequence StringConcat
StringNormalizer StringSplit TfIdfVectorizer Unique
""".split())
_WEIGHT_PATH_OPS = frozenset({"Identity", "Cast", "Transpose", "Reshape", "QuantizeLinear"})
_QOPERATOR = {"QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"}

# The parser looks an op up by its name whatever its domain; an op it has no importer for becomes a plugin when a
# plugin of that name is registered (onnx-tensorrt ModelImporter.cpp: FallbackPluginImporter), so an op in the
# `trt` domain, a `*_TRT` op or one of TensorRT's standard plugins may build. Its own TRT_* ops import natively.
TRT_DOMAINS = frozenset({"trt", "trt.plugins"})
TRT_NATIVE_OPS = frozenset("""
TRT_FP8QuantizeLinear TRT_FP8DequantizeLinear TRT_INT4QuantizeLinear TRT_INT4DequantizeLinear TRT_Scale TRT_Shuffle
TRT_TopK_Min TRT_MatMul TRT_RaggedSoftmax TRT_MaxAverageBlendPool TRT_PluginV2 TRT_Gather TRT_Slice TRT_Resize
TRT_FloorDiv TRT_Conv TRT_Deconv TRT_MaxPool TRT_AveragePool
""".split())
# The plugins of TensorRT's standard plugin library (NVIDIA/TensorRT plugin/README.md, 10.x), loaded by
# trt.init_libnvinfer_plugins, which the build and the runtime call.
TRT_STANDARD_PLUGINS = frozenset("""
BatchedNMS_TRT BatchedNMSDynamic_TRT BatchTilePlugin_TRT Clip_TRT CoordConvAC CropAndResize CropAndResizeDynamic
CustomEmbLayerNormPluginDynamic CustomFCPluginDynamic CustomGeluPluginDynamic CustomQKVToContextPluginDynamic
CustomSkipLayerNormPluginDynamic DecodeBbox3DPlugin DetectionLayer_TRT DisentangledAttention_TRT EfficientNMS_TRT
EfficientNMS_ONNX_TRT FlattenConcat_TRT GenerateDetection_TRT GridAnchor_TRT GridAnchorRect_TRT
GroupNormalizationPlugin InstanceNormalization_TRT LReLU_TRT ModulatedDeformConv2d MultilevelCropAndResize_TRT
MultilevelProposeROI_TRT MultiscaleDeformableAttnPlugin_TRT NMS_TRT NMSDynamic_TRT Normalize_TRT PillarScatterPlugin
PriorBox_TRT ProposalLayer_TRT Proposal ProposalDynamic PyramidROIAlign_TRT Region_TRT Reorg_TRT ROIAlign_TRT
ResizeNearest_TRT RPROI_TRT SpecialSlice_TRT VoxelGeneratorPlugin
""".split())

# ONNX TensorProto element types
_FLOAT, _UINT8, _INT8, _UINT16, _INT16, _INT32, _INT64, _STRING, _BOOL, _FLOAT16, _DOUBLE, _UINT32, _UINT64 = (
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)
_BFLOAT16 = 16
_IO_OK = {_FLOAT, _FLOAT16, _BFLOAT16, _INT32, _INT64, _INT8, _UINT8, _BOOL}

ERROR, WARNING, INFO = "error", "warning", "info"

# Accuracy and fidelity run a model over its data this many samples per call (measure.model: run_over(...,
# batch=64)): a dynamic batch dim without a profile is built for batch 1 up to this.
EVAL_BATCH = 64


@dataclass
class Finding:
    severity: str
    code: str           # stable id: unsupported-op, dynamic-dim, int64-weights, qdq-zero-point, ...
    message: str
    node: str | None = None
    op: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class CheckReport:
    model: str
    opset: int | None
    nodes: int
    ops: dict[str, int]
    inputs: list[dict]
    quantized: bool                       # has QuantizeLinear / DequantizeLinear nodes
    findings: list[Finding] = field(default_factory=list)
    table: str = TRT_TABLE_SOURCE

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    def blocking(self, strict: bool = False) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR or strict and f.severity == WARNING]

    def to_dict(self, strict: bool = False) -> dict[str, Any]:
        return {
            "model": self.model, "opset": self.opset, "nodes": self.nodes, "ops": self.ops,
            "inputs": self.inputs, "quantized": self.quantized, "table": self.table,
            "errors": len(self.errors), "warnings": len(self.warnings),
            "ok": not self.blocking(strict), "strict": strict,
            "findings": [f.to_dict() for f in self.findings],
        }


def check_model(path: str, shapes: dict[str, Any] | None = None, precision: str | None = None) -> CheckReport:
    """Check the ONNX model at `path` for what would stop or spoil a TensorRT 10 build.

    `shapes` maps input names (or "" for a single-input model) to a shape or to [min, opt, max] shapes:
    inputs named there count as having an optimization profile. `precision="int8"` also requires Q/DQ nodes.
    """
    model = onnx_io.load(path, external_data=False)
    return _Checker(model, str(path), shapes or {}, precision).run()


class _Checker:
    def __init__(self, model, path: str, shapes: dict, precision: str | None):
        self.model = model
        self.path = path
        self.shapes = shapes
        self.precision = precision
        self.findings: list[Finding] = []
        self.opset = next((imp.version for imp in model.opset_import if imp.domain in ("", "ai.onnx")), None)
        self.functions = {(f.domain, f.name): f for f in model.functions}
        self.ops: Counter = Counter()
        self.consts: dict[str, Any] = {}       # initializer / Constant name -> TensorProto
        self.consumers: dict[str, list] = {}   # tensor name -> nodes that read it (main graph)
        self.producers: dict[str, Any] = {}

    def add(self, severity: str, code: str, message: str, node=None) -> None:
        self.findings.append(Finding(severity, code, message,
                                     node=(node.name or f"<unnamed {node.op_type}>") if node is not None else None,
                                     op=node.op_type if node is not None else None))

    def run(self) -> CheckReport:
        g = self.model.graph
        for init in g.initializer:
            self.consts[init.name] = init
        for node in g.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                for a in node.attribute:
                    if a.name == "value" and a.HasField("t"):
                        self.consts[node.output[0]] = a.t
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
            for name in node.output:
                self.producers[name] = node
        self._check_opset()
        self._check_nodes(g.node, seen_functions=set())
        inputs = self._check_inputs()
        self._check_weights()
        quantized = any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in g.node)
        if quantized:
            self._check_qdq()
        if self.precision == "int8" and not quantized:
            self.add(ERROR, "int8-needs-qdq",
                     "int8 needs an explicitly quantized model (QuantizeLinear/DequantizeLinear nodes); TensorRT's "
                     "implicit calibration is deprecated: quantize to QDQ first (optkit quantize ... --format qdq)")
        order = {ERROR: 0, WARNING: 1, INFO: 2}
        self.findings.sort(key=lambda f: order[f.severity])
        return CheckReport(model=self.path, opset=self.opset, nodes=sum(self.ops.values()),
                           ops=dict(self.ops.most_common()), inputs=inputs, quantized=quantized,
                           findings=self.findings)

    # -- opset and ops --------------------------------------------------------------------------------------
    def _check_opset(self) -> None:
        if self.opset is None:
            return
        if self.opset < TRT_OPSET_MIN:
            self.add(WARNING, "opset-old",
                     f"opset {self.opset} is below the range TensorRT 10 documents ({TRT_OPSET_MIN}-{TRT_OPSET_MAX}); "
                     "if the parser fails, upgrade it (onnx.version_converter.convert_version(model, 17))")
        elif self.opset > TRT_OPSET_MAX:
            self.add(WARNING, "opset-new",
                     f"opset {self.opset} is above the range TensorRT 10 documents ({TRT_OPSET_MIN}-{TRT_OPSET_MAX}); "
                     "export with a lower opset if the parser fails")

    def _check_nodes(self, nodes, seen_functions: set) -> None:
        for node in nodes:
            domain = node.domain or ""
            if (domain, node.op_type) in self.functions:  # a model-local function: the parser inlines it
                key = (domain, node.op_type)
                self.ops[f"{domain}.{node.op_type}" if domain else node.op_type] += 1
                if key not in seen_functions:
                    seen_functions.add(key)
                    self._check_nodes(self.functions[key].node, seen_functions)
                continue
            self.ops[node.op_type if domain in ("", "ai.onnx") else f"{domain}.{node.op_type}"] += 1
            if node.op_type in TRT_NATIVE_OPS:
                self.add(INFO, "trt-op", f"op {node.op_type} is one of TensorRT's own ONNX ops; its parser "
                         "imports it", node)
            elif _plugin_op(domain, node.op_type):
                self.add(WARNING, "plugin-op",
                         f"op {_qualified(domain, node.op_type)} runs as a TensorRT plugin: the build works when a "
                         f"plugin named {node.op_type} is registered (TensorRT's standard plugins are; others need "
                         "their plugin library loaded)", node)
            elif domain not in ("", "ai.onnx"):
                self.add(ERROR, "custom-op",
                         f"op {domain}.{node.op_type} is not a standard ONNX op; TensorRT needs a plugin for it "
                         "(re-export without runtime-specific fusions, e.g. before onnxruntime graph optimizations)",
                         node)
            elif node.op_type in TRT_UNSUPPORTED_OPS:
                hint = ("; use Q/DQ format (QuantizeLinear/DequantizeLinear) instead of QOperator"
                        if node.op_type in _QOPERATOR else "")
                self.add(ERROR, "unsupported-op",
                         f"op {node.op_type} is not supported by TensorRT's ONNX parser{hint}", node)
            elif node.op_type not in TRT_SUPPORTED_OPS:
                self.add(ERROR, "unsupported-op",
                         f"op {node.op_type} is not in TensorRT 10's ONNX parser support table", node)
            else:
                self._check_restrictions(node)
            for sub in subgraphs(node):
                self._check_nodes(sub.node, seen_functions)

    def _check_restrictions(self, node) -> None:
        """The documented restrictions that can be seen statically."""
        attrs = {a.name: a for a in node.attribute}
        op = node.op_type

        def s(name):
            a = attrs.get(name)
            return a.s.decode() if a is not None else None

        def i(name, default=0):
            a = attrs.get(name)
            return a.i if a is not None else default

        if op == "MaxPool" and len(node.output) > 1 and node.output[1]:
            self.add(ERROR, "op-restriction", "MaxPool's Indices output is not supported by TensorRT", node)
        elif op == "Resize":
            if s("mode") == "cubic" and self._resized_dims(node) > 2:
                self.add(ERROR, "op-restriction", "Resize mode 'cubic' scales at most 2 dims in TensorRT (this "
                         f"node scales {self._resized_dims(node)}); linear scales up to 3", node)
            if i("antialias"):
                self.add(ERROR, "op-restriction", "Resize with antialias is not supported by TensorRT", node)
            ctm = s("coordinate_transformation_mode")
            if ctm in ("tf_crop_and_resize", "half_pixel_symmetric"):
                self.add(ERROR, "op-restriction", f"Resize coordinate_transformation_mode {ctm!r} is not supported "
                         "by TensorRT", node)
        elif op == "ScatterND" and s("reduction") not in (None, "none"):
            self.add(ERROR, "op-restriction", f"ScatterND reduction {s('reduction')!r} is not supported by "
                     "TensorRT", node)
        elif op == "LSTM" and (i("layout") or i("input_forget")):
            self.add(ERROR, "op-restriction", "LSTM with layout=1 or input_forget=1 is not supported by TensorRT",
                     node)
        elif op == "TopK" and len(node.input) > 1 and node.input[1] in self.consts:
            k = self._values(node.input[1])
            if k is not None and k.size and int(k.ravel()[0]) >= 3840:
                self.add(ERROR, "op-restriction", f"TopK with K={int(k.ravel()[0])}: TensorRT needs K < 3840", node)
        elif op in ("AveragePool", "MaxPool", "LpPool") and "dilations" in attrs and any(
                d != 1 for d in attrs["dilations"].ints):
            self.add(ERROR, "op-restriction", f"{op} with dilations other than 1 is not supported by TensorRT", node)

    def _resized_dims(self, node) -> int:
        """How many dims a Resize scales, from its constant scales or sizes (0 when they are computed)."""
        scales = self._values(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if scales is not None and scales.size:
            return int((scales != 1).sum())
        return 0

    # -- inputs: dtypes and dynamic dims ----------------------------------------------------------------------
    def _check_inputs(self) -> list[dict]:
        from onnx import helper

        g = self.model.graph
        real = [v for v in g.input if v.name not in self.consts]
        out = []
        for v in real:
            t = v.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or None)
                    for d in t.shape.dim] if t.HasField("shape") else None
            dtype = helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type and t.elem_type != _STRING \
                else ("string" if t.elem_type == _STRING else "unknown")
            out.append({"name": v.name, "shape": dims, "dtype": dtype})
            if not v.type.HasField("tensor_type"):
                self.add(ERROR, "input-type", f"input {v.name!r} is not a tensor (sequence/map/optional); "
                         "TensorRT binds tensors only")
                continue
            if t.elem_type == _DOUBLE:
                self.add(WARNING, "input-dtype", f"input {v.name!r} is float64; TensorRT casts it to float32")
            elif t.elem_type not in _IO_OK:
                self.add(ERROR, "input-dtype", f"input {v.name!r} has dtype {dtype}, which TensorRT cannot bind "
                         "(float32/16, bfloat16, int32/64, int8, uint8, bool are allowed)")
            given = self.shapes.get(v.name, self.shapes.get("") if len(real) == 1 else None)
            if dims is None:
                if given is None:
                    self.add(ERROR, "dynamic-dim", f"input {v.name!r} has no declared shape; give one with "
                             f"--shape {v.name}=DIMS")
                continue
            dynamic = [k for k, d in enumerate(dims) if not isinstance(d, int)]
            if not dynamic or given is not None:
                continue
            pattern = "x".join(str(d) if isinstance(d, int) else "N" for d in dims)
            if dynamic == [0]:
                self.add(WARNING, "dynamic-batch",
                         f"input {v.name!r} has a dynamic batch dim ({pattern}) and no profile: the engine is built "
                         f"for batch 1 to {EVAL_BATCH}, tuned for 1; for another range give --shape "
                         f"{v.name}=MIN:OPT:MAX (e.g. "
                         f"{pattern.replace('N', '1', 1)}:{pattern.replace('N', '8', 1)}:"
                         f"{pattern.replace('N', '32', 1)})")
            else:
                self.add(ERROR, "dynamic-dim",
                         f"input {v.name!r} has dynamic dims {', '.join(map(str, dynamic))} ({pattern}) and no "
                         f"optimization profile; give --shape {v.name}=DIMS or {v.name}=MIN:OPT:MAX")
        return out

    # -- weights -------------------------------------------------------------------------------------------
    def _check_weights(self) -> None:
        int64, doubles = [], []
        for name, t in self.consts.items():
            if t.data_type == _INT64:
                int64.append(name)
            elif t.data_type == _DOUBLE:
                doubles.append(name)
        if int64:  # TensorRT 10 has an INT64 type: the parser no longer casts INT64 weights down to INT32
            self.add(INFO, "int64-weights", f"{len(int64)} INT64 weight(s) ({_names(int64)}); TensorRT 10 "
                     "handles INT64 natively")
        if doubles:
            self.add(WARNING, "double-weights", f"{len(doubles)} float64 weight(s) ({_names(doubles)}); TensorRT "
                     "casts them to float32")

    # -- explicit quantization (Q/DQ) ----------------------------------------------------------------------
    def _check_qdq(self) -> None:
        g = self.model.graph
        outputs = {o.name for o in g.output}
        n_q = n_dq = 0
        for node in g.node:
            if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or node.domain not in ("", "ai.onnx"):
                continue
            is_q = node.op_type == "QuantizeLinear"
            n_q += is_q
            n_dq += not is_q
            scale = node.input[1] if len(node.input) > 1 else ""
            zp = node.input[2] if len(node.input) > 2 else ""
            if scale and scale not in self.consts:
                self.add(ERROR, "qdq-scale", f"the scale of {node.op_type} is computed at run time ({scale!r}); "
                         "TensorRT needs a constant scale", node)
            qtype = None
            if zp:
                zt = self.consts.get(zp)
                if zt is None:
                    self.add(ERROR, "qdq-zero-point", f"the zero point of {node.op_type} is computed at run time; "
                             "TensorRT needs a constant zero point of 0", node)
                else:
                    qtype = zt.data_type
                    vals = self._values(zp)
                    if vals is not None and vals.size and bool((vals != 0).any()):
                        self.add(ERROR, "qdq-zero-point",
                                 f"{node.op_type} has a non-zero zero point ({_brief(vals)}): TensorRT supports "
                                 "symmetric quantization only; quantize with symmetric activations and weights", node)
            if not is_q:
                src = self.consts.get(node.input[0])
                if src is not None:
                    qtype = src.data_type
                elif qtype is None and node.input[0] in self.producers:
                    prod = self.producers[node.input[0]]
                    if prod.op_type == "QuantizeLinear" and len(prod.input) > 2 and prod.input[2] in self.consts:
                        qtype = self.consts[prod.input[2]].data_type
            else:
                for a in node.attribute:
                    if a.name == "output_dtype" and a.i:
                        qtype = a.i
            if qtype == _UINT8:
                self.add(ERROR, "qdq-uint8", f"{node.op_type} uses UINT8: TensorRT's explicit quantization is "
                         "INT8 (signed, zero point 0); quantize activations and weights as QInt8", node)
            elif qtype == _INT32:
                self.add(ERROR, "qdq-int32-bias",
                         f"DequantizeLinear of an INT32 tensor ({node.input[0]!r}, a quantized bias): TensorRT "
                         "dequantizes INT8/FP8/INT4 only; quantize without bias quantization "
                         "(onnxruntime extra option QuantizeBias=False)", node)
            axis = next((a.i for a in node.attribute if a.name == "axis"), None)
            per_channel = scale in self.consts and _numel(self.consts[scale]) > 1
            if (per_channel or axis is not None) and self.opset is not None and self.opset < 13:
                self.add(ERROR, "qdq-opset", f"per-channel {node.op_type} needs opset 13 or later (the model has "
                         f"opset {self.opset}); upgrade the opset before quantizing", node)
            if per_channel and node.input[0] not in self.consts and not _is_weight_path(node.input[0], self.consts, self.producers):
                self.add(ERROR, "qdq-per-channel-activation",
                         f"{node.op_type} quantizes activation {node.input[0]!r} per channel; TensorRT supports "
                         "per-tensor activation scales only", node)
            if is_q:
                readers = self.consumers.get(node.output[0], [])
                bad = [r for r in readers if r.op_type != "DequantizeLinear"]
                if node.output[0] in outputs:
                    self.add(ERROR, "qdq-dangling-q", "a QuantizeLinear output is a graph output; TensorRT expects "
                             "each QuantizeLinear to be followed by DequantizeLinear", node)
                elif bad:
                    self.add(ERROR, "qdq-dangling-q",
                             f"QuantizeLinear feeds {bad[0].op_type} ({bad[0].name or 'unnamed'}) instead of "
                             "DequantizeLinear; TensorRT expects Q/DQ pairs", node)
        if n_q == 0 and n_dq:
            self.add(INFO, "qdq-weights-only", f"{n_dq} DequantizeLinear and no QuantizeLinear: weight-only "
                     "quantization; activations stay in floating point")
        else:
            self.add(INFO, "qdq", f"explicitly quantized: {n_q} QuantizeLinear, {n_dq} DequantizeLinear")

    def _values(self, name: str):
        from onnx import numpy_helper

        t = self.consts.get(name)
        if t is None or t.data_location == 1:  # external data not loaded
            return None
        try:
            return numpy_helper.to_array(t)
        except Exception:  # noqa: BLE001 - a malformed tensor is reported elsewhere by the parser
            return None


def _is_weight_path(name: str, consts: dict, producers: dict) -> bool:
    """Whether the tensor a Q or DQ reads comes from a constant (weights): traced back through Identity,
    Cast, Transpose and Reshape, and through a QuantizeLinear, so a float weight -> Q (per channel) -> DQ, the
    layout of QAT and ModelOpt exports, is a weight."""
    for _ in range(8):
        if name in consts:
            return True
        prod = producers.get(name)
        if prod is None or prod.op_type not in _WEIGHT_PATH_OPS:
            return False
        name = prod.input[0]
    return name in consts


def _plugin_op(domain: str, op: str) -> bool:
    """An op the parser hands to a plugin: the `trt` domain, a `*_TRT` name, or a standard plugin's name."""
    return domain in TRT_DOMAINS or op.endswith("_TRT") or op in TRT_STANDARD_PLUGINS


def _qualified(domain: str, op: str) -> str:
    return f"{domain}.{op}" if domain not in ("", "ai.onnx") else op


def _numel(t) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n


def _names(names: list[str], k: int = 3) -> str:
    return ", ".join(names[:k]) + (f", ... {len(names) - k} more" if len(names) > k else "")


def _brief(arr) -> str:
    flat = arr.ravel()
    return ", ".join(str(x) for x in flat[:4]) + (" ..." if flat.size > 4 else "")


# -- optimization profiles from --shape -----------------------------------------------------------------------
def parse_profiles(values: list[str] | None) -> dict[str, list[list[int]]]:
    """`--shape name=1x3x8x8` (fixed) or `name=MIN:OPT:MAX` (each 1x3x8x8) -> {name: [min, opt, max]}.

    A bare value without `name=` applies to the model's only input (key "").
    """

    out: dict[str, list[list[int]]] = {}
    for item in values or []:
        name, _, spec = item.rpartition("=")
        parts = spec.split(":")
        if len(parts) not in (1, 3):
            raise UsageError(f"bad profile (--shape) {item!r}: expected name=DIMS or name=MIN:OPT:MAX (e.g. "
                             "input=1x3x224x224:8x3x224x224:32x3x224x224)")
        shapes = [parse_shapes([f"{name}={p}" if name else p])[name.strip()] for p in parts]
        if len(shapes) == 1:
            shapes = shapes * 3
        lo, opt, hi = shapes
        if not len(lo) == len(opt) == len(hi):
            raise UsageError(f"bad profile (--shape) {item!r}: MIN, OPT and MAX must have the same number of dims")
        if any(not a <= b <= c for a, b, c in zip(lo, opt, hi)):
            raise UsageError(f"bad profile (--shape) {item!r}: every dim must satisfy MIN <= OPT <= MAX")
        out[name.strip()] = [lo, opt, hi]
    return out


def opt_shapes(profiles: dict[str, list[list[int]]]) -> dict[str, list[int]]:
    """The OPT shape of each profile: what measurements feed the engine."""
    return {name: p[1] for name, p in profiles.items()}
