"""convert.tf: Keras (.keras/.h5), SavedModel and TFLite (float and int8) -> ONNX through tf2onnx."""
from __future__ import annotations

import contextlib
import io
import logging
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx

from optkit.core.artifact import Artifact
from optkit.core.batching import first_call, run_batched
from optkit.core.errors import OptkitError, PassError, UsageError
from optkit.core.formats import Format
from optkit.core.registry import PassContext
from optkit.core.shapes import TensorSpec
from optkit.core.text import first_line
from optkit.measure.fidelity import step_errors
from optkit.measure.paired import head_to_head
from optkit.onnx import graph
from optkit.onnx import io as onnx_io
from optkit.onnx.io import Staging
from optkit.onnx.session import ort_session, spec_of
from optkit.passes.convert import retype
from optkit.passes.convert.common import (
    CLEAR_MARGIN,
    check_model,
    choose_opset,
    unsupported_nodes,
    validate,
    validation_feeds,
)
from optkit.runtimes.tf import import_tf, load_keras, load_signature
from optkit.runtimes.tflite import TFLiteSession, dequantize, interpreter_class, quantize

PASS = "convert.tf"
log = logging.getLogger(__name__)


def convert_tf(artifact: Artifact, config, ctx: PassContext) -> Artifact:
    tf = import_tf()
    from tf2onnx import constants

    opset = choose_opset(config.opset, max(constants.OPSET_TO_IR_VERSION), "tf2onnx")
    signature = config.signature or artifact.meta.get("signature")
    with Staging(ctx.output) as stage, tempfile.TemporaryDirectory(prefix="optkit-convert-") as work:
        if artifact.format == Format.TFLITE:
            if signature:
                raise UsageError("signature (--signature) applies to SavedModels, not TFLite models")
            reference = _convert_tflite(artifact.path, opset, stage.model, ctx)
        elif artifact.format == Format.KERAS:
            if signature:
                raise UsageError("signature (--signature) applies to SavedModels, not Keras models")
            reference = _convert_keras(tf, artifact.path, opset, stage.model, Path(work), config, ctx)
        else:
            reference = _convert_saved_model(tf, artifact.path, signature, opset, stage.model)
        if config.static_batch:
            fixed = fix_batch(stage.model)
            if fixed:
                reference.specs = [TensorSpec(s.name, [1, *s.shape[1:]] if s.name in fixed and s.shape else s.shape,
                                              s.dtype) for s in reference.specs]
        else:
            _note_fixed_batch(stage.model, artifact, ctx)

        proto = onnx_io.load(stage.model, external_data=False)
        bad = unsupported_nodes(proto)
        if bad:
            domain, op, node = bad[0]
            raise PassError(f"tf2onnx cannot convert op {op.removeprefix('TFL_')} (node {node!r}); "
                            "the ONNX model would not run")
        stage.finalize(config.external_data, ctx)
        check_model(stage.model)
        figures = _validate(reference, stage.model, config, ctx)
        figures["exporter"] = "tf2onnx"
        figures["opset"] = graph.opset(onnx_io.load(stage.model, external_data=False))
        ctx.measurements["validation"] = figures
        stage.commit()
    return artifact.derive(ctx.output, Format.ONNX, PASS, config.model_dump(mode="json"), exporter="tf2onnx",
                           opset=figures["opset"])


def fix_batch(path: Path) -> list[str]:
    """static_batch: the inputs whose first axis is symbolic get 1 there (and outputs sharing that symbol);
    returns their names."""
    import onnx

    model = onnx.load(str(path))
    fixed, symbols = [], set()
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim if vi.type.HasField("tensor_type") else []
        if len(dims) and not dims[0].HasField("dim_value"):
            symbols.add(dims[0].dim_param)
            dims[0].Clear()
            dims[0].dim_value = 1
            fixed.append(vi.name)
    for vi in model.graph.output:
        dims = vi.type.tensor_type.shape.dim if vi.type.HasField("tensor_type") else []
        if len(dims) and not dims[0].HasField("dim_value") and dims[0].dim_param in symbols | {""}:
            dims[0].Clear()
            dims[0].dim_value = 1
    if fixed:
        del model.graph.value_info[:]   # shapes inferred for the dynamic batch; recomputed by the checker
        onnx.save(model, str(path))
    return fixed


