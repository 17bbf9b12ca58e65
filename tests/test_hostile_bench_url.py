"""optkit bench --url against a hostile KServe v2 server (issue 29): every answer is input.

A small stdlib fake v2 server on 127.0.0.1 (one per test, threads, always shut down) serves model `m`: input x FP32
[-1,3], output y FP32 [-1,2], and answers what each test tells it: answers unlike the metadata (exit 3 naming the
output), malformed answers and metadata (exit 2 naming the key), slow senders (bounded by whole-request deadlines),
and a URL with a password (kept out of every output and file).
"""
from __future__ import annotations

import http
import http.server
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from conftest import no_result_files, one_error_line, run_cli

# issue 29: every command here leaves HOME and TMPDIR as it found them
pytestmark = pytest.mark.usefixtures("fresh_home_and_tmp")

QUICK = ("--warmup", "1", "--runs", "3")
METADATA = {"name": "m", "versions": ["1"], "platform": "fake",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]}


def good_answer(request: dict) -> dict:
    batch = request["inputs"][0]["shape"][0]
    return {"model_name": "m", "model_version": "1",
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [batch, 2], "data": [0.5] * (2 * batch)}]}


class FakeV2:
    """What the fake server answers: `metadata` (an object, or raw bytes), `answer(request) -> dict or bytes`,
    `extensions` of GET /v2, extra `headers` of an inference answer, and `slow` {path: seconds between bytes}."""

    def __init__(self):
        self.metadata: dict | bytes = METADATA
        self.answer: Callable[[dict], dict | bytes] = good_answer
        self.extensions: list[str] = []
        self.headers: dict[str, str] = {}
        self.slow: dict[str, float] = {}
        self.stop = threading.Event()
        self.requests: list[str] = []


def _handler(fake: FakeV2):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, status: int, body: bytes | dict, headers: dict[str, str] | None = None) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers = {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}
            raw = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n"
                   + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode() + data
            gap = fake.slow.get(self.path.split("?")[0])
            if gap is None:
                self.wfile.write(raw)
                return
            for i in range(len(raw)):   # a slow sender: one byte at a time, until the client gives up
                if fake.stop.wait(gap):
                    return
                try:
                    self.wfile.write(raw[i:i + 1])
                    self.wfile.flush()
                except OSError:
                    return

        def do_GET(self):
            fake.requests.append(f"GET {self.path}")
            if self.path in ("/v2/health/ready", "/v2/models/m/ready"):
                self._send(200, b"{}")
            elif self.path == "/v2":
                self._send(200, {"name": "fake", "version": "0", "extensions": fake.extensions})
            elif self.path == "/v2/models/m":
                self._send(200, fake.metadata)
            else:
                self._send(404, {"error": "no such thing"})

        def do_POST(self):
            fake.requests.append(f"POST {self.path}")
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            head = int(self.headers.get("Inference-Header-Content-Length", len(body)))
            answer = fake.answer(json.loads(body[:head]))
            self._send(200, answer, fake.headers)

    return Handler


@contextmanager
def fake_server() -> Iterator[tuple[str, FakeV2]]:
    fake = FakeV2()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", fake
    finally:
        fake.stop.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def v2():
    with fake_server() as served:
        yield served


def _bench(url: str, tmp_path: Path, *args: str):
    """bench --url with a --report in a new empty folder (`r.folder`); on failure that folder must stay empty."""
    out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
    out.mkdir()
    r = run_cli("bench", "--url", f"{url}/v2/models/m", *QUICK, "--report", out / "report.json", *args, timeout=120)
    if r.rc != 0:
        assert no_result_files(out) == [], r.err
    r.folder = out
    return r


def _with_output(**changes) -> Callable[[dict], dict]:
    def answer(request):
        reply = good_answer(request)
        reply["outputs"][0].update(changes)
        return reply
    return answer


def test_a_good_server_is_timed(v2, tmp_path):
    url, fake = v2
    r = _bench(url, tmp_path, "--json")
    assert r.rc == 0, r.err
    stage = json.loads(r.out)["stages"][0]
    assert stage["measurements"]["latency"]["runs"] == 3
    assert json.loads((r.folder / "report.json").read_text())["stages"][0]["output"]["format"] == "kserve-v2"


def test_nan_values_are_not_judged(v2, tmp_path):
    """A numeric answer of NaN is still a v2 answer of the declared shape: the server is timed."""
    url, fake = v2
    fake.answer = lambda request: json.dumps(good_answer(request)).replace("0.5", "NaN").encode()
    assert _bench(url, tmp_path).rc == 0


