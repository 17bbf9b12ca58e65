"""A Triton package checked against Triton itself: config.pbtxt parsed by tritonclient's model_config_pb2, and the
repository loaded and served by a real tritonserver on 127.0.0.1 (see tests/_triton.py for which backend runs it)."""
from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from _triton import check_config, infer, log_tail, needs_tool, proof_repository, tritonserver
from test_package import CNN, FIELDS, best_json, config_of

from optkit.package.build import package
from optkit.package.signature import read_signature

pytestmark = needs_tool()


@pytest.fixture(scope="module")
def packaged(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("triton")
    repo = tmp / "repo"
    package(CNN, target="triton", output=str(repo), name="cnn", tag="v1.0")
    package(CNN, target="triton", output=str(repo), name="cnn", tag="v1.1",
            tuned_path=best_json(tmp / "best.json", CNN))
    return repo


def test_config_parses_as_tritons_model_config_and_matches_the_graph(packaged):
    sig = read_signature(CNN)
    for config in (packaged / "cnn" / "config.pbtxt", packaged / "cnn" / "1" / "config.pbtxt"):
        parsed = check_config(config)
        batching = parsed["max_batch_size"] > 0
        for role, tensors in (("input", sig.inputs), ("output", sig.outputs)):
            got = [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in parsed[role]]
            assert got == [(t.name, t.triton_type, sig.served_dims(t, batching)) for t in tensors]
    parsed = check_config(packaged / "cnn" / "config.pbtxt")
    assert parsed["parameters"]["intra_op_thread_count"] == {"string_value": "1"}
    assert parsed["optimization"]["graph"]["level"] == 1
    assert parsed["version_policy"] == {"specific": {"versions": ["2"]}}


def test_every_mapped_field_parses_as_tritons_model_config(tmp_path):
    files = []
    for i, (setting, _) in enumerate(FIELDS):
        files.append(tmp_path / f"{i}.pbtxt")
        files[-1].write_text(config_of(**setting))
    parsed = check_config(*files)
    assert parsed[4]["optimization"]["execution_accelerators"]["gpu_execution_accelerator"] == [{"name": "tensorrt"}]
    assert parsed[13]["optimization"]["graph"]["level"] == 2
    assert parsed[2]["instance_group"] == [{"count": 3, "kind": "KIND_CPU"}]


def test_schema_rejects_what_triton_would(tmp_path, packaged):
    text = (packaged / "cnn" / "config.pbtxt").read_text()
    for bad in (text.replace("KIND_CPU", "KIND_XPU"), text.replace("max_batch_size", "max_batch"),
                text.replace("count: 2", 'count: "two"')):
        (tmp_path / "c.pbtxt").write_text(bad)
        with pytest.raises(ValueError, match="ParseError"):
            check_config(tmp_path / "c.pbtxt")


def test_tritonserver_loads_the_package_and_answers_like_onnxruntime(tmp_path, packaged):
    proof = proof_repository(packaged, tmp_path / "proof")
    x = np.load("sample_models/digits_eval_nchw.npz")["input"][:4].astype(np.float32)
    want = ort.InferenceSession(CNN).run(None, {"input": x})[0]
    with tritonserver(proof, tmp_path / "work") as (url, proc):
        assert url, log_tail(tmp_path / "work")
        out = infer(url, "cnn", {"input": x})
        dtype, shape, data = out["logits"]
        assert (dtype, shape) == ("FP32", [4, 10])
        np.testing.assert_allclose(np.array(data, np.float32).reshape(shape), want, rtol=1e-5, atol=1e-5)
        import urllib.request

        with urllib.request.urlopen(f"{url}/v2/models/cnn/config", timeout=10) as r:
            served = json.loads(r.read())
        assert served["max_batch_size"] == 8 and served["dynamic_batching"]["preferred_batch_size"] == [8]
        assert served["instance_group"][0]["count"] == 2
        with urllib.request.urlopen(f"{url}/v2/models/cnn/versions/2/ready", timeout=10) as r:
            assert r.status == 200
        with pytest.raises(urllib.error.HTTPError):  # version 1 is kept on disk, not served
            infer(url, "cnn", {"input": x}, version="1")


@pytest.mark.parametrize("edit,why", [
    (lambda t: t.replace("preferred_batch_size: [ 8 ]", "preferred_batch_size: [ 64 ]"), "preferred size must be <= max batch size"),
    (lambda t: t.replace("KIND_CPU", "KIND_GPU"), "has kind KIND_GPU but no GPUs are available"),
], ids=["preferred-above-max", "gpu-without-gpu"])
def test_tritonserver_refuses_an_invalid_config(tmp_path, packaged, edit, why):
    proof = proof_repository(packaged, tmp_path / "proof")
    config = proof / "cnn" / "config.pbtxt"
    config.write_text(edit(config.read_text()))
    with tritonserver(proof, tmp_path / "work") as (url, proc):
        assert url is None and proc.returncode != 0
    assert why.lower() in log_tail(tmp_path / "work", 20000).lower()


def test_tritonserver_serves_a_voice_model_with_a_scalar_input(tmp_path, realcases):
    """silero_vad (a scalar sample rate, a state tensor whose batch axis is not the first) as packaged, loaded and
    answered by the real server like onnxruntime on the source file."""
    src = realcases / "silero_vad.onnx"
    package(str(src), target="triton", output=str(tmp_path / "repo"), name="vad",
            shapes={"input": [1, 512], "state": [2, 1, 128]})
    assert check_config(tmp_path / "repo" / "vad" / "config.pbtxt")["input"][2]["dims"] == ["1"]
    proof = proof_repository(tmp_path / "repo", tmp_path / "proof")
    rng = np.random.default_rng(1)
    x = {"input": rng.standard_normal((1, 512)).astype(np.float32) * 0.1,
         "state": rng.standard_normal((2, 1, 128)).astype(np.float32) * 0.1}
    want = ort.InferenceSession(str(src)).run(None, {**x, "sr": np.array(16000, np.int64)})
    with tritonserver(proof, tmp_path / "work") as (url, proc):
        assert url, log_tail(tmp_path / "work")
        out = infer(url, "vad", {**x, "sr": np.array([16000], np.int64)})
    for name, w in zip(("output", "stateN"), want):
        dtype, shape, data = out[name]
        assert shape == list(w.shape)
        np.testing.assert_allclose(np.array(data, np.float32).reshape(shape), w, rtol=1e-5, atol=1e-6)