def _note_fixed_batch(path: Path, artifact: Artifact, ctx: PassContext) -> None:
    """The batch is dynamic by default, but tf2onnx keeps the source's own input shapes: say so where the
    source fixes the first axis (a TFLite model's batch of 1, a SavedModel signature's fixed batch)."""
    proto = onnx_io.load(path, external_data=False)
    fixed = [vi.name for vi in proto.graph.input if vi.type.HasField("tensor_type")
             and len(vi.type.tensor_type.shape.dim) and vi.type.tensor_type.shape.dim[0].HasField("dim_value")]
    if fixed:
        ctx.note(f"the batch axis of {', '.join(fixed)} stays fixed: the {artifact.format.value} model fixes it")


@contextlib.contextmanager
def _quiet():
    buf = io.StringIO()
    loggers = [logging.getLogger(n) for n in ("tf2onnx", "tensorflow", "absl")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _tf2onnx_error(e: BaseException, what: str) -> PassError:
    text = str(e)
    import re

    m = re.search(r"(?:op|Op)\s*\[?(?P<node>[\w/:.]*)\s*:\s*(?P<op>\w+)\]?\s*is not supported", text)
    if m:
        return PassError(f"tf2onnx cannot convert op {m['op']} (node {m['node']!r}) in {what}")
    return PassError(f"tf2onnx failed on {what}: {type(e).__name__}: {first_line(e)}")


# ------------------------------------------------------------------------------------------------ sources


class Reference:
    """The source model as the framework runs it: named inputs -> list of outputs in ONNX output order."""

    def __init__(self, specs: list[TensorSpec], run, batch: int | None = None, steps: dict | None = None,
                 source: str = "TensorFlow", depths: dict | None = None, plain=None):
        self.specs = specs
        self.run = run
        self.batch = batch
        self.steps = steps or {}   # output name -> quantization step (int8 outputs exposed as real values)
        self.source = source
        self.depths = depths or {}   # output name -> requantizations on the longest path from an input
        self.plain = plain   # plain tf2onnx's conversion run like `run` (same feeds and outputs), or None


def _tflite_io(path: Path, session, source_path: str) -> dict[str, float]:
    """Give the ONNX model the TFLite session's interface: signature names, and real-valued inputs and outputs
    where the TFLite model's are quantized (QuantizeLinear / DequantizeLinear at the boundary), the way optkit's
    TFLite runtime presents them. Returns the quantization step of each dequantized output."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx_io.load(path)
    g = model.graph
    interp = session.interp
    steps: dict[str, float] = {}
    used = ({v.name for v in (*g.input, *g.output, *g.value_info, *g.initializer)}
            | {x for n in graph.all_nodes(g) for x in (*n.input, *n.output)})

    node_names = {n.name for n in graph.all_nodes(g)}

    def fresh(base: str, taken: set | None = None) -> str:
        taken = used if taken is None else taken
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        return name

    def rename(old: str, new: str) -> None:
        for node in graph.all_nodes(g):
            node.input[:] = [new if x == old else x for x in node.input]
            node.output[:] = [new if x == old else x for x in node.output]
        for v in (*g.value_info, *g.initializer, *g.output):
            if v.name == old:
                v.name = new
        used.add(new)

    def claim(name: str, owner: str) -> None:
        """Make `name` free for the boundary tensor `owner`: another tensor of that name (PyTorch-exported
        files reuse names like input.5 inside) moves to a fresh one, so the graph stays in SSA form."""
        if name != owner and name in used:
            rename(name, fresh(f"{name}_inner"))

    def qparams(d, tag):
        scale, zero = d["quantization"]
        z = np.array(zero, dtype=np.dtype(d["dtype"]))
        names = (fresh(f"{tag}_scale"), fresh(f"{tag}_zero_point"))
        g.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), names[0]),
                              numpy_helper.from_array(z, names[1])])
        return names, scale

    by_name = {v.name: v for v in g.input}
    for d, spec in zip(interp.get_input_details(), session.inputs):
        vi = by_name.get(d["name"])
        if vi is None or spec.name in by_name and spec.name != d["name"]:
            continue
        quantized = np.dtype(d["dtype"]).kind in "iu" and d["quantization"][0] != 0.0
        claim(spec.name, d["name"])
        if quantized:
            inner = d["name"]
            if inner == spec.name:  # the float input takes the name: the int8 tensor gets a new one
                inner = fresh(f"{spec.name}_int8")
                rename(spec.name, inner)
            (sc, zp), _ = qparams(d, f"{spec.name}_q")
            g.node.insert(0, helper.make_node("QuantizeLinear", [spec.name, sc, zp], [inner],
                                              name=fresh(f"{spec.name}_quantize", node_names)))
            vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
        else:
            rename(d["name"], spec.name)
        vi.name = spec.name
    by_out = {v.name: v for v in g.output}
    for d, spec in zip(interp.get_output_details(), session.outputs):
        vi = by_out.get(d["name"])
        if vi is None:
            continue
        quantized = np.dtype(d["dtype"]).kind in "iu" and d["quantization"][0] != 0.0
        claim(spec.name, d["name"])
        if quantized:
            inner = d["name"]
            if inner == spec.name:
                inner = fresh(f"{spec.name}_int8")
                rename(spec.name, inner)
            (sc, zp), scale = qparams(d, f"{spec.name}_dq")
            g.node.append(helper.make_node("DequantizeLinear", [inner, sc, zp], [spec.name],
                                           name=fresh(f"{spec.name}_dequantize", node_names)))
            vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
            steps[spec.name] = float(scale)
        else:
            rename(d["name"], spec.name)
        vi.name = spec.name
    steps.update(_dequantized_steps(source_path, interp, session, steps))
    onnx.save_model(model, str(path))
    return steps


def _dequantized_steps(path: str, interp, session, known: dict) -> dict[str, float]:
    """Float outputs that an int8 model computes in int8 and dequantizes last (a DEQUANTIZE op): their
    quantization step, so validation counts in steps rather than a float atol."""
    interp = _undelegated(path, interp)
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


def _undelegated(path: str, interp):
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


def _convert_tflite(path: str, opset: int, dest: Path, ctx: PassContext) -> Reference:
    import tensorflow as tf
    from tf2onnx import convert

    session = TFLiteSession(Artifact(path=path, format=Format.TFLITE, sha256=""))
    _LSTM_NOTES.clear()
    try:
        with _quiet(), tf.device("/cpu:0"):
            convert._convert_common(
                None, tflite_path=path, name=Path(path).stem, continue_on_error=True, opset=opset,
                custom_op_handlers={"TFL_UNIDIRECTIONAL_SEQUENCE_LSTM": (_tfl_lstm, [])},
                tensors_to_rename=None, initialized_tables=None, output_path=str(dest))
    except OptkitError:
        raise
    except Exception as e:  # noqa: BLE001
        raise _tf2onnx_error(e, path) from None
    if _LSTM_NOTES:
        raise PassError(_LSTM_NOTES[0])
    ops = {op["op_name"] for op in session.interp._get_ops_details()}
    plain = None if "UNIDIRECTIONAL_SEQUENCE_LSTM" in ops else _plain_tf2onnx(dest.read_bytes(), session)
    steps = _tflite_io(dest, session, path)
    if steps and "UNIDIRECTIONAL_SEQUENCE_LSTM" in ops:
        ctx.note("the int8 LSTM runs in float in ONNX (ONNX has no integer LSTM), so outputs may move by a few "
                 "quantization steps; judged in output steps like every int8 output")

    def run(feeds):
        interp = session.interp
        if hasattr(interp, "reset_all_variables"):
            interp.reset_all_variables()   # stateful kernels (LSTM) carry state across invokes otherwise
        return session.run(feeds)

    batch = session.inputs[0].shape[0] if session.inputs and session.inputs[0].shape and session.inputs[0].shape[0] else None
    depths = _requantization_depths(path, session) if steps else {}
    return Reference(session.inputs, run, batch=batch, steps=steps, source="TFLite", depths=depths,
                     plain=plain if steps else None)


KERNEL_KEYS = ("median", "p90", "p99", "max", "gain", "offset", "top1_agreement_clear", "flipped_clear")
FASTER = 0.97   # the uint8 file is kept when both are exact only if its 95% interval lies below this ratio


def _kernel_errors(figures: dict, source_out: list, fused: list) -> dict[str, dict]:
    """Per output judged in steps, the step error of onnxruntime's fused int8 kernels (a default session)."""
    out = {}
    for k, (name, o) in enumerate(figures["outputs"].items()):
        q = o.get("step_error")
        if q and "median" in q:
            ref = np.asarray(source_out[k])
            e = step_errors(ref, np.asarray(fused[k]).reshape(ref.shape), q["step"],
                            q.get("clear_margin") or CLEAR_MARGIN)
            out[name] = {key: e.get(key) for key in KERNEL_KEYS}
    return out


def _exact(figures: dict, kernels: dict[str, dict]) -> bool:
    """Every output's fused-kernel error within the limits its graph arithmetic was judged by."""
    for name, k in kernels.items():
        lim = figures["outputs"][name]["step_error"]["limits"]
        if "median" in k and (k["median"] > lim["median"] or k["p90"] > lim["p90"] or k["max"] > lim["max"]):
            return False
    return True


def _choose_kernels(onnx_path: Path, figures: dict, source_out: list, judged: list, fused: list, run,
                    one_call: dict, ctx: PassContext) -> None:
    """The int8 file as converted or retyped as uint8 (retype.to_uint8: the same values), whichever onnxruntime's
    fused kernels run exactly on this CPU, the uint8 one when both are only if faster beyond the noise; the
    figures of both in figures["kernels"], the kept one's in each output's step_error["kernels"], and a note
    when the kept one's kernels are still off past the limits (the accuracy measured here carries it)."""
    s8 = _kernel_errors(figures, source_out, fused)
    u8, ratio, stored, why = None, None, "int8", ""
    variant = retype.to_uint8(onnx_io.load(onnx_path, external_data=False))
    if variant is not None:
        data = variant.SerializeToString()
        try:
            onnx.checker.check_model(variant)
            same = all(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
                       for a, b in zip(run(ort_session(data, optimization="basic")), judged))
            u8 = _kernel_errors(figures, source_out, run(ort_session(data))) if same else None
            if not same:
                log.debug("the uint8 retyping computes otherwise on the graph's arithmetic: not used")
        except Exception as e:  # noqa: BLE001 - an alternative file; the converted one stands
            log.debug("the uint8 retyping does not run: %s", first_line(e))
    if u8 is not None and _exact(figures, u8):
        if not _exact(figures, s8):
            stored, why = "uint8", "its kernels are exact on this CPU and the int8 file's are not"
        else:
            ratio = _time_uint8(onnx_path, data, one_call)
            if ratio is not None and ratio[2] < FASTER:
                stored, why = "uint8", f"it runs {ratio[0]:.2f}x the int8 file's time (95% CI {ratio[1]:.2f}-{ratio[2]:.2f}x)"
    kept = u8 if stored == "uint8" else s8
    figures["kernels"] = {"stored": stored, "int8": s8, "uint8": u8,
                          "uint8_latency_ratio": None if ratio is None else list(ratio)}
    for name, k in kept.items():
        figures["outputs"][name]["step_error"]["kernels"] = k
    if stored == "uint8":
        onnx_io.save(variant, onnx_path)
        ctx.note(f"int8 graph stored as uint8 (zero points +128: the same values, other onnxruntime kernels): {why} "
                 f"(fused kernels off the TFLite model, as int8: {_kernel_text(s8)}; as uint8: {_kernel_text(u8)})")
    for name, k in kept.items():
        q = figures["outputs"][name]["step_error"]
        if not _exact(figures, {name: k}):
            agree = "" if k.get("top1_agreement_clear") is None else f", top-1 agreement {k['top1_agreement_clear']:.3f}"
            ctx.note(f"int8 output {name!r}: onnxruntime's fused int8 kernels on this CPU are off the TFLite model by "
                     f"median {k['median']:.3g}, p90 {k['p90']:.3g}, max {k['max']:.3g} steps{agree}, where the graph's "
                     f"own arithmetic is off by median {q['median']:.3g}, p90 {q['p90']:.3g}: the conversion is "
                     "faithful, these kernels round otherwise (on x86 CPUs without VNNI, onnxruntime's u8 x s8 kernels "
                     "can saturate); the accuracy measured on this machine carries it")


def _kernel_text(kernels: dict[str, dict]) -> str:
    return ", ".join(f"{n!r} median {k['median']:.3g}, max {k['max']:.3g} steps"
                     for n, k in kernels.items() if "median" in k and k["median"] is not None)


def _time_uint8(onnx_path: Path, data: bytes, one_call: dict) -> tuple[float, float, float] | None:
    """The uint8 file's latency over the int8 file's (measure.paired.head_to_head); None when the timing failed."""
    with tempfile.TemporaryDirectory(prefix="optkit-retype-") as tmp:
        path = Path(tmp) / "uint8.onnx"
        path.write_bytes(data)
        try:
            return head_to_head(Artifact.load(str(onnx_path)), Artifact.load(str(path)), one_call)
        except Exception as e:  # noqa: BLE001 - latency informs the choice; a failure keeps the int8 file
            log.debug("the uint8 file was not timed: %s", first_line(e))
            return None


def _plain_tf2onnx(model: bytes, session: TFLiteSession):
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


def _requantization_depths(path: str, session: TFLiteSession) -> dict[str, int]:
    """Each output's depth: the most requantizations on a path from an input, an op that writes an integer
    tensor with a scale or zero point other than its first input's (QUANTIZE, convolutions, adds, means, ...;
    a reshape or max pool keeps its input's and adds none)."""
    interp = _undelegated(path, session.interp)
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


def _convert_keras(tf, path: str, opset: int, dest: Path, work: Path, config, ctx: PassContext) -> Reference:
    import tf_keras

    model = load_keras(path)
    inputs = list(model.inputs)
    specs = [TensorSpec(t.name.split(":")[0], [((d or 1) if config.static_batch else None) if i == 0 else d
                                               for i, d in enumerate(t.shape)], t.dtype.name if hasattr(
        t.dtype, "name") else str(t.dtype)) for t in inputs]
    if isinstance(model, tf_keras.Model):
        from tf2onnx import convert

        sig = [tf.TensorSpec(s.shape, s.dtype, name=s.name) for s in specs]
        try:
            with _quiet():
                convert.from_keras(model, input_signature=sig, opset=opset, output_path=str(dest))
        except OptkitError:
            raise
        except Exception as e:  # noqa: BLE001
            raise _tf2onnx_error(e, path) from None

        def run(feeds):
            xs = [tf.constant(feeds[s.name]) for s in specs]
            out = model(xs if len(xs) > 1 else xs[0], training=False)
            out = out if isinstance(out, (list, tuple)) else [out]
            return [np.asarray(o) for o in out]

        return Reference(specs, run, source="Keras")
    # Keras 3: tf2onnx cannot take the model itself; export a SavedModel first and convert that.
    saved = work / "saved_model"
    try:
        with _quiet():
            model.export(str(saved), format="tf_saved_model")
    except Exception as e:  # noqa: BLE001
        raise PassError(f"exporting the Keras 3 model {path} as a SavedModel failed: {first_line(e)}") from None
    ctx.note("Keras 3 model: exported as a SavedModel first, then converted")
    ref = _convert_saved_model(tf, str(saved), "serving_default", opset, dest)
    ref.source = "Keras"
    return ref


def _convert_saved_model(tf, path: str, signature: str | None, opset: int, dest: Path) -> Reference:
    from tf2onnx import convert, tf_loader

    loaded, fn, signature = load_signature(path, signature)
    args = fn.structured_input_signature[1]
    specs = [TensorSpec(name, [int(d) if d is not None else None for d in spec.shape], spec.dtype.name)
             for name, spec in sorted(args.items())]
    try:
        with _quiet():
            graph_def, inputs, outputs, tables, renames = tf_loader.from_saved_model(
                path, None, None, None, [signature], None, False, return_initialized_tables=True,
                return_tensors_to_rename=True)
            with tf.device("/cpu:0"):
                convert._convert_common(graph_def, name=Path(path).name, continue_on_error=False, opset=opset,
                                        input_names=inputs, output_names=outputs, tensors_to_rename=renames,
                                        initialized_tables=tables, output_path=str(dest))
    except OptkitError:
        raise
    except Exception as e:  # noqa: BLE001
        raise _tf2onnx_error(e, f"SavedModel {path}") from None

    out_names = [o.name for o in onnx_io.load(dest, external_data=False).graph.output]

    def run(feeds):
        out = fn(**{k: tf.constant(v) for k, v in feeds.items()})
        keys = out_names if all(k in out for k in out_names) else sorted(out)
        return [out[k].numpy() for k in keys]

    return Reference(specs, run, source="SavedModel")


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


# ------------------------------------------------------------------------------------------------ validation


def _validate(ref: Reference, onnx_path: Path, config, ctx: PassContext) -> dict:
    sess = ort_session(onnx_path)
    # an int8 TFLite model is judged on the graph's own arithmetic: its QDQ nodes run as written (optimization
    # "basic" fuses none of them into int8 kernels), which no CPU changes; the fused kernels this CPU runs are
    # measured beside it and a gap is said (_kernel_gap), since accuracy measured here carries it
    stepped = bool(ref.steps) and config.atol is None and config.rtol is None
    judged = ort_session(onnx_path, optimization="basic") if stepped else sess
    onnx_inputs = [spec_of(i) for i in sess.get_inputs()]
    onnx_outputs = [spec_of(o) for o in sess.get_outputs()]
    if len(onnx_inputs) != len(ref.specs):
        raise PassError(f"the ONNX model has {len(onnx_inputs)} inputs but the source model {len(ref.specs)}")
    by_name = {s.name for s in ref.specs} == {o.name for o in onnx_inputs}
    src_for = {o.name: (o.name if by_name else s.name) for o, s in zip(onnx_inputs, ref.specs)}
    feed_specs = []
    for o, s in zip(onnx_inputs, ref.specs):
        src = next(x for x in ref.specs if x.name == src_for[o.name])
        shape = [d if isinstance(d, int) else None for d in (o.shape or [])] or src.shape
        feed_specs.append(TensorSpec(o.name, shape, o.dtype))
    feeds, labels, where = validation_feeds(ctx, feed_specs, config)
    batch = ref.batch or 64  # a TFLite source may fix a batch its ONNX signature leaves dynamic

    def run_source(f):
        return ref.run({src_for[k]: v for k, v in f.items()})

    try:
        source_out = run_batched(run_source, feed_specs, feeds, batch)
    except OptkitError:
        raise
    except Exception as e:  # noqa: BLE001
        raise PassError(f"the {ref.source} model fails on the validation inputs: {type(e).__name__}: "
                        f"{first_line(e)}") from None
    try:
        out = run_batched(lambda f: judged.run(None, f), feed_specs, feeds, batch)
        fused = run_batched(lambda f: sess.run(None, f), feed_specs, feeds, batch) if stepped else None
    except Exception as e:  # noqa: BLE001 - onnxruntime errors
        raise PassError(f"onnxruntime cannot run the converted model: {first_line(e)[:300]}") from None
    names = [o.name for o in onnx_outputs]
    plain_out = None
    if ref.plain is not None and config.atol is None and config.rtol is None:
        try:
            plain_out = run_batched(lambda f: ref.plain({src_for[k]: v for k, v in f.items()}), feed_specs, feeds,
                                    batch)
        except Exception as e:  # noqa: BLE001 - then the limits come from the depth
            log.debug("plain tf2onnx's conversion does not run: %s", first_line(e))
    figures = validate(source_out, out, names, [str(np.asarray(r).dtype) for r in source_out], config, ref.source,
                       labels, steps={n: ref.steps[n] for n in names if n in ref.steps},
                       depths=ref.depths, plain=plain_out)
    figures["inputs"] = where
    if fused is not None:
        _choose_kernels(onnx_path, figures, source_out, out, fused,
                        lambda session: run_batched(lambda f: session.run(None, f), feed_specs, feeds, batch),
                        first_call(feed_specs, feeds, 1), ctx)
    for name, o in figures["outputs"].items():
        q = o.get("step_error")
        if q and "median" in q:
            agree = ("" if q.get("clear_samples") is None else
                     f"; top-1 agreement {q['top1_agreement_clear']:.3f} on the {q['clear_samples']} "
                     f"sample{'s' if q['clear_samples'] != 1 else ''} whose top class is clear by over "
                     f"{q['clear_margin']:g} steps" if q["clear_samples"] else
                     f"; no sample's top class is clear by over {q['clear_margin']:g} steps, so top-1 is not judged")
            lim = q["limits"]
            ctx.note(f"int8 output {name!r} judged in quantization steps ({q['step']:.4g}) on {where}: median "
                     f"{q['median']:.3g}, p99 {q['p99']:.3g}, max {q['max']:.3g} steps, gain {q['gain'] or 0:+.3f}, "
                     f"offset {q['offset']:+.2f}{agree} (limits from {lim['from']}: median {lim['median']:.3g}, "
                     f"p90 {lim['p90']:.3g}, max {lim['max']:.3g}, |gain| {lim['gain']:.3g}, |offset| "
                     f"{lim['offset']:.3g})")
    return figures
