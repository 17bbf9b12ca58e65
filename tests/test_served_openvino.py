"""The OpenVINO package served (issue 42 item 4): `package --to triton --backend openvino --tuned` loaded by a real
tritonserver on 127.0.0.1 (the Python backend standing in for Triton's OpenVINO backend, running OpenVINO on the
packaged IR with the config's parameters: tests/_triton.py), answering as OpenVINO's own run of that IR, and timed
by `optkit bench --url` with the tuned concurrency and batch. One server for the module, always stopped.

How close the served figures come to the prediction the package records (tune's figures in its lineage) is a
figure, not a test: benchmarks/served_openvino.py prints it."""
from __future__ import annotations

import json
import math
import urllib.request

import _triton
import numpy as np
import pytest
from test_openvino import needs_ov
from test_package import best_json
from test_package_openvino import _ir_copy

from optkit.package.build import package

from conftest import SAMPLES, run_cli

pytestmark = [needs_ov, pytest.mark.skipif(_triton.missing_openvino() is not None,
                                           reason=f"SKIPPED LOUDLY: {_triton.missing_openvino()}")]
MODEL = SAMPLES / "torch_cnn.onnx"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base URL, the packaged version folder, its lineage): the sample CNN packaged for Triton's OpenVINO backend
    from a tune that picked OpenVINO (2 threads, batches up to 8, 2 in flight), and `cnn_ir`, the CNN's IR
    (`optkit convert -o cnn.xml`) packaged as it is, served by one server."""
    tmp = tmp_path_factory.mktemp("ov_served")
    tuned = best_json(tmp / "best.json", MODEL, runtime="openvino", threads=2, batch=8, concurrency=2)
    package(str(MODEL), target="triton", output=str(tmp / "package"), name="cnn", tuned_path=tuned)
    package(str(_ir_copy(tmp)), target="triton", output=str(tmp / "package"), name="cnn_ir")
    version = tmp / "package" / "cnn" / "1"
    repo = _triton.proof_repository(tmp / "package", tmp / "repo")
    with _triton.tritonserver(repo, tmp) as (url, _):
        assert url, f"tritonserver refused the repository: {_triton.log_tail(tmp)}"
        yield url, version, json.loads((version / "optkit-package.json").read_text())  # tmp/package/cnn/1


def test_served_answers_are_openvinos_own_run_of_the_ir(served):
    import openvino as ov

    url, version, _ = served
    x = np.load(SAMPLES / "digits_eval_nchw.npz")["input"][:4].astype(np.float32)
    core = ov.Core()
    own = core.compile_model(core.read_model(version / "model.xml"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    want = own(x)[0]
    dtype, shape, data = _triton.infer(url, "cnn", {"input": x})["logits"]
    assert (dtype, shape) == ("FP32", [4, 10])
    np.testing.assert_allclose(np.array(data, np.float32).reshape(shape), want, rtol=1e-5, atol=1e-5)
    # the IR packaged as it is: one sample at a time (no tune: batch 1), as OpenVINO runs the user's own file
    source = version.parents[2] / "cnn.xml"  # what the fixture converted and packaged as cnn_ir
    own = core.compile_model(core.read_model(source), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    dtype, shape, data = _triton.infer(url, "cnn_ir", {"input": x[:1]})["logits"]
    np.testing.assert_allclose(np.array(data, np.float32).reshape(shape), own(x[:1])[0], rtol=1e-5, atol=1e-5)
    with urllib.request.urlopen(f"{url}/v2/models/cnn/config", timeout=10) as r:
        config = json.loads(r.read())
    assert {k: v["string_value"] for k, v in config["parameters"].items()} == {
        "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_PRECISION_HINT": "f32",
        "INFERENCE_NUM_THREADS": "2"}
    assert config["instance_group"][0]["count"] == 2 and config["max_batch_size"] == 8


def test_bench_url_times_it_with_the_tuned_load(served):
    """bench --url with the concurrency and batch the package was tuned for: the same figures as for a model file,
    every answer checked against the model's metadata, beside the prediction the package recorded."""
    url, _, lineage = served
    setting = lineage["tuned"]["setting"]
    r = run_cli("bench", "--url", f"{url}/v2/models/cnn", "--concurrency", str(setting["concurrency"]),
                "--batch", str(setting["batch"]), "--data", SAMPLES / "digits_eval_nchw.npz", "--warmup", "3", "--runs", "20", "--json")
    assert r.rc == 0, r.err
    m = json.loads(r.out)["stages"][0]["measurements"]
    assert m["served"]["server"] == "triton" and m["inputs"]["shapes"] == {"input": [8, 1, 8, 8]}
    load = m["concurrency"]
    assert load["connections"] == 2 and math.isfinite(load["throughput_per_s"]) and load["throughput_per_s"] > 0
    assert lineage["tuned"]["figures"]["throughput_per_s"] > 0  # what benchmarks/served_openvino.py compares with
