"""convert.tf for a TFLite file (float or int8): tf2onnx's conversion given the TFLite session's interface (names,
real-valued quantized inputs and outputs), each int8 output's quantization step and requantization depth (what
validation judges it by), plain tf2onnx's conversion as the reference for faithful rounding, and the TFLite LSTM
that tf2onnx has no handler for."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from optkit.core.artifact import Artifact
from optkit.core.errors import OptkitError, PassError
from optkit.core.formats import Format
from optkit.core.registry import PassContext
from optkit.onnx import graph
from optkit.onnx import io as onnx_io
from optkit.onnx.session import ort_session
from optkit.passes.convert.tfsource import Reference, quiet, tf2onnx_error
from optkit.runtimes.tf import import_tf
from optkit.runtimes.tflite import TFLiteSession, dequantize, interpreter_class, quantize


def tflite_io(path: Path, session, source_path: str) -> dict[str, float]:
    """Give the ONNX model the TFLite session's interface: signature names, and real-valued inputs and outputs
    where the TFLite model's are quantized (QuantizeLinear / DequantizeLinear at the boundary), the way optkit's
    TFLite runtime presents them. Returns the quantization step of each dequantized output."""
    import onnx

    model = onnx_io.load(path)
    b = _Boundary(model.graph)
    interp = session.interp
    steps: dict[str, float] = {}
    by_in = {v.name: v for v in model.graph.input}     # as converted: names before any renaming
    by_out = {v.name: v for v in model.graph.output}
    for d, spec in zip(interp.get_input_details(), session.inputs):
        b.input(d, spec, by_in)
    for d, spec in zip(interp.get_output_details(), session.outputs):
        step = b.output(d, spec, by_out)
        if step is not None:
            steps[spec.name] = step
    steps.update(dequantized_steps(source_path, interp, session, steps))
    onnx.save_model(model, str(path))
    return steps


class _Boundary:
    """Edits at a converted graph's inputs and outputs, keeping every tensor and node name unique (SSA)."""

    def __init__(self, g):
        self.g = g
        self.used = ({v.name for v in (*g.input, *g.output, *g.value_info, *g.initializer)}
                     | {x for n in graph.all_nodes(g) for x in (*n.input, *n.output)})
        self.node_names = {n.name for n in graph.all_nodes(g)}

    def fresh(self, base: str, taken: set | None = None) -> str:
        taken = self.used if taken is None else taken
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        return name

    def rename(self, old: str, new: str) -> None:
        for node in graph.all_nodes(self.g):
            node.input[:] = [new if x == old else x for x in node.input]
            node.output[:] = [new if x == old else x for x in node.output]
        for v in (*self.g.value_info, *self.g.initializer, *self.g.output):
            if v.name == old:
                v.name = new
        self.used.add(new)

    def claim(self, name: str, owner: str) -> None:
        """Make `name` free for the boundary tensor `owner`: another tensor of that name (PyTorch-exported
        files reuse names like input.5 inside) moves to a fresh one, so the graph stays in SSA form."""
        if name != owner and name in self.used:
            self.rename(name, self.fresh(f"{name}_inner"))

    def qparams(self, d, tag: str) -> tuple[tuple[str, str], float]:
        from onnx import numpy_helper

        scale, zero = d["quantization"]
        z = np.array(zero, dtype=np.dtype(d["dtype"]))
        names = (self.fresh(f"{tag}_scale"), self.fresh(f"{tag}_zero_point"))
        self.g.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), names[0]),
                                   numpy_helper.from_array(z, names[1])])
        return names, scale

    def _inner(self, d, spec) -> str:
        """The quantized tensor's name; where the real-valued one takes its name, a new one."""
        inner = d["name"]
        if inner == spec.name:
            inner = self.fresh(f"{spec.name}_int8")
            self.rename(spec.name, inner)
        return inner

    def input(self, d, spec, by_name: dict) -> None:
        import onnx
        from onnx import helper

        vi = by_name.get(d["name"])
        if vi is None or spec.name in by_name and spec.name != d["name"]:
            return
        self.claim(spec.name, d["name"])
        if _quantized(d):
            inner = self._inner(d, spec)
            (sc, zp), _ = self.qparams(d, f"{spec.name}_q")
            self.g.node.insert(0, helper.make_node("QuantizeLinear", [spec.name, sc, zp], [inner],
                                                   name=self.fresh(f"{spec.name}_quantize", self.node_names)))
            vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
        else:
            self.rename(d["name"], spec.name)
        vi.name = spec.name

    def output(self, d, spec, by_name: dict) -> float | None:
        """The output as the TFLite session gives it; its quantization step where it is dequantized here."""
        import onnx
        from onnx import helper

        vi = by_name.get(d["name"])
        if vi is None:
            return None
        self.claim(spec.name, d["name"])
        step = None
        if _quantized(d):
            inner = self._inner(d, spec)
            (sc, zp), scale = self.qparams(d, f"{spec.name}_dq")
            self.g.node.append(helper.make_node("DequantizeLinear", [inner, sc, zp], [spec.name],
                                                name=self.fresh(f"{spec.name}_dequantize", self.node_names)))
            vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
            step = float(scale)
        else:
            self.rename(d["name"], spec.name)
        vi.name = spec.name
        return step