# answers unlike the model's metadata: exit 3, naming the output
@pytest.mark.parametrize("answer, says", [
    (_with_output(shape=[1], data=[0.5]), "output 'y' came back with shape [1]"),
    (_with_output(shape=[0], data=[]), "output 'y' came back with shape [0]"),
    (_with_output(shape=[0, 2], data=[]), "output 'y' came back with batch 0 (shape [0,2]) for a request of batch 1"),
    (_with_output(shape=[1, 3], data=[0.5] * 3), "output 'y' came back with shape [1,3]"),
    (_with_output(datatype="BOOL", data=[True, False]), "output 'y' came back BOOL; the model declares FP32"),
    (_with_output(data=[0.5]), "output 'y' has 1 values for its shape [1,2]"),
    (_with_output(data=[0.5] * 20), "output 'y' has 20 values for its shape [1,2]"),
    (_with_output(shape=[10 ** 12, 10 ** 12], data=[]), "output 'y' has 0 values for its shape [1000000000000,"),
    (lambda request: {**good_answer(request), "outputs": good_answer(request)["outputs"] + [
        {"name": "z", "datatype": "FP32", "shape": [1], "data": [1.0]}]}, "output 'z' is not an output the model"),
    (lambda request: {**good_answer(request), "outputs": good_answer(request)["outputs"] * 2},
     "output 'y' came back twice"),
    (lambda request: {"model_name": "m", "outputs": []}, "the answer holds no output"),
])
def test_answers_unlike_the_metadata_are_exit_3(v2, tmp_path, answer, says):
    url, fake = v2
    fake.answer = answer
    r = _bench(url, tmp_path)
    line = one_error_line(r)
    assert r.rc == 3 and says in line and "does not answer as its metadata declares" in line, r.err
    assert "internal error" not in r.err


def test_a_missing_output_is_named(v2, tmp_path):
    url, fake = v2
    fake.metadata = {**METADATA, "outputs": METADATA["outputs"] + [{"name": "w", "datatype": "INT64",
                                                                    "shape": [-1]}]}
    r = _bench(url, tmp_path)
    assert r.rc == 3 and "output 'w' is missing" in one_error_line(r), r.err


def test_batch_is_the_requests(v2, tmp_path):
    """With --shape 4x3 (batch 4) an answer of batch 1 is refused; of batch 4, timed."""
    url, fake = v2
    assert _bench(url, tmp_path, "--shape", "4x3").rc == 0
    fake.answer = lambda request: good_answer({"inputs": [{"shape": [1, 3]}]})
    r = _bench(url, tmp_path, "--shape", "4x3")
    assert r.rc == 3 and "batch 1 (shape [1,2]) for a request of batch 4" in one_error_line(r), r.err


def _binary_answer(extra: bytes = b"", size_delta: int = 0, header: str | None = None):
    def answer(request):
        raw = np.full((request["inputs"][0]["shape"][0], 2), 0.5, dtype="<f4").tobytes()
        head = json.dumps({"model_name": "m", "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 2],
                                                            "parameters": {"binary_data_size": len(raw) + size_delta}}]
                           }).encode()
        answer.head = header if header is not None else str(len(head))
        return head + raw + extra
    return answer


@pytest.mark.parametrize("answer, rc, says", [
    (_binary_answer(), 0, None),
    (_binary_answer(size_delta=-4), 3, "output 'y' is 4 bytes of binary data for FP32 [1,2]"),
    (_binary_answer(size_delta=4), 3, "output 'y' is 12 bytes of binary data for FP32 [1,2]"),
    (_binary_answer(extra=b"\0" * 8), 3, "8 bytes follow the outputs' binary data"),
    (_binary_answer(header="-3"), 2, "Inference-Header-Content-Length '-3' is not a number"),
    (_binary_answer(header="99999"), 2, "Inference-Header-Content-Length '99999' is not a number"),
])
def test_binary_answers_add_up(v2, tmp_path, answer, rc, says):
    url, fake = v2
    fake.extensions = ["binary_tensor_data"]

    def send(request):
        body = answer(request)
        fake.headers = {"Inference-Header-Content-Length": answer.head, "Content-Type": "application/octet-stream"}
        return body
    fake.answer = send
    r = _bench(url, tmp_path)
    assert r.rc == rc, r.err
    if says:
        assert says in one_error_line(r), r.err


