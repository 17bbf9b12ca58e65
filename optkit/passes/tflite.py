"""TFLite export: float32, float16, dynamic-range or full int8 (representative dataset; int8 or float I/O).

`sparse` (float32 only) stores pruned weights in TFLite's sparse tensor format, so their zeros leave the file.

Works on Keras models (including QAT models from `qat.keras`, whose learned ranges are used) and SavedModels.
The result is checked against the source model on sample inputs before it takes its name.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from optkit.core.artifact import Artifact
from optkit.core.atomic import atomic_path
from optkit.core.errors import PassError, UsageError, ValidationError
from optkit.core.formats import Format
from optkit.core.registry import MAX_SAMPLES, Pass, PassConfig, PassContext, cli, register
from optkit.core.shapes import TensorSpec
from optkit.core.text import first_line
from optkit.measure.fidelity import compare_outputs
from optkit.measure.inputs import synthesize
from optkit.passes.training.keras import keras_specs
from optkit.runtimes.tf import import_tf, load_keras, load_signature
from optkit.runtimes.tflite import TFLiteSession

# Least cosine similarity to the source model's outputs each mode must keep (override with min_cosine).
MIN_COSINE = {"float32": 0.99999, "float16": 0.999, "dynamic": 0.99, "int8": 0.98}


class TFLiteConfig(PassConfig):
    mode: Literal["float32", "float16", "dynamic", "int8"] = Field(
        default="float32", description="float32, float16, dynamic or int8.", json_schema_extra=cli("--mode"))
    # int8: the model's inputs and outputs are int8 too (mode int8)
    io: Literal["float", "int8"] = Field(default="float", description="int8 mode: float or int8 inputs and outputs.",
                                         json_schema_extra=cli("--io"))
    # store pruned weights in TFLite's sparse tensor format
    sparse: bool = Field(default=False, description="float32: store pruned weights sparse (values + indices).",
                         json_schema_extra=cli("--sparse"))
    calibration_samples: int = Field(default=200, ge=1, le=MAX_SAMPLES, description="Samples used from the calibration data.",
                                     json_schema_extra=cli("--calibration-samples", group="data"))
    # SavedModel signature (default: the only / serving_default)
    signature: str | None = Field(default=None, description="SavedModel signature.",
                                  json_schema_extra=cli("--signature"))
    min_cosine: float | None = Field(default=None, ge=-1, le=1,
                                     description="Fail below this output cosine to the source (default per mode).",
                                     json_schema_extra=cli("--min-cosine", group="budgets"))
    check_samples: int = Field(default=64, ge=1, le=MAX_SAMPLES, description="Inputs the outputs are compared to the source's on.",
                               json_schema_extra=cli("--check-samples", group="evaluation"))

    @model_validator(mode="after")
    def _io(self):
        if self.io == "int8" and self.mode != "int8":
            raise ValueError("io int8 needs mode int8 (--io int8 needs --mode int8)")
        if self.sparse and self.mode != "float32":  # measured: int8 and float16 files grow, dynamic ones fail to load
            raise ValueError("sparse needs mode float32 (--sparse needs --mode float32)")
        return self


def _source(artifact: Artifact, config: TFLiteConfig):
    """(converter, specs, reference function numpy->list[numpy], is_qat)."""

    tf = import_tf()
    if artifact.format == Format.KERAS:
        model = load_keras(artifact.path)
        qat = any(type(layer).__name__.startswith("Quantize") for layer in model.layers)
        specs = keras_specs(model)
        converter = tf.lite.TFLiteConverter.from_keras_model(model)

        def reference(feeds):
            xs = [feeds[s.name] for s in specs]
            out = model(xs if len(xs) > 1 else xs[0], training=False)
            return [o.numpy() for o in (out if isinstance(out, (list, tuple)) else [out])]
        return converter, specs, reference, qat

    loaded, fn, name = load_signature(artifact.path, config.signature or artifact.meta.get("signature"))
    args = fn.structured_input_signature[1]
    specs = [TensorSpec(n, [int(d) if d is not None else None for d in s.shape], s.dtype.name)
             for n, s in sorted(args.items())]
    converter = tf.lite.TFLiteConverter.from_saved_model(artifact.path, signature_keys=[name])
    out_names = sorted(fn.structured_outputs)

    def reference(feeds):
        out = fn(**{k: tf.constant(v) for k, v in feeds.items()})
        return [out[n].numpy() for n in out_names]
    return converter, specs, reference, False


def _samples(ctx: PassContext, specs, n: int, key_order=("calibration", "train", "eval")):
    for key in key_order:
        ds = ctx.data.get(key)
        if ds is not None:
            return ds.subset(n, ctx.seed).bind(specs), ds.source
    return None, None


@register
class TFLiteExport(Pass):
    name = "tflite.export"
    summary = "Keras / SavedModel -> TFLite: float32, float16, dynamic range, or int8 (int8 or float I/O)"
    accepts = (Format.KERAS, Format.TF_SAVEDMODEL)
    produces = Format.TFLITE
    extra = "tf"
    Config = TFLiteConfig

    def run(self, artifact: Artifact, config: TFLiteConfig, ctx: PassContext) -> Artifact:
        import numpy as np

        if Path(ctx.output).suffix.lower() != ".tflite":
            raise UsageError(f"{self.name} writes a .tflite file; name the output *.tflite, not {Path(ctx.output).name}")
        tf = import_tf()
        converter, specs, reference, qat = _source(artifact, config)
        if config.mode in ("float16", "dynamic", "int8"):
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if config.sparse:  # weights with enough zeros are written as values + indices; the runtime densifies them
            converter.optimizations = [tf.lite.Optimize.EXPERIMENTAL_SPARSITY]
        if config.mode == "float16":
            converter.target_spec.supported_types = [tf.float16]
        if config.mode == "int8":
            calib, source = _samples(ctx, specs, config.calibration_samples)
            if calib is None and not qat:
                raise UsageError("int8 TFLite needs a representative dataset: give calibration data (data.calibration / --calib DATA) "
                                 "(or export a QAT model, which carries its own ranges)")
            if calib is not None:
                n = len(next(iter(calib.values())))

                def representative():
                    for i in range(n):
                        yield [calib[s.name][i:i + 1] for s in specs]
                converter.representative_dataset = representative
                ctx.note(f"int8 calibrated on {n} samples of {source}")
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            if config.io == "int8":
                converter.inference_input_type = tf.int8
                converter.inference_output_type = tf.int8
        try:
            blob = converter.convert()
        except Exception as e:
            first = first_line(e)
            raise PassError(f"the TFLite converter failed ({config.mode}): {first}") from None

        feeds, _ = _samples(ctx, specs, config.check_samples, ("eval", "calibration", "train"))
        if feeds is None:
            feeds = synthesize(specs, ctx.shapes, batch=8, seed=ctx.seed)
        want = reference(feeds)
        floor = config.min_cosine if config.min_cosine is not None else MIN_COSINE[config.mode]
        with atomic_path(ctx.output) as tmp:
            tmp.write_bytes(blob)
            session = TFLiteSession(Artifact.load(tmp))
            names = [s.name for s in session.inputs]
            order = [s.name for s in specs]
            got = session.run({n: feeds[n] if n in feeds else feeds[order[i]] for i, n in enumerate(names)})
            fid = compare_outputs(want, got, [s.name for s in session.outputs])
            ctx.measurements["conversion_fidelity"] = fid
            cos = fid["cosine"]
            if cos < floor:
                raise ValidationError(f"the {config.mode} TFLite model drifts from the source: output cosine "
                                      f"{cos:.5f} < {floor} on {len(want[0])} samples (max abs error "
                                      f"{max(float(np.max(np.abs(a - b.reshape(a.shape)))) for a, b in zip(want, got)):.3g})")
        return artifact.derive(ctx.output, Format.TFLITE, self.name, config.model_dump(mode="json"),
                               mode=config.mode, io=config.io)