def _quantized(d) -> bool:
    return np.dtype(d["dtype"]).kind in "iu" and d["quantization"][0] != 0.0


def dequantized_steps(path: str, interp, session, known: dict) -> dict[str, float]:
    """Float outputs that an int8 model computes in int8 and dequantizes last (a DEQUANTIZE op): their
    quantization step, so validation counts in steps rather than a float atol."""
    interp = undelegated(path, interp)
    tensors = {t["index"]: t for t in interp.get_tensor_details()}
    producer = {o: op for op in interp._get_ops_details() for o in op["outputs"]}
    steps = {}
    for d, spec in zip(interp.get_output_details(), session.outputs):
        op = producer.get(d["index"])
        if spec.name in known or op is None or op["op_name"] != "DEQUANTIZE" or not len(op["inputs"]):
            continue
        source = tensors.get(op["inputs"][0])
        scale = source["quantization"][0] if source else 0.0
        if scale:
            steps[spec.name] = float(scale)
    return steps


def undelegated(path: str, interp):
    """An interpreter of the same file without XNNPACK, whose op list shows the model's own ops (a delegate
    folds them into one DELEGATE op); the given one where this interpreter has no such option."""
    Interpreter = interpreter_class()
    try:
        from ai_edge_litert.interpreter import OpResolverType
    except ImportError:
        OpResolverType = import_tf().lite.experimental.OpResolverType
    try:
        return Interpreter(model_path=str(path),
                           experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    except Exception:  # noqa: BLE001
        return interp


def convert_tflite(path: str, opset: int, dest: Path, ctx: PassContext) -> Reference:
    import tensorflow as tf
    from tf2onnx import convert

    session = TFLiteSession(Artifact(path=path, format=Format.TFLITE, sha256=""))
    _LSTM_NOTES.clear()
    try:
        with quiet(), tf.device("/cpu:0"):
            convert._convert_common(
                None, tflite_path=path, name=Path(path).stem, continue_on_error=True, opset=opset,
                custom_op_handlers={"TFL_UNIDIRECTIONAL_SEQUENCE_LSTM": (_tfl_lstm, [])},
                tensors_to_rename=None, initialized_tables=None, output_path=str(dest))
    except OptkitError:
        raise
    except Exception as e:  # noqa: BLE001
        raise tf2onnx_error(e, path) from None
    if _LSTM_NOTES:
        raise PassError(_LSTM_NOTES[0])
    ops = {op["op_name"] for op in session.interp._get_ops_details()}
    plain = None if "UNIDIRECTIONAL_SEQUENCE_LSTM" in ops else plain_tf2onnx(dest.read_bytes(), session)
    steps = tflite_io(dest, session, path)
    if steps and "UNIDIRECTIONAL_SEQUENCE_LSTM" in ops:
        ctx.note("the int8 LSTM runs in float in ONNX (ONNX has no integer LSTM), so outputs may move by a few "
                 "quantization steps; judged in output steps like every int8 output")

    def run(feeds):
        interp = session.interp
        if hasattr(interp, "reset_all_variables"):
            interp.reset_all_variables()   # stateful kernels (LSTM) carry state across invokes otherwise
        return session.run(feeds)

    batch = session.inputs[0].shape[0] if session.inputs and session.inputs[0].shape and session.inputs[0].shape[0] else None
    depths = requantization_depths(path, session) if steps else {}
    return Reference(session.inputs, run, batch=batch, steps=steps, source="TFLite", depths=depths,
                     plain=plain if steps else None)


def plain_tf2onnx(model: bytes, session: TFLiteSession):
    """tf2onnx's own conversion (before optkit gives it TFLite's interface) run as the TFLite session runs: real
    inputs quantized and outputs dequantized with the TFLite model's own scales. Its distance from TFLite is what a
    faithful conversion gives (validation's step limits), on the graph's own arithmetic as the conversion is
    judged (`_validate`). None where its names are not the TFLite tensors'."""
    sess = ort_session(model, optimization="basic")
    names = [o.name for o in sess.get_outputs()]
    ins, outs = session.input_details, session.output_details
    if {i.name for i in sess.get_inputs()} != {d["name"] for d in ins} or set(names) != {d["name"] for d in outs}:
        return None

    def run(feeds):
        got = dict(zip(names, sess.run(None, {d["name"]: quantize(feeds[spec.name], d)
                                                for d, spec in zip(ins, session.inputs)})))
        return [dequantize(got[d["name"]], d) for d in outs]

    return run


def requantization_depths(path: str, session: TFLiteSession) -> dict[str, int]:
    """Each output's depth: the most requantizations on a path from an input, an op that writes an integer
    tensor with a scale or zero point other than its first input's (QUANTIZE, convolutions, adds, means, ...;
    a reshape or max pool keeps its input's and adds none)."""
    interp = undelegated(path, session.interp)
    tensors = {t["index"]: t for t in interp.get_tensor_details()}

    def qparams(i):
        t = tensors.get(i)
        quantized = t is not None and np.dtype(t["dtype"]).kind in "iu" and t["quantization"][0] != 0.0
        return t["quantization"] if quantized else None

    depth: dict[int, int] = {}
    for op in interp._get_ops_details():   # in execution order: inputs before their consumers
        ins = [i for i in op["inputs"] if i >= 0]
        base = max((depth.get(i, 0) for i in ins), default=0)
        for o in op["outputs"]:
            q = qparams(o)
            depth[o] = base + int(q is not None and (not ins or qparams(ins[0]) != q))
    return {spec.name: depth.get(d["index"], 0) for d, spec in zip(session.output_details, session.outputs)}


# ------------------------------------------------------------------------------------------------ TFLite LSTM

_LSTM_NOTES: list[str] = []


def _tfl_lstm(ctx, node, name, args):
    """TFLite UNIDIRECTIONAL_SEQUENCE_LSTM (tf2onnx has no handler) -> ONNX LSTM.

    Supported: the plain variant Keras produces (no peephole, projection, layer norm or CIFG): 15 inputs
    after tf2onnx drops the absent ones: x, 4 input weights, 4 recurrent weights, 4 biases, 2 state tensors.
    Gate order: TFLite i, f, c, o -> ONNX i, o, f, c. Initial states are zero (TFLite resets them between runs
    when asked; constant non-zero states are fed as initial_h / initial_c).
    """
    from tf2onnx import utils

    ins = list(node.input)
    if len(ins) != 15:
        _LSTM_NOTES.append(f"tf2onnx cannot convert op UNIDIRECTIONAL_SEQUENCE_LSTM (node {node.name!r}): only the "
                           "plain variant is supported (no peephole, projection, layer norm or coupled gates)")
        return
    act = node.get_attr_value("fused_activation_function")
    act = act.decode() if isinstance(act, bytes) else act
    if act not in (None, "TANH"):
        _LSTM_NOTES.append(f"tf2onnx cannot convert op UNIDIRECTIONAL_SEQUENCE_LSTM (node {node.name!r}) with "
                           f"activation {act}")
        return
    x = ins[0]
    wi, wf, wc, wo = ins[1:5]
    ri, rf, rc, ro = ins[5:9]
    bi, bf, bc, bo = ins[9:13]
    h0, c0 = ins[13:15]
    hidden = ctx.get_shape(ri)[0]
    time_major = bool(node.get_attr_value("time_major"))
    out = node.output[0]
    out_shape, out_dtype = ctx.get_shape(out), ctx.get_dtype(out)
    ctx.remove_node(node.name)

    def const(arr):
        return ctx.make_const(utils.make_name(node.name + "_c"), arr).output[0]

    def cat(vals):
        return ctx.make_node("Concat", vals, attr={"axis": 0}).output[0]

    def unsq(v):
        return ctx.make_node("Unsqueeze", [v, const(np.array([0], np.int64))]).output[0]

    w = unsq(cat([wi, wo, wf, wc]))
    r = unsq(cat([ri, ro, rf, rc]))
    b = unsq(cat([bi, bo, bf, bc, const(np.zeros(4 * hidden, np.float32))]))
    if not time_major:
        x = ctx.make_node("Transpose", [x], attr={"perm": [1, 0, 2]}).output[0]
    lstm_inputs = [x, w, r, b]
    states = [s if ctx.get_node_by_output(s) is not None and not _is_zero_const(ctx, s) else None for s in (h0, c0)]
    if any(states):
        zeros = None
        lstm_inputs += ["", ]
        for s in states:
            if s is None:
                if zeros is None:
                    zeros = ctx.make_node("Mul", [h0 if states[0] else c0, const(np.zeros((), np.float32))]).output[0]
                s = zeros
            lstm_inputs.append(unsq(s))
    lstm = ctx.make_node("LSTM", lstm_inputs, attr={"hidden_size": hidden}, output_count=3)
    axis = const(np.array([1], np.int64))
    if time_major:
        ctx.make_node("Squeeze", [lstm.output[0], axis], outputs=[out], shapes=[out_shape], dtypes=[out_dtype])
    else:
        y = ctx.make_node("Squeeze", [lstm.output[0], axis]).output[0]
        ctx.make_node("Transpose", [y], attr={"perm": [1, 0, 2]}, outputs=[out], shapes=[out_shape],
                      dtypes=[out_dtype])


def _is_zero_const(ctx, name) -> bool:
    node = ctx.get_node_by_output(name)
    while node is not None and node.type in ("DequantizeLinear", "TFL_DEQUANTIZE", "Identity"):
        node = ctx.get_node_by_output(node.input[0])
    if node is None:
        return True   # a variable state tensor with no producer: zero at the start of a run
    if node.is_const():
        return not np.any(node.get_tensor_value(as_list=False))
    return False