# malformed answers: not v2 at all, exit 2 naming the key
@pytest.mark.parametrize("answer, says", [
    (_with_output(data=["abc", "def"]), "outputs.0.data: not FP32 values"),
    (_with_output(data=[None, None]), "outputs.0.data: not FP32 values"),
    (_with_output(data=[[0.5, 0.5], [0.5]]), "outputs.0.data: ragged lists"),
    (_with_output(data=[{"v": 1}, 2]), "outputs.0.data: not FP32 values"),
    (_with_output(data="0.5 0.5"), "outputs.0.data: Input should be a valid array"),
    (_with_output(data=None), "outputs.0.data: missing (no data and no binary_data_size)"),
    (_with_output(shape=[1.5, 2]), "outputs.0.shape.0: Input should be a valid integer"),
    (_with_output(shape=[-1, 2]), "outputs.0.shape.0: Input should be greater than or equal to 0"),
    (_with_output(shape=[True, 2]), "outputs.0.shape.0: Input should be a valid integer"),
    (_with_output(datatype="FLOAT"), "outputs.0.datatype: Input should be 'BOOL'"),
    (_with_output(name=7), "outputs.0.name: Input should be a valid string"),
    (lambda request: {"model_name": "m", "outputs": {"y": [0.5, 0.5]}}, "outputs: Input should be a valid array"),
    (lambda request: {"outputs": good_answer(request)["outputs"]}, "model_name: Field required"),
    (lambda request: [good_answer(request)], "is not a v2 inference response (a JSON object)"),
    (lambda request: b"<html><body>hello</body></html>", "is not a v2 inference response (a JSON object): an HTML"),
    (lambda request: b"\xff\xfe not utf-8", "is not a v2 inference response (a JSON object)"),
    (lambda request: b"[" * 100_000, "is not a v2 inference response (a JSON object)"),
])
def test_malformed_answers_are_exit_2_naming_the_key(v2, tmp_path, answer, says):
    url, fake = v2
    fake.answer = answer
    r = _bench(url, tmp_path)
    line = one_error_line(r)
    assert r.rc == 2 and says in line and "answer to POST /v2/models/m/infer" in line, r.err


def test_integer_outputs_out_of_range_are_exit_2(v2, tmp_path):
    url, fake = v2
    fake.metadata = {**METADATA, "outputs": [{"name": "y", "datatype": "INT8", "shape": [-1, 2]}]}
    fake.answer = _with_output(datatype="INT8", data=[1, 300])
    r = _bench(url, tmp_path)
    assert r.rc == 2 and "outputs.0.data: not INT8 values" in one_error_line(r), r.err
    fake.answer = _with_output(datatype="INT8", data=[1, 2.5])
    r = _bench(url, tmp_path)
    assert r.rc == 2 and "outputs.0.data: not INT8 values" in one_error_line(r), r.err
    fake.answer = _with_output(datatype="INT8", data=[1, -128])
    assert _bench(url, tmp_path).rc == 0


def test_a_huge_content_length_is_refused_before_reading(v2, tmp_path):
    url, fake = v2
    fake.answer = lambda request: b"{}"
    fake.headers = {"Content-Length": str(1 << 40)}
    t0 = time.monotonic()
    r = _bench(url, tmp_path)
    assert r.rc == 2 and "answered more than 1,073,741,824 bytes" in one_error_line(r), r.err
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("metadata, says", [
    ({**METADATA, "inputs": [{"name": "x", "datatype": "FP32", "shape": [100000, 100000]}]},
     "input 'x' of 'm' is declared [100000,100000]: 10,000,000,000 values, more than optkit sends"),
    ({**METADATA, "inputs": [{"name": "x", "datatype": "FP32", "shape": [1.5, 3]}]},
     "inputs.0.shape.0: Input should be a valid integer"),
    ({**METADATA, "inputs": [{"name": "x", "datatype": "FP32", "shape": [-2, 3]}]},
     "inputs.0.shape.0: Input should be greater than or equal to -1"),
    ({**METADATA, "inputs": [{"name": "x", "datatype": "FLOAT", "shape": [1, 3]}]},
     "inputs.0.datatype: Input should be 'BOOL'"),
    ({**METADATA, "inputs": {"x": [1, 3]}}, "inputs: Input should be a valid array"),
    ({**METADATA, "outputs": None}, "outputs: Input should be a valid array"),
    ({**METADATA, "inputs": METADATA["inputs"] * 2}, "declares input 'x' twice"),
    ({**METADATA, "inputs": []}, "declares no inputs"),
    ([METADATA], "is not v2 model metadata (a JSON object)"),
    (b"not json", "is not v2 model metadata (a JSON object): not json"),
])
def test_malformed_metadata_is_exit_2_before_any_inference(v2, tmp_path, metadata, says):
    url, fake = v2
    fake.metadata = metadata
    r = _bench(url, tmp_path)
    assert r.rc == 2 and says in one_error_line(r), r.err
    assert not any(req.startswith("POST") for req in fake.requests)


