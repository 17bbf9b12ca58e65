"""optkit bench --url: a served model timed through the KServe v2 HTTP protocol, against a real v2 server.

The server is a real tritonserver (Triton Inference Server, its Python backend running the sample CNN, packaged by
optkit, with onnxruntime) on 127.0.0.1, started once for the module from the Triton tool folder tools/triton/.venv
(tools/triton/requirements.txt, made by .ci/run; found, and skipped without, as the package's Triton tests do:
tests/_triton.py) and always stopped. Tests that need no server (unreachable, not v2, refused
flags) run everywhere.
"""
from __future__ import annotations

import http.client
import http.server
import json
import math
import secrets
import socket
import sys
import threading
import time
from urllib.parse import urlsplit

import _triton
import numpy as np
import pytest
from test_package import best_json

from optkit.package.build import package

from conftest import SAMPLES, one_error_line, run_cli

START_TIMEOUT_S = 60
MODEL = SAMPLES / "torch_cnn.onnx"
QUICK = ("--warmup", "3", "--runs", "30")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(base URL, access token) of a tritonserver serving `cnn` and `spare` (the sample CNN as `optkit package
    --tuned` writes it, batches up to 8, run by the Python backend: tests/_triton.py) and `broken` (every request
    fails, as a model that raises does; no warm-up, which would fail its loading); the repository API (load,
    unload) asks for the token. Stopped after the module."""
    _triton.skip_unless_tool()
    tmp = tmp_path_factory.mktemp("v2_server")
    best = best_json(tmp / "best.json", MODEL, batch=8)
    for name in ("cnn", "spare", "broken"):
        package(str(MODEL), target="triton", output=str(tmp / "package"), name=name, tuned_path=best)
    repo = _triton.proof_repository(tmp / "package", tmp / "repo")
    config = repo / "broken" / "config.pbtxt"
    config.write_text("".join(line for line in config.read_text().splitlines(keepends=True)
                              if not line.startswith("model_warmup")))
    for version in config.parent.iterdir():
        if version.is_dir():
            (version / "model.py").write_text(BROKEN_PY)
    token = secrets.token_urlsafe(16)
    with _triton.tritonserver(repo, tmp, start_timeout=START_TIMEOUT_S, control="explicit",
                              options=(f"--http-restricted-api=model-repository:triton-access-token={token}",)) \
            as (url, _):
        assert url, f"tritonserver refused the repository: {_triton.log_tail(tmp)}"
        yield url, token


BROKEN_PY = """\
class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("this model always fails (a test of error responses)")
"""


def _json(result) -> dict:
    assert result.rc == 0, result.err
    return json.loads(result.out)["stages"][0]["measurements"]


def test_served_figures_are_the_in_process_figures(server):
    """The same kinds of figures, bands and JSON shape as `bench MODEL --concurrency`, for the served model."""
    url, _ = server
    served = _json(run_cli("bench", "--url", f"{url}/v2/models/cnn", "--concurrency", "2", *QUICK, "--json"))
    local = _json(run_cli("bench", MODEL, "--concurrency", "2", *QUICK, "--json"))
    lat, load = served["latency"], served["concurrency"]
    assert set(lat) == set(local["latency"]) and set(lat["ci95"]) == set(local["latency"]["ci95"])
    assert set(load) == set(local["concurrency"]) | {"connections"}
    assert set(load["ci95"]) == set(local["concurrency"]["ci95"]) == {"p50_ms", "p90_ms", "p99_ms", "throughput_per_s"}
    for figures in (lat, load):
        for key in ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "throughput_per_s"):
            assert math.isfinite(figures[key]) and figures[key] > 0, (key, figures)
        for key in ("p50_ms", "throughput_per_s"):
            low, high = figures["ci95"][key]   # None: unbounded (the noise's half-width is more than the mean)
            assert (low is None or low <= figures[key]) and (high is None or figures[key] <= high), (key, figures)
            assert low is not None or high is not None, (key, figures)
        assert figures["p50_ms"] <= figures["p90_ms"] <= figures["p99_ms"]
    assert lat["runs"] == 30 and load["calls"] == 60 and load["connections"] == 2 and lat["provider"] == "http"
    # HTTP and the server add time: the served p50 is above the in-process one, and under a second here
    assert local["latency"]["p50_ms"] < lat["p50_ms"] < 1000
    assert served["io"]["inputs"] == [{"name": "input", "shape": [None, 1, 8, 8], "dtype": "float32"}]
    assert served["inputs"]["shapes"] == local["inputs"]["shapes"] == {"input": [1, 1, 8, 8]}
    assert served["served"]["server"] == "triton" and "binary tensors" in served["served"]["protocol"]


def test_served_data_and_table(server):
    """--data and --batch as for a model file; the table says what was served and how."""
    url, _ = server
    m = _json(run_cli("bench", "--url", f"{url}/v2/models/cnn", "--data", SAMPLES / "digits_eval_nchw.npz",
                      "--batch", "4", *QUICK, "--json"))
    assert m["inputs"]["shapes"] == {"input": [4, 1, 8, 8]} and m["inputs"]["samples"] == 497
    assert m["latency"]["batch"] == 4
    r = run_cli("bench", "--url", f"{url}/v2/models/cnn", "--concurrency", "2", *QUICK)
    assert r.rc == 0, r.err
    assert "kserve-v2" in r.out and "2 requests in flight over 2 connections" in " ".join(r.out.split())


def test_served_outputs_are_the_models(server):
    """What comes back (JSON tensors and binary tensors alike) is what onnxruntime computes on the file."""
    import onnxruntime as ort

    from optkit.runtimes.kserve import RemoteSession

    url, _ = server
    x = np.load(SAMPLES / "digits_eval_nchw.npz")["input"][:3].astype(np.float32)
    want = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    for binary in (False, True):
        session = RemoteSession.open_url(f"{url}/v2/models/cnn", binary=binary)
        try:
            (got,) = session.run({"input": x})
        finally:
            session.close()
        assert got.shape == want.shape and np.allclose(got, want, atol=1e-5), binary


def test_server_errors_are_one_line(server):
    """A model whose every request fails, a model unloaded (not ready), a model not served: exit 2, one line."""
    url, token = server
    r = run_cli("bench", "--url", f"{url}/v2/models/broken", *QUICK)
    assert r.rc == 2 and "answered" in one_error_line(r) and "always fails" in r.err, r.err
    conn = http.client.HTTPConnection(urlsplit(url).hostname, urlsplit(url).port, timeout=30)
    conn.request("POST", "/v2/repository/models/spare/unload", body=b"{}", headers={"triton-access-token": token})
    assert conn.getresponse().status == 200
    conn.close()
    for name in ("spare", "absent"):
        r = run_cli("bench", "--url", f"{url}/v2/models/{name}", *QUICK)
        assert r.rc == 2 and f"model '{name}'" in one_error_line(r) and "not ready" in r.err, r.err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_unreachable_and_not_v2_are_one_line_and_quick():
    """No server at all, a plain web server (404 HTML), a bad URL: exit 2 with one line, within seconds."""
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        cases = {f"http://127.0.0.1:{_free_port()}/v2/models/m": "cannot reach",
                 f"http://127.0.0.1:{web.server_address[1]}/v2/models/m": "not a KServe v2 server",
                 f"http://127.0.0.1:{web.server_address[1]}/models/m": "/v2/models/NAME",
                 "ftp://127.0.0.1/v2/models/m": "http://HOST:PORT/v2/models/NAME"}
        for url, says in cases.items():
            t0 = time.monotonic()
            r = run_cli("bench", "--url", url, timeout=60)
            assert r.rc == 2 and says in one_error_line(r), (url, r.err)
            assert time.monotonic() - t0 < 30
    finally:
        web.shutdown()
        web.server_close()


def test_a_server_that_never_answers_is_bounded():
    """A port that accepts connections and never answers: the checks give up after their timeout (10 s from the
    CLI; 0.5 s here), one line."""
    from optkit.core.errors import UsageError
    from optkit.runtimes.kserve import RemoteSession

    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(4)
        t0 = time.monotonic()
        with pytest.raises(UsageError, match="did not answer GET /v2/health/ready within 0.5 s"):
            RemoteSession.open_url(f"http://127.0.0.1:{mute.getsockname()[1]}/v2/models/m", check_timeout=0.5)
        assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("args, says", [
    (("--threads", "2"), "--threads does not apply to --url"),
    (("--provider", "cpu", "--sessions", "per-thread"), "--provider, --sessions do not apply to --url"),
    ((str(MODEL),), "give a MODEL or --url, not both"),
])
def test_flags_for_local_models_are_refused(args, says):
    r = run_cli("bench", "--url", "http://127.0.0.1:9/v2/models/m", *args)
    assert r.rc == 2 and says in one_error_line(r), r.err


def test_no_model_and_no_url():
    r = run_cli("bench")
    assert r.rc == 2 and "--url" in one_error_line(r), r.err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_urls_name_the_model_the_v2_way():
    from optkit.core.errors import UsageError
    from optkit.runtimes.kserve import ServedModel

    m = ServedModel("http://10.0.0.2:8000/v2/models/resnet")
    assert (m.host, m.port, m.name, m.version, m.model_path) == ("10.0.0.2", 8000, "resnet", None, "/v2/models/resnet")
    m = ServedModel("https://infer.example/kserve/ns/v2/models/bert/versions/3/")
    assert (m.port, m.prefix, m.name, m.version) == (443, "/kserve/ns", "bert", "3")
    assert m.server == "https://infer.example:443/kserve/ns"
    for bad in ("127.0.0.1:8000/v2/models/m", "http://h:8000/v1/models/m:predict", "http://h:99999/v2/models/m",
                "http:///v2/models/m", "http://h/v2/models/"):
        with pytest.raises(UsageError, match="--url"):
            ServedModel(bad)


def test_answers_are_checked():
    """A v2 answer is read as the server means it (nested JSON data, binary chunks after the header) and refused
    when it is not v2 (exit 2) or not what the model's metadata declares: an output missing, short or another
    (exit 3). tests/test_hostile_bench_url.py has the rest, against a fake server."""
    from optkit.core.errors import PassError, UsageError
    from optkit.runtimes.kserve import ModelMetadata, RemoteSession

    class Answer:
        def __init__(self, header=None):
            self.header = header

        def getheader(self, name, default=None):
            return self.header if name == "Inference-Header-Content-Length" else default

    s = RemoteSession("http://127.0.0.1:9/v2/models/m")
    s.meta = ModelMetadata.model_validate({"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
                                           "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]})
    (y,) = s._decode(Answer(), json.dumps({"model_name": "m", "outputs": [
        {"name": "y", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2], [3, 4]]}]}).encode())
    assert y.dtype == np.float32 and y.tolist() == [[1, 2], [3, 4]]
    raw = np.arange(4, dtype="<f4").tobytes()
    head = json.dumps({"model_name": "m", "outputs": [{"name": "y", "datatype": "FP32", "shape": [2, 2],
                                                       "parameters": {"binary_data_size": len(raw)}}]}).encode()
    (y,) = s._decode(Answer(str(len(head))), head + raw)
    assert y.tolist() == [[0, 1], [2, 3]]
    for body, error, says in (
            (head + raw[:-4], PassError, "cut short"),
            (b'{"model_name": "m", "outputs": [{"name": "y", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3]}]}',
             PassError, "3 values for its shape"),
            (b'{"model_name": "m", "outputs": [{"name": "z", "datatype": "FP32", "shape": [1], "data": [1]}]}',
             PassError, "output 'z' is not an output the model declares"),
            (b'{"error": "boom"}', UsageError, "not a v2 inference response"),
            (b'<html>', UsageError, "not a v2 inference response")):
        with pytest.raises(error, match=says):
            s._decode(Answer(str(len(head)) if body.startswith(head) else None), body)
