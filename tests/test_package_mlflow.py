"""An MLflow package: the onnx flavor carries the tuned onnxruntime options and the lineage, predicts through
mlflow.pyfunc like onnxruntime, and serves with `mlflow models serve` on 127.0.0.1."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from _triton import stop_group
from test_package import CNN, _external_data_model, best_json

from optkit.package.build import package

try:
    import mlflow.pyfunc  # noqa: F401

    MISSING = None
except ImportError:
    MISSING = "mlflow-skinny is not installed: pip install 'optkit[serve]'"

pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"SKIPPED LOUDLY: {MISSING}")
X = np.load("sample_models/digits_eval_nchw.npz")["input"][:5].astype(np.float32)


@pytest.fixture(scope="module")
def packaged(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mlflow")
    best = best_json(tmp / "best.json", CNN, session={"graph_optimization": "basic"})
    res = package(CNN, target="mlflow", output=str(tmp / "repo"), name="cnn", tag="v1.0", tuned_path=best)
    return Path(res.path), res


def test_mlmodel_carries_the_tuned_options_signature_and_lineage(packaged):
    import yaml

    path, res = packaged
    mlmodel = yaml.safe_load((path / "MLmodel").read_text())
    flavor = mlmodel["flavors"]["onnx"]
    assert flavor["providers"] == ["CPUExecutionProvider"]
    assert flavor["onnx_session_options"] == {"intra_op_num_threads": 1, "inter_op_num_threads": 2,
                                              "execution_mode": "parallel", "graph_optimization_level": 1}
    sig = json.loads(mlmodel["signature"]["inputs"])
    assert sig == [{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [-1, 1, 8, 8]}, "name": "input"}]
    lin = mlmodel["metadata"]["optkit"]
    assert lin["tuned"]["label"] == "test setting" and lin["tag"] == "v1.0" and lin["source"]["path"] == CNN
    assert any("mem_pattern off cannot be expressed" in n for n in res.notes)
    assert any("batch 8, 2 in flight" in n for n in res.notes)
    assert json.loads((path / "optkit-package.json").read_text())["files"]["MLmodel"]


def test_pyfunc_predicts_like_onnxruntime(packaged):
    import mlflow.pyfunc

    model = mlflow.pyfunc.load_model(str(packaged[0]))
    got = model.predict({"input": X})["logits"]
    want = ort.InferenceSession(CNN).run(None, {"input": X})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_external_data_model_as_mlflow(tmp_path):
    import mlflow.pyfunc

    model = _external_data_model(tmp_path)
    res = package(str(model), target="mlflow", output=str(tmp_path / "repo"))
    files = sorted(p.name for p in Path(res.path).iterdir())
    assert "model.onnx" in files and any(f.endswith(".data") for f in files), files  # MLflow names its weights file
    got = mlflow.pyfunc.load_model(res.path).predict({"input": X})["logits"]
    np.testing.assert_allclose(got, ort.InferenceSession(CNN).run(None, {"input": X})[0], rtol=1e-5, atol=1e-5)


def test_mlflow_models_serve_answers(packaged, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    cmd = [str(mlflow_cli)] if mlflow_cli.exists() else [sys.executable, "-m", "mlflow"]
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([*cmd, "models", "serve", "-m", str(packaged[0]), "--env-manager", "local",
                             "-h", "127.0.0.1", "-p", str(port), "-w", "1"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "MLFLOW_TRACKING_URI": f"file://{tmp_path}/mlruns",
                                 "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"})
    try:
        deadline, answer = time.monotonic() + 60, None
        body = json.dumps({"inputs": {"input": X.tolist()}}).encode()
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=10) as r:
                    answer = json.loads(r.read())
                break
            except (urllib.error.URLError, OSError):
                time.sleep(0.3)
        assert answer is not None, (tmp_path / "serve.log").read_text()[-3000:]
        got = np.array(answer["predictions"]["logits"], np.float32)
        np.testing.assert_allclose(got, ort.InferenceSession(CNN).run(None, {"input": X})[0], rtol=1e-5, atol=1e-5)
    finally:
        stop_group(proc)
        log.close()


def test_registry_alias_follows_packaging_and_serve_version(tmp_path, cli):
    from mlflow import MlflowClient

    db = f"sqlite:///{tmp_path}/registry.db"
    repo = tmp_path / "repo"
    first = package(CNN, target="mlflow", output=str(repo), name="cnn", tag="v1.0", registry=db)
    second = package(CNN, target="mlflow", output=str(repo), name="cnn", tag="v1.1", registry=db)
    client = MlflowClient(tracking_uri=db, registry_uri=db)
    assert client.get_model_version_by_alias("cnn", "served").source == str(Path(second.path).resolve())
    assert any("alias served (models:/cnn@served)" in n for n in first.notes)
    r = cli("package", "serve-version", repo / "cnn", "--tag", "v1.0", "--registry", db)
    assert r.rc == 0, r.err
    assert "serving version 1 (v1.0), was 2" in r.out and "alias served -> version 1 (was 2)" in r.out
    assert client.get_model_version_by_alias("cnn", "served").source == str(Path(first.path).resolve())
    assert len(client.search_model_versions("name='cnn'")) == 2  # nothing removed
