"""convert: a plain PyTorch factory's inputs go by forward()'s argument names on both sides (the source check
and the ONNX check), and the exported batch axis is dynamic unless --static-batch (real torch, onnxruntime)."""
from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from optkit.core.artifact import Artifact
from optkit.core.registry import build_config
from optkit.passes import get_pass
from optkit.pipeline.stage import run_pass

from conftest import SAMPLES, one_error_line

pytestmark = pytest.mark.filterwarnings("ignore")

FACTORY = '''
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.head = torch.nn.Linear(4, 6)

    def forward(self, inputs):
        return self.head(self.conv(inputs).relu().mean((2, 3)))


class FixedBatch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(3 * 16 * 16, 6)

    def forward(self, inputs):
        return self.head(inputs.reshape(1, -1))   # the first axis cannot vary


class TwoInputs(torch.nn.Module):
    def forward(self, features, scale):
        return features * scale


def make_model():
    torch.manual_seed(0)
    return Net().eval()


def make_fixed():
    torch.manual_seed(0)
    return FixedBatch().eval()


def make_two():
    return TwoInputs()
'''


@pytest.fixture(scope="module")
def factory(tmp_path_factory):
    folder = tmp_path_factory.mktemp("factory")
    (folder / "user_model.py").write_text(textwrap.dedent(FACTORY))
    return folder / "user_model.py"


