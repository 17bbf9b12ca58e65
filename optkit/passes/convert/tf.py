"""convert.tf: Keras (.keras/.h5), SavedModel and TFLite (float and int8) -> ONNX through tf2onnx."""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np

from optkit.core.artifact import Artifact
from optkit.core.batching import first_call, run_batched
from optkit.core.errors import OptkitError, PassError, UsageError
from optkit.core.formats import Format
from optkit.core.registry import PassContext
from optkit.core.shapes import TensorSpec
from optkit.core.text import first_line
from optkit.onnx import graph
from optkit.onnx import io as onnx_io
from optkit.onnx.io import Staging
from optkit.onnx.session import ort_session, spec_of
from optkit.passes.convert.common import (
    check_model,
    choose_opset,
    unsupported_nodes,
    validate,
    validation_feeds,
)
from optkit.passes.convert.fromtflite import convert_tflite
from optkit.passes.convert.int8_kernels import choose_kernels, note_steps
from optkit.passes.convert.tfsource import Reference, quiet, tf2onnx_error
from optkit.runtimes.tf import import_tf, load_keras, load_signature

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
            reference = convert_tflite(artifact.path, opset, stage.model, ctx)
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
            with quiet():
                convert.from_keras(model, input_signature=sig, opset=opset, output_path=str(dest))
        except OptkitError:
            raise
        except Exception as e:  # noqa: BLE001
            raise tf2onnx_error(e, path) from None

        def run(feeds):
            xs = [tf.constant(feeds[s.name]) for s in specs]
            out = model(xs if len(xs) > 1 else xs[0], training=False)
            out = out if isinstance(out, (list, tuple)) else [out]
            return [np.asarray(o) for o in out]

        return Reference(specs, run, source="Keras")
    # Keras 3: tf2onnx cannot take the model itself; export a SavedModel first and convert that.
    saved = work / "saved_model"
    try:
        with quiet():
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
        with quiet():
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
        raise tf2onnx_error(e, f"SavedModel {path}") from None

    out_names = [o.name for o in onnx_io.load(dest, external_data=False).graph.output]

    def run(feeds):
        out = fn(**{k: tf.constant(v) for k, v in feeds.items()})
        keys = out_names if all(k in out for k in out_names) else sorted(out)
        return [out[k].numpy() for k in keys]

    return Reference(specs, run, source="SavedModel")


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
        choose_kernels(onnx_path, figures, source_out, out, fused,
                        lambda session: run_batched(lambda f: session.run(None, f), feed_specs, feeds, batch),
                        first_call(feed_specs, feeds, 1), ctx)
    note_steps(figures, where, ctx)
    return figures
