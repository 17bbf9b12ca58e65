"""TensorFlow: Keras models (.keras, .h5) and SavedModel folders."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import zipfile

import numpy as np

from optkit.core import tmp, trust
from optkit.core.artifact import Artifact
from optkit.core.errors import UsageError
from optkit.core.formats import Format
from optkit.core.registry import require_extra
from optkit.core.shapes import TensorSpec
from optkit.core.text import first_line
from optkit.runtimes.base import Session


def import_tf():
    """Import TensorFlow with the legacy Keras (tf-keras), which TF-MOT and tf2onnx need."""
    require_extra("tf", "TensorFlow models")
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    tmp.own_tempdir()  # autograph writes __autograph_generated_file*.py to $TMPDIR: keep them in optkit's folder
    with native_stderr_silenced():
        import tensorflow as tf
    tf.get_logger().setLevel("ERROR")
    return tf


@contextlib.contextmanager
def native_stderr_silenced():
    """TensorFlow's C++ start-up prints absl/CUDA notices that no environment variable turns off."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def load_keras(path: str):
    """Load a .keras/.h5 model with tf-keras, falling back to Keras 3 for Keras 3 archives.

    A Lambda layer stores Python bytecode that loading runs, and an .h5 file loads it whatever safe_mode says,
    so the configuration is read first and such a model needs --trust-code.
    """
    lambdas = lambda_layers(path)
    if lambdas:
        trust.require(f"{path} has Lambda layer {lambdas[0]!r} (Python code stored in the model); loading it")
    safe = not trust.trusted()
    import_tf()
    import tf_keras

    try:
        return tf_keras.models.load_model(path, compile=False, safe_mode=safe)
    except Exception as legacy_error:
        if "Quantize" in str(legacy_error) and importlib.util.find_spec("tensorflow_model_optimization"):
            try:  # a quantization-aware (TF-MOT) model: its wrappers load inside the quantize scope
                import tensorflow_model_optimization as tfmot

                with tfmot.quantization.keras.quantize_scope():
                    return tf_keras.models.load_model(path, compile=False, safe_mode=safe)
            except Exception:
                pass
        try:
            import keras

            return keras.models.load_model(path, compile=False, safe_mode=safe)
        except Exception:
            first = first_line(legacy_error)
            raise UsageError(f"cannot load {path} as a Keras model: {first}") from None


def lambda_layers(path: str) -> list[str]:
    """Names of the Lambda layers (and serialized Python functions) in a .keras or .h5 model's configuration."""
    config = _keras_config(path)
    found: list[str] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            cls = node.get("class_name")
            if cls in ("Lambda", "__lambda__") or node.get("function_type") == "lambda":
                cfg = node.get("config")
                found.append(str(cfg.get("name", cls)) if isinstance(cfg, dict) else str(cls))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(config)
    return found


def _keras_config(path: str):
    """The model configuration JSON without loading the model; None when the file does not hold one."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                return json.loads(z.read("config.json"))
        import h5py

        with h5py.File(path, "r") as f:
            raw = f.attrs.get("model_config")
        if raw is None:
            return None
        return json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    except Exception:  # noqa: BLE001  not a Keras file: the loader says so in its own words
        return None


def load_signature(path: str, signature: str | None = None):
    """A SavedModel's concrete function: the named signature, or the only / serving_default one."""
    tf = import_tf()
    try:
        loaded = tf.saved_model.load(path)
    except Exception as e:
        raise UsageError(f"cannot load SavedModel {path}: {first_line(e)}") from None
    sigs = dict(loaded.signatures)
    if not sigs:
        raise UsageError(f"SavedModel {path} has no signatures; re-save it with a serving signature")
    if signature is None:
        if len(sigs) == 1:
            signature = next(iter(sigs))
        elif "serving_default" in sigs:
            signature = "serving_default"
        else:
            raise UsageError(f"SavedModel {path} has signatures {', '.join(sigs)}; choose one with --signature")
    if signature not in sigs:
        raise UsageError(f"SavedModel {path} has no signature {signature!r} (it has {', '.join(sigs)})")
    return loaded, sigs[signature], signature


def _spec_shape(shape) -> list:
    return [int(d) if d is not None else None for d in shape]


class TFSession(Session):
    runtime = "tensorflow"

    @classmethod
    def warm(cls, fmt=None) -> None:
        import_tf().zeros([1])  # the import and the eager runtime's first op

    def __init__(self, artifact: Artifact, threads: int | None = None):
        tf = import_tf()
        if threads:
            try:
                tf.config.threading.set_intra_op_parallelism_threads(threads)
                tf.config.threading.set_inter_op_parallelism_threads(1)
            except RuntimeError:
                pass  # already initialised in this process
        self.threads = threads
        self._tf = tf
        if artifact.format == Format.KERAS:
            self.model = load_keras(artifact.path)
            self.inputs = [TensorSpec(t.name.split(":")[0], _spec_shape(t.shape), t.dtype.name)
                           for t in self.model.inputs]
            self._fn = tf.function(lambda *xs: self.model(list(xs) if len(xs) > 1 else xs[0], training=False))
            self._keyword = False
            self.outputs = [TensorSpec(n, _spec_shape(t.shape), t.dtype.name)
                            for n, t in zip(self.model.output_names, self.model.outputs)]
        else:
            self._loaded, self._fn, self.signature = load_signature(artifact.path, artifact.meta.get("signature"))
            args = self._fn.structured_input_signature[1]
            self.inputs = [TensorSpec(name, _spec_shape(spec.shape), spec.dtype.name)
                           for name, spec in sorted(args.items())]
            outs = self._fn.structured_outputs
            self.outputs = [TensorSpec(name, _spec_shape(t.shape), t.dtype.name) for name, t in sorted(outs.items())]
            self._keyword = True

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self._keyword:
            out = self._fn(**{k: self._tf.constant(v) for k, v in feeds.items()})
            return [out[s.name].numpy() for s in self.outputs]
        out = self._fn(*[self._tf.constant(feeds[s.name]) for s in self.inputs])
        out = out if isinstance(out, (list, tuple)) else [out]
        return [o.numpy() for o in out]

    def parameter_count(self) -> int | None:
        if self._keyword:
            return int(sum(np.prod(v.shape) for v in self._loaded.variables))
        return int(self.model.count_params())

    def op_histogram(self) -> dict[str, int]:
        from collections import Counter

        if self._keyword:
            graph = self._fn.graph.as_graph_def()
            ops = [n.op for n in graph.node] + [n.op for f in graph.library.function for n in f.node_def]
            return dict(Counter(ops).most_common())
        return dict(Counter(type(layer).__name__ for layer in self.model.layers).most_common())
