"""optkit convert: PyTorch and TensorFlow models to validated ONNX (real torch, tf, tf2onnx, onnxruntime)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from optkit.core import trust
from optkit.core.artifact import Artifact
from optkit.core.errors import PassError, UsageError, ValidationError
from optkit.measure.datasets import Dataset, load_dataset
from optkit.pipeline.stage import run_pass

from conftest import SAMPLES, no_result_files, one_error_line

HERE = Path(__file__).resolve().parent
ZOO = HERE / "models_zoo.py"

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("convert")


def convert(spec, pass_name, out_path, config=None, data=None, shapes=None, **meta):
    artifact = Artifact.load(str(spec), **meta)
    ctx_data = {"eval": data} if data is not None else {}
    return run_pass(artifact, pass_name, config or {}, out_path, data=ctx_data, shapes=shapes or {})


def ort_session(path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def check_onnx(path):
    import onnx

    onnx.checker.check_model(str(path), full_check=True)
    return onnx.load(str(path))


def assert_nothing_written(folder: Path, before: list[str]):
    assert no_result_files(folder) == before


# --------------------------------------------------------------------------------------------- PyTorch samples


@pytest.fixture(scope="module")
def digits_nchw():
    return load_dataset(SAMPLES / "digits_eval_nchw.npz")


@pytest.fixture(scope="module")
def digits_nhwc():
    return load_dataset(SAMPLES / "digits_eval_nhwc.npz")


@pytest.mark.parametrize("spec,meta,config", [
    ("torch_cnn.py:make_model", {"weights": str(SAMPLES / "torch_cnn_state.pt")}, {"dynamic": ["batch"]}),
    ("torch_cnn.pt2", {}, {}),
    ("torch_cnn.ts.pt", {}, {}),
])
def test_torch_samples(spec, meta, config, out, digits_nchw):
    dest = out / f"{spec.split(':')[0].replace('.', '_')}.onnx"
    shapes = {"": [1, 1, 8, 8]} if spec.endswith(".ts.pt") else None
    result = convert(SAMPLES / spec, "convert.torch", dest, config, data=digits_nchw, shapes=shapes, **meta)
    assert result.output.format.value == "onnx" and dest.is_file()
    check_onnx(dest)
    val = result.ctx.measurements["validation"]
    assert val["outputs"]["output"]["max_abs_error"] < 1e-4
    assert val["top1_agreement"] == 1.0
    assert val["onnx_top1"] == val["source_top1"] > 0.9
    assert val["opset"] >= 18 if val["exporter"] == "dynamo" else val["opset"] <= 20
    if spec.endswith(".ts.pt"):
        assert val["exporter"] == "legacy" and any("TorchScript exporter" in n for n in result.ctx.notes)
    if config.get("dynamic"):  # dynamic batch really is dynamic
        sess = ort_session(dest)
        y = sess.run(None, {"input": digits_nchw.arrays["input"][:5]})[0]
        assert y.shape == (5, 10)
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]


def test_legacy_exporter_and_opset(out):
    dest = out / "legacy.onnx"
    result = convert(f"{SAMPLES}/torch_cnn.py:make_model", "convert.torch", dest,
                     {"exporter": "legacy", "opset": 17})
    assert result.ctx.measurements["validation"]["exporter"] == "legacy"
    assert check_onnx(dest).opset_import[0].version == 17


# --------------------------------------------------------------------------------------------- architectures


def test_torch_resnet18_and_mobilenetv2(out):
    for name in ("resnet18", "mobilenetv2"):
        dest = out / f"torch_{name}.onnx"
        result = convert(f"{ZOO}:make_{name}", "convert.torch", dest, {"dynamic": ["batch"]},
                         shapes={"": [1, 3, 64, 64]})
        check_onnx(dest)
        val = result.ctx.measurements["validation"]
        assert val["exporter"] == "dynamo"
        assert val["top1_agreement"] == 1.0 and val["max_abs_error"] < 1e-3, val


def test_torch_transformer_with_mask_dynamic_seq(out):
    from models_zoo import encoder_data

    data = Dataset(encoder_data(), source="encoder")
    dest = out / "torch_encoder.onnx"
    result = convert(f"{ZOO}:make_encoder", "convert.torch", dest, {"dynamic": ["batch", "*:1=seq"]}, data=data)
    check_onnx(dest)
    assert result.ctx.measurements["validation"]["max_abs_error"] < 1e-3
    import torch
    from models_zoo import make_encoder

    feeds = encoder_data(n=3, seq=7, seed=1)   # another batch and sequence length
    y = ort_session(dest).run(None, feeds)[0]
    with torch.inference_mode():
        ref = make_encoder()(*(torch.from_numpy(v) for v in feeds.values())).numpy()
    assert y.shape == (3, 5) and np.abs(y - ref).max() < 1e-3


def test_torch_lstm(out):
    dest = out / "torch_lstm.onnx"
    result = convert(f"{ZOO}:make_lstm", "convert.torch", dest, {"dynamic": ["batch"]}, shapes={"": [2, 10, 12]})
    check_onnx(dest)
    assert result.ctx.measurements["validation"]["max_abs_error"] < 1e-4


# --------------------------------------------------------------------------------------------- TensorFlow samples


@pytest.mark.parametrize("name", ["keras_cnn.keras", "keras_cnn.h5", "keras_cnn_savedmodel", "keras_cnn.tflite"])
def test_tf_samples(name, out, digits_nhwc):
    dest = out / f"{name.replace('.', '_')}.onnx"
    result = convert(SAMPLES / name, "convert.tf", dest, data=digits_nhwc)
    check_onnx(dest)
    val = result.ctx.measurements["validation"]
    assert val["max_abs_error"] < 1e-4 and val["top1_agreement"] == 1.0
    assert val["onnx_top1"] == val["source_top1"] > 0.9
    sess = ort_session(dest)
    assert sess.get_inputs()[0].name == "input"   # named like the source model's input, not a raw tensor name


@pytest.fixture(scope="module")
def mnist(realcases):
    return load_dataset(realcases / "t10k-images-idx3-ubyte.gz").subset(1000, 0)


@pytest.mark.parametrize("name", ["trained_lstm.tflite", "trained_lstm_int8.tflite"])
def test_realcase_lstm_tflite(name, out, realcases, mnist):
    dest = out / name.replace(".tflite", ".onnx")
    result = convert(realcases / name, "convert.tf", dest, {"samples": 1000}, data=mnist)
    model = check_onnx(dest)
    assert "LSTM" in {n.op_type for n in model.graph.node}
    val = result.ctx.measurements["validation"]
    assert "1000 samples" in val["inputs"]
    if "int8" in name:
        # ONNX has no integer LSTM: it runs in float, so a handful of images may flip
        assert val["top1_agreement"] >= 0.995
        assert abs(val["onnx_top1"] - val["source_top1"]) <= 0.002
        assert any("int8 LSTM" in n for n in result.ctx.notes)
    else:
        assert val["top1_agreement"] == 1.0 and val["onnx_top1"] == val["source_top1"]
        assert val["max_abs_error"] < 1e-4
    assert val["onnx_top1"] > 0.9
    # the ONNX model takes 0..1 floats like the TFLite runtime does, int8 I/O included
    sess = ort_session(dest)
    assert sess.get_inputs()[0].type == "tensor(float)"


@pytest.fixture(scope="module")
def tf_keras():
    from optkit.runtimes.tf import import_tf

    import_tf()
    import tf_keras

    return tf_keras


@pytest.mark.parametrize("builder", ["keras_resnet", "keras_mobilenetv2", "keras_lstm", "keras_encoder"])
def test_tf_keras_architectures(builder, tf_keras, out):
    import models_zoo

    model = getattr(models_zoo, builder)(tf_keras)
    src = out / f"{builder}.h5"
    model.save(src)
    data = None
    if builder == "keras_encoder":
        data = Dataset(models_zoo.encoder_data(), source="encoder")
    dest = out / f"{builder}.onnx"
    result = convert(src, "convert.tf", dest, data=data)
    check_onnx(dest)
    assert result.ctx.measurements["validation"]["max_abs_error"] < 1e-3
    if builder == "keras_encoder":  # dynamic sequence length
        feeds = models_zoo.encoder_data(n=2, seq=6, seed=3)
        y = ort_session(dest).run(None, feeds)[0]
        ref = model([feeds["input_ids"], feeds["attention_mask"]], training=False).numpy()
        assert np.abs(y - ref).max() < 1e-3


def test_savedmodel_signatures(tf_keras, out):
    import tensorflow as tf

    class Two(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.random.stateless_normal((4, 3), seed=(1, 2)))

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def logits(self, x):
            return {"y": tf.matmul(x, self.w)}

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def probs(self, x):
            return {"p": tf.nn.softmax(tf.matmul(x, self.w))}

    m = Two()
    two = out / "two_sigs"
    tf.saved_model.save(m, str(two), signatures={"logits": m.logits, "probs": m.probs})
    before = no_result_files(out)
    with pytest.raises(UsageError, match="choose one with --signature"):
        convert(two, "convert.tf", out / "two.onnx")
    result = convert(two, "convert.tf", out / "two.onnx", {"signature": "probs"})
    assert result.ctx.measurements["validation"]["max_abs_error"] < 1e-5
    assert [o.name for o in ort_session(out / "two.onnx").get_outputs()] == ["p"]

    none = out / "no_sigs"
    tf.saved_model.save(tf.Module(), str(none))
    before = no_result_files(out)
    with pytest.raises(UsageError, match="no signatures"):
        convert(none, "convert.tf", out / "none.onnx")
    assert_nothing_written(out, before)


# --------------------------------------------------------------------------------------------- bad input

BAD = '''
import torch
from torch import nn


def raises():
    raise RuntimeError("no GPU here")


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)


def small():
    return Small().eval()


@torch.library.custom_op("optkit_test::weird", mutates_args=())
def weird(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@weird.register_fake
def _(x):
    return torch.empty_like(x)


class Weird(Small):
    def forward(self, x):
        return weird(self.fc(x))


def make_weird():
    return Weird().eval()


def example_inputs():
    return (torch.zeros(1, 4),)
'''


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    import torch

    folder = tmp_path_factory.mktemp("bad")
    (folder / "bad_models.py").write_text(BAD)
    torch.save({"wrong.weight": torch.zeros(3, 4)}, folder / "mismatch.pt")
    return folder


def test_factory_raises(bad):
    with pytest.raises(UsageError, match="raised RuntimeError: no GPU here"):
        convert(f"{bad}/bad_models.py:raises", "convert.torch", bad / "x.onnx")


def test_state_dict_mismatch(bad):
    with pytest.raises(UsageError, match="do not match the model: missing fc.weight"):
        convert(f"{bad}/bad_models.py:small", "convert.torch", bad / "x.onnx", weights=str(bad / "mismatch.pt"))


def test_pickled_whole_model_needs_trust(bad, monkeypatch):
    import importlib.util
    import sys

    import torch

    spec = importlib.util.spec_from_file_location("bad_models", bad / "bad_models.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bad_models"] = mod
    spec.loader.exec_module(mod)
    torch.save(mod.small(), bad / "whole.pt")
    before = no_result_files(bad)
    with pytest.raises(UsageError, match="pickled whole model.*--trust-code"):
        convert(f"{bad}/bad_models.py:small", "convert.torch", bad / "w.onnx", weights=str(bad / "whole.pt"))
    assert_nothing_written(bad, before)
    monkeypatch.setenv(trust.ENV, "1")
    result = convert(f"{bad}/bad_models.py:small", "convert.torch", bad / "w.onnx", weights=str(bad / "whole.pt"))
    assert result.ctx.measurements["validation"]["max_abs_error"] < 1e-5
    (bad / "w.onnx").unlink()


def test_unsupported_op_names_op_and_node(bad):
    before = no_result_files(bad)
    with pytest.raises(PassError) as err:
        convert(f"{bad}/bad_models.py:make_weird", "convert.torch", bad / "x.onnx")
    msg = str(err.value)
    assert "optkit_test" in msg and "weird" in msg and "node" in msg and "\n" not in msg
    assert err.value.exit_code == 3
    assert_nothing_written(bad, before)


def test_validation_failure_writes_nothing(out):
    before = no_result_files(out)
    with pytest.raises(ValidationError) as err:
        convert(f"{ZOO}:make_mobilenetv2", "convert.torch", out / "strict.onnx", {"atol": 0, "rtol": 0},
                shapes={"": [1, 3, 64, 64]})
    assert "output 'output'" in str(err.value) and " at [" in str(err.value) and err.value.exit_code == 3
    assert_nothing_written(out, before)


# --------------------------------------------------------------------------------------------- the command


def test_cli_convert_report(cli, tmp_path):
    dest = tmp_path / "cnn.onnx"
    report = tmp_path / "report.json"
    r = cli("convert", f"{SAMPLES}/torch_cnn.py:make_model", "-o", dest, "--data",
            SAMPLES / "digits_eval_nchw.npz", "--dynamic", "batch", "--runs", "5", "--report", report, "--json")
    assert r.rc == 0, r.err
    rep = json.loads(r.out)
    source, stage = rep["stages"]
    assert source["measurements"]["latency"]["p50_ms"] > 0          # the source model's own latency in torch
    assert stage["pass"] == "convert.torch" and stage["measurements"]["size"]["bytes"] == dest.stat().st_size
    assert stage["measurements"]["latency"]["p50_ms"] > 0
    val = stage["measurements"]["validation"]
    assert val["outputs"]["output"]["max_abs_error"] < 1e-4 and val["top1_agreement"] == 1.0
    assert json.loads(report.read_text())["stages"][1]["measurements"]["validation"] == val


def test_cli_missing_output_folder(cli, tmp_path):
    r = cli("convert", f"{SAMPLES}/torch_cnn.py:make_model", "-o", tmp_path / "nope" / "x.onnx")
    assert r.rc == 2
    assert "does not exist" in one_error_line(r)
    assert no_result_files(tmp_path) == []


def test_cli_factory_raises(cli, bad, tmp_path):
    r = cli("convert", f"{bad}/bad_models.py:raises", "-o", tmp_path / "x.onnx")
    assert r.rc == 2 and "no GPU here" in one_error_line(r)
    assert no_result_files(tmp_path) == []


def test_help_imports_no_framework():
    import subprocess
    import sys

    code = ("import sys; from optkit.cli.main import app; from typer.testing import CliRunner; "
            "CliRunner().invoke(app, ['convert', '--help']); "
            "print([m for m in ('torch', 'tensorflow', 'tf2onnx') if m in sys.modules])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.strip().endswith("[]"), res.stdout + res.stderr
