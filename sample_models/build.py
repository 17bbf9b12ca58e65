"""Build the sample models used by optkit's recipes, tests and benchmarks.

Trains two small, real CNNs on scikit-learn's bundled 8x8 digits dataset
(1797 images, 10 classes; pixels scaled to 0..1) and writes, next to this file:

  data:   digits_{calib,eval}_{nchw,nhwc}.npz   (key "input", eval also "labels")
  torch:  torch_cnn.py (source), torch_cnn_state.pt, torch_cnn.ts.pt,
          torch_cnn.pt2, torch_cnn.onnx
  keras:  keras_cnn.keras, keras_cnn.h5, keras_cnn_savedmodel/, keras_cnn.tflite
  quickstart: quickstart_cnn.onnx, the quickstart recipe's model: the same digits
          upsampled in the graph to 32x32 and read by wide 3x3 convolutions
          (64 and 128 channels), ~1.7 ms at batch 1 on one thread, where
          static INT8 is clearly faster than float32 on AVX2 and AVX-512 VNNI
          CPUs alike; no depthwise conv and no thin layer but the stem.
  manifest.json: every file with its size and the eval top-1 measured by
          loading it back from disk.

Every model takes an input named "input" and returns logits named "logits".
Seeds are fixed, so a rebuild gives the same splits and (on the same machine
and library versions) the same weights.

    python sample_models/build.py             # everything
    python sample_models/build.py quickstart  # quickstart_cnn.onnx alone, on the data files already here
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

# Must be set before TensorFlow is first imported (tf-keras / Keras 2 API).
os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

HERE = Path(__file__).resolve().parent
SEED = 0
N_EVAL = 497
N_CALIB = 100
EPOCHS = 20
BATCH = 32
MIN_TOP1 = 0.95


# ----------------------------------------------------------------------- data
def load_splits() -> dict[str, np.ndarray]:
    """Stratified split of the 1797 digits: train 1200, calib 100, eval 497."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32).reshape(-1, 8, 8)
    y = digits.target.astype(np.int64)
    x_rest, x_eval, y_rest, y_eval = train_test_split(
        x, y, test_size=N_EVAL, stratify=y, random_state=SEED)
    x_train, x_calib, y_train, _ = train_test_split(
        x_rest, y_rest, test_size=N_CALIB, stratify=y_rest, random_state=SEED)
    return dict(x_train=x_train, y_train=y_train, x_calib=x_calib,
                x_eval=x_eval, y_eval=y_eval)


def nchw(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x[:, None, :, :])


def nhwc(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x[:, :, :, None])


def write_data(d: dict[str, np.ndarray]) -> None:
    for layout, to in (("nchw", nchw), ("nhwc", nhwc)):
        np.savez(HERE / f"digits_calib_{layout}.npz", input=to(d["x_calib"]))
        np.savez(HERE / f"digits_eval_{layout}.npz", input=to(d["x_eval"]), labels=d["y_eval"])
        np.savez_compressed(HERE / f"digits_train_{layout}.npz", input=to(d["x_train"]), labels=d["y_train"])


def top1(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((np.asarray(logits).argmax(axis=1) == labels).mean())


# ---------------------------------------------------------------------- torch
def build_torch(d: dict[str, np.ndarray]) -> dict[str, float]:
    import torch
    import onnx
    import onnxruntime as ort

    sys.path.insert(0, str(HERE))
    import torch_cnn

    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)

    model = torch_cnn.make_model(weights=None).train()
    x_train = torch.from_numpy(nchw(d["x_train"]))
    y_train = torch.from_numpy(d["y_train"])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(SEED)
    for _ in range(EPOCHS):
        for idx in torch.randperm(len(x_train), generator=gen).split(BATCH):
            opt.zero_grad()
            loss_fn(model(x_train[idx]), y_train[idx]).backward()
            opt.step()
    model.eval()

    x_eval = torch.from_numpy(nchw(d["x_eval"]))
    y_eval = d["y_eval"]
    with torch.no_grad():
        ref = model(x_eval).numpy()
    acc = {}

    # State dict, read back through the factory the way optkit loads it.
    state_path = HERE / "torch_cnn_state.pt"
    torch.save(model.state_dict(), state_path)
    with torch.no_grad():
        acc[state_path.name] = top1(torch_cnn.make_model(state_path)(x_eval).numpy(), y_eval)
        acc["torch_cnn.py:make_model"] = top1(torch_cnn.make_model()(x_eval).numpy(), y_eval)

    # TorchScript.
    ts_path = HERE / "torch_cnn.ts.pt"
    torch.jit.save(torch.jit.script(model), ts_path)
    with torch.no_grad():
        acc[ts_path.name] = top1(torch.jit.load(ts_path)(x_eval).numpy(), y_eval)

    # torch.export program with a dynamic batch dimension. The example batch is
    # > 1 so the exporter does not specialise the batch size to 1.
    batch = torch.export.Dim("batch", min=1)
    example = (torch.zeros(2, 1, 8, 8),)
    pt2_path = HERE / "torch_cnn.pt2"
    torch.export.save(torch.export.export(model, example, dynamic_shapes=({0: batch},)), pt2_path)
    with torch.no_grad():
        acc[pt2_path.name] = top1(torch.export.load(pt2_path).module()(x_eval).numpy(), y_eval)

    # ONNX (dynamo exporter), re-saved as one self-contained file.
    onnx_path = HERE / "torch_cnn.onnx"
    torch.onnx.export(model, example, onnx_path, input_names=["input"], output_names=["logits"],
                      dynamic_shapes=({0: batch},), opset_version=18, dynamo=True,
                      verbose=False)
    proto = onnx.load(onnx_path)  # pulls in external data if any was written
    stray = HERE / "torch_cnn.onnx.data"
    if stray.exists():
        stray.unlink()
    onnx.save(proto, onnx_path, save_as_external_data=False)
    onnx.checker.check_model(str(onnx_path), full_check=True)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["input"], sess.get_inputs()
    assert [o.name for o in sess.get_outputs()] == ["logits"], sess.get_outputs()
    out = sess.run(["logits"], {"input": x_eval.numpy()})[0]
    err = float(np.abs(out - ref).max())
    assert err < 1e-4, f"onnxruntime differs from torch by {err}"
    acc[onnx_path.name] = top1(out, y_eval)
    return acc


