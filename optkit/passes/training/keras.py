"""Helpers shared by the Keras passes (prune.keras, qat.keras, tflite.export). Frameworks load lazily."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from optkit.core.atomic import atomic_path
from optkit.core.errors import UsageError
from optkit.core.shapes import TensorSpec
from optkit.runtimes.tf import import_tf, load_keras

KERAS_SUFFIXES = (".keras", ".h5")


def check_keras_output(output: Path, what: str) -> None:
    if Path(output).suffix.lower() not in KERAS_SUFFIXES:
        raise UsageError(f"{what} writes a Keras model: give the output a .keras or .h5 name, not {Path(output).name}")


def load_tf_keras(path: str):
    """A tf-keras (Keras 2) model; TF-MOT cannot work on Keras 3 models."""

    import_tf()
    import tf_keras

    model = load_keras(path)
    if not isinstance(model, tf_keras.Model):
        raise UsageError(f"{path} is a Keras 3 model; TF-MOT needs a tf-keras (Keras 2) model: load it with "
                         "tf_keras and save it again")
    if not getattr(model, "_is_graph_network", False) and not isinstance(model, tf_keras.Sequential):
        raise UsageError(f"{path} is a subclassed Keras model; pruning and QAT need a Sequential or functional model")
    return model


def keras_specs(model) -> list[TensorSpec]:
    return [TensorSpec(name, [int(d) if d is not None else None for d in t.shape], t.dtype.name)
            for name, t in zip(model.input_names, model.inputs)]


def output_classes(model) -> int:
    if len(model.outputs) != 1:
        raise UsageError(f"fine-tuning needs a single-output classifier; the model has {len(model.outputs)} outputs")
    shape = model.outputs[0].shape
    if len(shape) != 2 or shape[-1] is None or shape[-1] < 2:
        raise UsageError(f"fine-tuning needs a classifier with output [N, classes]; the output is {list(shape)}")
    return int(shape[-1])


def private_copy(model):
    """A clone with the same weights, so nothing done to it can touch the caller's model."""
    import tf_keras

    copy = tf_keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def weighted_layers(model) -> list:
    return [layer for layer in model.layers if layer.weights]


def check_layer_names(model, names: list[str], option: str) -> None:
    known = [layer.name for layer in model.layers]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"{option} names layer(s) {', '.join(unknown)} that the model does not have; "
                         f"its layers are {', '.join(known)}")


def save_keras(model, output: Path) -> None:
    with atomic_path(output) as tmp:
        if output.suffix.lower() == ".keras":
            model.save(str(tmp))  # the native format takes no include_optimizer; save uncompiled models here
        else:
            model.save(str(tmp), include_optimizer=False)


def layer_sparsity(model) -> dict[str, dict]:
    """Per-layer zero fraction of the main weight (kernel / depthwise kernel / embeddings)."""
    out = {}
    for layer in model.layers:
        kernels = [w for w in layer.weights if any(k in w.name for k in ("kernel", "embeddings"))]
        if not kernels:
            continue
        arr = np.concatenate([np.asarray(w.numpy()).ravel() for w in kernels])
        out[layer.name] = {"weights": int(arr.size), "zeros": int((arr == 0).sum()),
                           "sparsity": float((arr == 0).mean()) if arr.size else 0.0}
    return out


def overall(per_layer: dict[str, dict], names: list[str] | None = None) -> float:
    items = [v for k, v in per_layer.items() if names is None or k in names]
    total = sum(v["weights"] for v in items)
    return sum(v["zeros"] for v in items) / total if total else 0.0