def test_a_password_in_the_url_is_never_written_or_printed(v2, tmp_path):
    url, fake = v2
    secret = "S3cr3t-pw"
    auth = url.replace("http://", f"http://alice:{secret}@")
    for args in (("--json",), ()):
        r = _bench(auth, tmp_path, *args)
        assert r.rc == 0, r.err
        assert secret not in r.out + r.err
        report = (r.folder / "report.json").read_text()
        assert secret not in report and "alice:***@" in report
    fake.answer = _with_output(shape=[1])
    r = _bench(auth, tmp_path)
    assert r.rc == 3 and secret not in r.out + r.err
    r = run_cli("bench", "--url", f"http://alice:{secret}@127.0.0.1:1/models/m")
    assert r.rc == 2 and "alice:***@" in one_error_line(r) and secret not in r.out + r.err


# slow senders: every request has a deadline for the whole of it
def _session(url: str, **kwargs):
    from optkit.runtimes.kserve import RemoteSession
    return RemoteSession.open_url(f"{url}/v2/models/m", **kwargs)


def test_a_slow_sender_on_the_checks_is_bounded(v2):
    from optkit.core.errors import UsageError

    url, fake = v2
    fake.slow = {"/v2/health/ready": 0.2}   # headers arrive a byte at a time, each within any per-read timeout
    t0 = time.monotonic()
    with pytest.raises(UsageError, match=r"did not answer GET /v2/health/ready within 1 s$"):
        _session(url, check_timeout=1.0)
    assert time.monotonic() - t0 < 3


def test_a_slow_sender_on_inference_is_bounded(v2):
    from optkit.core.errors import UsageError

    url, fake = v2
    fake.slow = {"/v2/models/m/infer": 0.2}
    session = _session(url, timeout=1.0)
    try:
        t0 = time.monotonic()
        with pytest.raises(UsageError, match=r"did not answer POST /v2/models/m/infer within 1 s$"):
            session.run({"x": np.zeros((1, 3), np.float32)})
        assert time.monotonic() - t0 < 3
    finally:
        session.close()


def test_all_requests_share_the_bench_deadline(v2):
    from optkit.core.errors import UsageError

    url, fake = v2
    session = _session(url, deadline=time.monotonic() + 1.5, deadline_s=1.5)
    try:
        feeds = {"x": np.zeros((1, 3), np.float32)}
        session.run(feeds)
        fake.slow = {"/v2/models/m/infer": 0.2}
        with pytest.raises(UsageError, match=r"before the bench's deadline \(1.5 s for all its requests"):
            for _ in range(20):
                session.run(feeds)
    finally:
        session.close()


def test_the_bench_deadline_is_derived_from_the_settings():
    from optkit.measure.model import MeasureSettings
    from optkit.measure.remote import bench_deadline_s

    assert bench_deadline_s(MeasureSettings(runs=20)) == 4 * 10 + 60 + 2 * (120 + 60)
    assert bench_deadline_s(MeasureSettings(duration=300, concurrency=4)) == 4 * 10 + 60 + 4 * (300 + 60)
    assert math.isfinite(bench_deadline_s(MeasureSettings(runs=1_000_000)))


@pytest.mark.slow
def test_bench_against_a_slow_ready_check_stops_in_seconds(v2, tmp_path):
    """The issue's case from the CLI: /v2/health/ready one byte every 2 s: exit 2 after the 10 s check."""
    url, fake = v2
    fake.slow = {"/v2/health/ready": 2.0}
    t0 = time.monotonic()
    r = run_cli("bench", "--url", f"{url}/v2/models/m", "--runs", "20", timeout=120)
    assert r.rc == 2 and "did not answer GET /v2/health/ready within 10 s" in one_error_line(r), r.err
    assert time.monotonic() - t0 < 30


def test_inputs_too_big_to_send_are_exit_2(v2, tmp_path):
    """JSON tensors carry at most 2^24 values per request: more is refused before any inference is sent."""
    url, fake = v2
    fake.metadata = {**METADATA, "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, -1]}]}
    r = _bench(url, tmp_path, "--shape", "5000x4000")
    assert r.rc == 2 and "the inputs hold 20,000,000 values, more than optkit sends as JSON tensors" \
        in one_error_line(r), r.err
    assert not any(req.startswith("POST") for req in fake.requests)