# ---------------------------------------------------------------------- keras
def build_keras(d: dict[str, np.ndarray]) -> dict[str, float]:
    import tensorflow as tf
    import tf_keras as keras

    keras.utils.set_random_seed(SEED)  # python, numpy and tf seeds
    tf.config.experimental.enable_op_determinism()

    inp = keras.Input(shape=(8, 8, 1), name="input")
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inp)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.MaxPool2D()(h)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dense(64, activation="relu")(h)
    out = keras.layers.Dense(10, name="logits")(h)
    model = keras.Model(inp, out, name="digits_cnn")
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(nhwc(d["x_train"]), d["y_train"], batch_size=BATCH, epochs=EPOCHS,
              shuffle=True, verbose=0)

    x_eval, y_eval = nhwc(d["x_eval"]), d["y_eval"]
    ref = model.predict(x_eval, verbose=0)
    acc = {}

    # Save a freshly compiled copy: same weights and compile settings, but an
    # optimizer that has not created its variables yet, so no optimizer state
    # (three times the weights) is written into the files.
    plain = keras.models.clone_model(model)
    plain.set_weights(model.get_weights())
    plain.compile(optimizer=keras.optimizers.Adam(1e-3), loss=model.loss)
    for name in ("keras_cnn.keras", "keras_cnn.h5"):
        plain.save(HERE / name)
        loaded = keras.models.load_model(HERE / name)
        acc[name] = top1(loaded.predict(x_eval, verbose=0), y_eval)

    # SavedModel with a serving_default signature: {"input"} -> {"logits"}.
    sm_path = HERE / "keras_cnn_savedmodel"
    shutil.rmtree(sm_path, ignore_errors=True)

    @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 1], tf.float32, name="input")])
    def serve(x):
        return {"logits": plain(x, training=False)}

    tf.saved_model.save(plain, str(sm_path), signatures={"serving_default": serve})
    sig = tf.saved_model.load(str(sm_path)).signatures["serving_default"]
    assert list(sig.structured_input_signature[1]) == ["input"], sig.structured_input_signature
    acc[sm_path.name + "/"] = top1(sig(input=tf.constant(x_eval))["logits"].numpy(), y_eval)

    # Float32 TFLite from the SavedModel (signature keeps the names input/logits).
    tfl_path = HERE / "keras_cnn.tflite"
    tfl_path.write_bytes(tf.lite.TFLiteConverter.from_saved_model(str(sm_path)).convert())
    interp = tf.lite.Interpreter(model_path=str(tfl_path))
    runner = interp.get_signature_runner("serving_default")
    out = runner(input=x_eval)["logits"]
    err = float(np.abs(out - ref).max())
    assert err < 1e-4, f"TFLite differs from Keras by {err}"
    acc[tfl_path.name] = top1(out, y_eval)
    return acc


# ----------------------------------------------------------------- quickstart
QUICKSTART_EPOCHS = 3