def _ort(path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _torch_ref(factory, fn, x):
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("user_model_ref", factory)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with torch.inference_mode():
        return getattr(mod, fn)()(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("shape", ["inputs=1x3x16x16", "1x3x16x16"])
def test_shape_by_forward_argument_name(cli, factory, tmp_path, shape):
    dest = tmp_path / "m.onnx"
    r = cli("convert", f"{factory}:make_model", "-o", dest, "--shape", shape, "--runs", "3", "--json")
    assert r.rc == 0, r.err
    stage = json.loads(r.out)["stages"][1]
    assert stage["measurements"]["validation"]["outputs"]["output"]["max_abs_error"] < 1e-4
    sess = _ort(dest)
    assert [i.name for i in sess.get_inputs()] == ["inputs"]
    assert sess.get_inputs()[0].shape[0] == "batch"   # dynamic by default
    for batch in (1, 4):   # the exported model runs at batch 1 and 4, and matches torch
        x = np.random.default_rng(batch).random((batch, 3, 16, 16), dtype=np.float32)
        y = sess.run(None, {"inputs": x})[0]
        assert y.shape == (batch, 6)
        assert np.abs(y - _torch_ref(factory, "make_model", x)).max() < 1e-4


def test_the_old_default_name_is_refused_in_one_line(cli, factory, tmp_path):
    r = cli("convert", f"{factory}:make_model", "-o", tmp_path / "m.onnx", "--shape", "input=1x3x16x16")
    assert r.rc == 2
    assert "--shape names input 'input', but the model's inputs are inputs" in one_error_line(r)
    assert not (tmp_path / "m.onnx").exists()


def test_dynamic_and_value_name_forward_arguments(cli, factory, tmp_path):
    r = cli("convert", f"{factory}:make_model", "-o", tmp_path / "m.onnx", "--shape", "inputs=1x3x16x16",
            "--dynamic", "input:2")
    assert r.rc == 2 and "dynamic (--dynamic) names input 'input', but the model's inputs are inputs" in one_error_line(r)
    dest = tmp_path / "two.onnx"
    r = cli("convert", f"{factory}:make_two", "-o", dest, "--shape", "features=1x5", "--shape", "scale=1x1",
            "--value", "input=2")
    assert r.rc == 2 and "inputs are features, scale" in one_error_line(r)
    r = cli("convert", f"{factory}:make_two", "-o", dest, "--shape", "features=1x5", "--shape", "scale=1x1",
            "--dynamic", "features:1=width", "--runs", "3")
    assert r.rc == 0, r.err
    sess = _ort(dest)
    assert [i.name for i in sess.get_inputs()] == ["features", "scale"]
    assert sess.get_inputs()[0].shape == ["batch", "width"]
    y = sess.run(None, {"features": np.ones((3, 7), np.float32), "scale": np.full((3, 1), 2, np.float32)})[0]
    assert y.shape == (3, 7) and np.all(y == 2)


def test_bench_names_factory_inputs_like_convert(cli, factory):
    r = cli("bench", f"{factory}:make_model", "--shape", "inputs=2x3x16x16", "--runs", "3", "--json")
    assert r.rc == 0, r.err
    r = cli("bench", f"{factory}:make_model", "--shape", "input=2x3x16x16", "--runs", "3")
    assert r.rc == 2 and "model's inputs are inputs" in one_error_line(r)


def test_static_batch_fixes_the_batch(cli, factory, tmp_path):
    dest = tmp_path / "static.onnx"
    r = cli("convert", f"{factory}:make_model", "-o", dest, "--shape", "inputs=1x3x16x16", "--static-batch",
            "--runs", "3")
    assert r.rc == 0, r.err
    sess = _ort(dest)
    assert sess.get_inputs()[0].shape == [1, 3, 16, 16]
    with pytest.raises(Exception, match="dimensions"):
        sess.run(None, {"inputs": np.zeros((4, 3, 16, 16), np.float32)})
    r = cli("convert", f"{factory}:make_model", "-o", tmp_path / "x.onnx", "--shape", "inputs=1x3x16x16",
            "--static-batch", "--dynamic", "batch")
    assert r.rc == 2 and "--static-batch" in one_error_line(r)


def test_a_model_that_fixes_its_first_axis_keeps_it_with_a_note(factory, tmp_path):
    dest = tmp_path / "fixed.onnx"
    result = run_pass(Artifact.load(f"{factory}:make_fixed"), "convert.torch", {}, dest,
                      shapes={"": [1, 3, 16, 16]})
    assert any("the batch axis stays fixed" in n for n in result.ctx.notes), result.ctx.notes
    sess = _ort(dest)
    assert sess.get_inputs()[0].shape == [1, 3, 16, 16]
    x = np.random.default_rng(0).random((1, 3, 16, 16), dtype=np.float32)
    assert np.abs(sess.run(None, {"inputs": x})[0] - _torch_ref(factory, "make_fixed", x)).max() < 1e-4


def test_sample_torch_model_dynamic_by_default_and_fidelity_holds(tmp_path):
    from optkit.measure.datasets import load_dataset

    data = load_dataset(SAMPLES / "digits_eval_nchw.npz")
    dest = tmp_path / "cnn.onnx"
    result = run_pass(Artifact.load(f"{SAMPLES}/torch_cnn.py:make_model", weights=str(SAMPLES / "torch_cnn_state.pt")),
                      "convert.torch", {}, dest, data={"eval": data})
    val = result.ctx.measurements["validation"]
    assert val["top1_agreement"] == 1.0 and val["onnx_top1"] == val["source_top1"] > 0.9
    sess = _ort(dest)
    for batch in (1, 4):
        assert sess.run(None, {"input": data.arrays["input"][:batch]})[0].shape == (batch, 10)


def test_tf_dynamic_batch_is_deprecated_for_static_batch():
    cls = get_pass("convert.tf").Config
    assert build_config(get_pass("convert.tf"), {}).static_batch is False
    assert build_config(get_pass("convert.tf"), {"dynamic_batch": False}).static_batch is True
    assert build_config(get_pass("convert.tf"), {"dynamic_batch": True}).static_batch is False
    with pytest.raises(Exception, match="contradicts static_batch"):
        cls(dynamic_batch=True, static_batch=True)
    assert "dynamic_batch" not in cls.model_fields


@pytest.mark.parametrize("static", [False, True])
def test_keras_sample_batch(tmp_path, static):
    dest = tmp_path / "k.onnx"
    result = run_pass(Artifact.load(str(SAMPLES / "keras_cnn.h5")), "convert.tf", {"static_batch": static}, dest)
    assert result.ctx.measurements["validation"]["max_abs_error"] < 1e-4
    sess = _ort(dest)
    first = sess.get_inputs()[0].shape[0]
    assert (first == 1) if static else not isinstance(first, int)
    for batch in (1,) if static else (1, 4):
        assert sess.run(None, {"input": np.zeros((batch, 8, 8, 1), np.float32)})[0].shape == (batch, 10)
