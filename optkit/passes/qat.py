"""Quantization-aware training for tf-keras models (TF-MOT): the whole model, or chosen layers, then fine-tuning.

The output is a Keras model with fake-quantization wrappers; `tflite.export --mode int8` turns it into an int8
TFLite model using the ranges learned in training. Loading it needs TF-MOT's quantize scope, which optkit's
Keras loader applies. It is saved as .h5: TF-MOT 0.8's wrappers do not load back from .keras archives.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import Field

from optkit.core.artifact import Artifact
from optkit.core.errors import UsageError
from optkit.core.formats import Format
from optkit.core.registry import Pass, PassContext, cli, register
from optkit.core.text import first_line
from optkit.passes.training.distributed import check_strategy, make_tf_strategy
from optkit.passes.training.finetune import (
    FinetuneConfig,
    check_accuracy,
    check_labels,
    check_tensorboard,
    eval_arrays,
    keras_fit,
    keras_predict,
    top1,
    train_arrays,
)
from optkit.passes.training.keras import (
    check_keras_output,
    check_layer_names,
    keras_specs,
    load_tf_keras,
    output_classes,
    private_copy,
    save_keras,
)


class QatConfig(FinetuneConfig):
    min_epochs = 1
    # annotate only these layers (default: quantize_model on the whole model)
    layers: list[str] | None = Field(default=None, description="Quantize only these layers (default: the whole "
                                                               "model; repeatable or a comma list).",
                                     json_schema_extra=cli("--layers"))
    # QAT fine-tunes a trained model gently
    learning_rate: float = Field(default=1e-4, gt=0, le=10, description="Learning rate.",
                                 json_schema_extra=cli("--learning-rate"))


@register
class KerasQat(Pass):
    name = "qat.keras"
    summary = "TF-MOT quantization-aware training (whole model or chosen layers) with fine-tuning"
    accepts = (Format.KERAS,)
    produces = Format.KERAS
    extra = "tfmot"
    Config = QatConfig

    def run(self, artifact: Artifact, config: QatConfig, ctx: PassContext) -> Artifact:
        check_tensorboard(config.tensorboard)
        check_strategy(config.strategy, "tf")
        check_keras_output(ctx.output, self.name)
        if Path(ctx.output).suffix.lower() != ".h5":
            # TF-MOT 0.8's quantize wrappers do not load back from the native .keras format (variable mismatch)
            raise UsageError(f"{self.name} writes the QAT model as HDF5: name the output *.h5, not {Path(ctx.output).name}")
        strategy = make_tf_strategy(config.strategy)
        import tensorflow_model_optimization as tfmot
        import tf_keras

        original = load_tf_keras(artifact.path)
        specs = keras_specs(original)
        x, y = train_arrays(ctx, specs, what=self.name)
        check_labels(y, output_classes(original), ctx.data["train"].source)
        if config.layers is not None:
            check_layer_names(original, config.layers, "layers (--layers)")
        held = eval_arrays(ctx, specs)
        before = top1(keras_predict(original, held[0]), held[1]) if held else None

        with strategy.scope():
            work = private_copy(original)
            try:
                if config.layers is None:
                    model = tfmot.quantization.keras.quantize_model(work)
                else:
                    annotate = tfmot.quantization.keras.quantize_annotate_layer
                    annotated = tf_keras.models.clone_model(
                        work, clone_function=lambda layer: annotate(layer) if layer.name in config.layers else layer)
                    model = tfmot.quantization.keras.quantize_apply(annotated)
            except (ValueError, RuntimeError) as e:
                first = first_line(e)
                raise UsageError(f"TF-MOT cannot quantize this model: {first}; choose the layers to quantize with "
                                 "layers (--layers)") from None
        history = keras_fit(model, x, y, config, strategy, seed=ctx.seed)
        after = top1(keras_predict(model, held[0]), held[1]) if held else None
        quantized = [layer.name for layer in model.layers if type(layer).__name__.startswith("Quantize")]
        ctx.measurements["qat"] = {"quantized_layers": len(quantized), "epochs": config.epochs,
                                   "loss": history.get("loss"), "strategy": config.strategy,
                                   "replicas": int(strategy.num_replicas_in_sync)}
        check_accuracy(ctx, before, after, config.max_accuracy_drop, self.name)
        save_keras(model, ctx.output)
        return artifact.derive(ctx.output, Format.KERAS, self.name, config.model_dump(mode="json"), qat=True)