def build_quickstart(d: dict[str, np.ndarray]) -> dict[str, float]:
    """quickstart_cnn.onnx: a CNN of milliseconds (not the digits CNN's microseconds), so INT8's speed shows."""
    import onnx
    import onnxruntime as ort
    import torch
    from torch import nn

    torch.manual_seed(SEED)
    wide, wider = 64, 128

    def block(cin: int, cout: int, k: int = 3) -> list:
        return [nn.Conv2d(cin, cout, k, padding=k // 2), nn.BatchNorm2d(cout), nn.ReLU()]

    class QuickstartCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Upsample(scale_factor=4, mode="nearest")  # 8x8 digits -> 32x32: the input stays the digits'
            self.features = nn.Sequential(*block(1, wide), *block(wide, wide), nn.MaxPool2d(2),
                                          *block(wide, wider), *block(wider, wider), nn.MaxPool2d(2),
                                          *block(wider, 32, 1))
            self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 8 * 8, 10))

        def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
            return self.head(self.features(self.up(input)))

    model = QuickstartCNN().train()
    x_train, y_train = torch.from_numpy(nchw(d["x_train"])), torch.from_numpy(d["y_train"])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(SEED)
    for _ in range(QUICKSTART_EPOCHS):
        for idx in torch.randperm(len(x_train), generator=gen).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
            opt.step()
    model.eval()
    x_eval = torch.from_numpy(nchw(d["x_eval"]))
    with torch.no_grad():
        ref = model(x_eval).numpy()
    path = HERE / "quickstart_cnn.onnx"
    torch.onnx.export(model, (torch.zeros(1, 1, 8, 8),), path, input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17, dynamo=False)
    onnx.checker.check_model(str(path), full_check=True)
    out = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["logits"],
                                                                                {"input": x_eval.numpy()})[0]
    err = float(np.abs(out - ref).max())
    assert err < 1e-3, f"onnxruntime differs from torch by {err}"
    return {path.name: top1(out, d["y_eval"])}


def read_splits() -> dict[str, np.ndarray]:
    """The splits as the data files here hold them (the quickstart model alone is rebuilt on them)."""
    out = {}
    for split in ("train", "calib", "eval"):
        data = np.load(HERE / f"digits_{split}_nchw.npz")
        out[f"x_{split}"] = data["input"][:, 0]
        if "labels" in data:
            out[f"y_{split}"] = data["labels"]
    return out


# ----------------------------------------------------------------------- main
def size_of(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


# Every model file, with its optkit format and input layout.
MODELS = {
    "torch_cnn.py:make_model": ("torch-module", "nchw"),
    "torch_cnn_state.pt": ("torch-state-dict", "nchw"),
    "torch_cnn.ts.pt": ("torchscript", "nchw"),
    "torch_cnn.pt2": ("torch-export", "nchw"),
    "torch_cnn.onnx": ("onnx", "nchw"),
    "keras_cnn.keras": ("keras", "nhwc"),
    "keras_cnn.h5": ("keras", "nhwc"),
    "keras_cnn_savedmodel/": ("tf-savedmodel", "nhwc"),
    "keras_cnn.tflite": ("tflite", "nhwc"),
    "quickstart_cnn.onnx": ("onnx", "nchw"),
}


def quickstart_only() -> None:
    """Rebuild quickstart_cnn.onnx on the data files here and update its manifest entry."""
    accuracy = build_quickstart(read_splits())["quickstart_cnn.onnx"]
    manifest = json.loads((HERE / "manifest.json").read_text())
    manifest["files"]["quickstart_cnn.onnx"] = {"format": "onnx", "input_layout": "nchw",
                                                "bytes": size_of(HERE / "quickstart_cnn.onnx"),
                                                "eval_top1": round(accuracy, 4)}
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"quickstart_cnn.onnx {size_of(HERE / 'quickstart_cnn.onnx'):,d} B  top1={accuracy:.4f}")
    if accuracy < MIN_TOP1:
        sys.exit(f"accuracy below {MIN_TOP1}: {accuracy}")


def main() -> None:
    d = load_splits()
    write_data(d)
    accuracies = {**build_torch(d), **build_keras(d), **build_quickstart(d)}

    files = {}
    for name in sorted(p.name for p in HERE.glob("digits_*.npz")):
        files[name] = {"format": "npz", "bytes": size_of(HERE / name)}
    for name, (fmt, layout) in MODELS.items():
        path = HERE / name.split(":")[0].rstrip("/")
        files[name] = {"format": fmt, "input_layout": layout, "bytes": size_of(path),
                       "eval_top1": round(accuracies[name], 4)}
    manifest = {
        "dataset": "sklearn.datasets.load_digits, pixels / 16, float32",
        "splits": {"train": len(d["x_train"]), "calib": len(d["x_calib"]), "eval": len(d["x_eval"])},
        "seed": SEED,
        "input": {"name": "input", "nchw": "float32 [N,1,8,8]", "nhwc": "float32 [N,8,8,1]"},
        "output": {"name": "logits", "shape": "float32 [N,10]"},
        "files": files,
    }
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")

    for name, info in files.items():
        print(f"{name:26s} {info['format']:16s} {info['bytes']:>9,d} B  top1={info.get('eval_top1', '-')}")
    low = {k: v for k, v in accuracies.items() if v < MIN_TOP1}
    if low:
        sys.exit(f"accuracy below {MIN_TOP1}: {low}")


if __name__ == "__main__":
    quickstart_only() if sys.argv[1:] == ["quickstart"] else main()
