"""No network (issue 29): every networked code path of optkit (package for Triton and MLflow with an SQLite
registry, tune on an SQLite storage URL, bench --url against a KServe v2 server on 127.0.0.1) contacts nothing
but the loopback, and leaves no file under a fresh HOME or TMPDIR.

Each command runs in a subprocess whose sitecustomize adds an audit hook (sys.addaudithook): every connect,
sendto and name lookup of an address that is not the loopback is written to a log and refused, in that process and
in every Python child it starts (they inherit PYTHONPATH). The environment is a user's shell: no CI marker, no
PYTEST_CURRENT_TEST (MLflow keeps quiet under those on its own) and none of the opt-outs optkit sets.
"""
from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import ROOT, SAMPLES

CNN = SAMPLES / "torch_cnn.onnx"

HOOK = r'''
import os, sys

_LOG = os.environ.get("OPTKIT_TEST_NETLOG")
_LOOPBACK = ("localhost", "::1", "0:0:0:0:0:0:0:1")


def _loopback(host):
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    host = str(host).strip("[]").lower()
    return host in _LOOPBACK or host.startswith("127.") or host.startswith("::ffff:127.")


def _hook(event, args):
    if not _LOG or not event.startswith("socket."):
        return
    if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        address = args[1] if len(args) > 1 else None
        if not isinstance(address, tuple) or not address:
            return  # a unix socket's path, or a connected socket's send
        host = address[0]
    elif event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex",
                   "socket.gethostbyaddr", "socket.getnameinfo"):
        host = args[0][0] if event == "socket.getnameinfo" else args[0]
    else:
        return
    if not _loopback(host):
        with open(_LOG, "a") as f:
            f.write(f"{os.getpid()} {sys.argv[:3]} {event} {host!r}\n")
        raise PermissionError(f"test: no network ({event} {host!r})")


sys.addaudithook(_hook)
'''

# what makes MLflow (and others) keep quiet by themselves: a user's shell has none of them
CI_MARKERS = ("PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "GITLAB_CI", "JENKINS_URL", "BUILDKITE", "TF_BUILD",
              "CIRCLECI", "TRAVIS", "BITBUCKET_BUILD_NUMBER", "CODEBUILD_BUILD_ARN", "TEAMCITY_VERSION")


class Sandbox:
    """A fresh HOME and TMPDIR, the audit hook, and a work folder; run() is the CLI as a user runs it."""

    def __init__(self, tmp_path: Path):
        from optkit.core.telemetry import OFF

        self.home, self.tmp, self.work = tmp_path / "home", tmp_path / "tmp", tmp_path / "work"
        for d in (self.home, self.tmp, self.work):
            d.mkdir()
        hook = tmp_path / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(HOOK)
        self.log = tmp_path / "network.log"
        drop = {*CI_MARKERS, *OFF, "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "OPTKIT_CACHE_DIR",
                "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"}
        self.env = {k: v for k, v in os.environ.items() if k not in drop}
        self.env.update(HOME=str(self.home), TMPDIR=str(self.tmp), OPTKIT_TEST_NETLOG=str(self.log), COLUMNS="200",
                        PYTHONPATH=os.pathsep.join([str(hook), str(ROOT)]))

    def run(self, *args, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "optkit", *map(str, args)], capture_output=True, text=True,
                              cwd=self.work, env=self.env, timeout=timeout)

    def check(self, home_allowed: tuple[str, ...] = ()) -> None:
        """Nothing left the loopback; nothing appeared in HOME (but `home_allowed`, documented) or TMPDIR."""
        assert not self.log.exists(), self.log.read_text()
        made = sorted(str(p.relative_to(self.home)) for p in self.home.rglob("*") if p.is_file())
        assert [p for p in made if not p.startswith(home_allowed)] == [] if home_allowed else made == [], made
        assert sorted(p.name for p in self.tmp.rglob("*")) == []


@pytest.fixture
def box(tmp_path):
    return Sandbox(tmp_path)


def test_the_hook_sees_and_stops_an_outside_address(box):
    """The check itself: a lookup and a connection to outside addresses are logged and refused."""
    code = ("import socket\n"
            "for call in (lambda: socket.getaddrinfo('example.invalid', 80),\n"
            "             lambda: socket.create_connection(('192.0.2.1', 9), timeout=0.1)):\n"
            "    try:\n        call()\n    except OSError:\n        pass\n"
            "socket.getaddrinfo('127.0.0.1', 80)\n")
    subprocess.run([sys.executable, "-c", code], env=box.env, cwd=box.work, timeout=60, check=True)
    logged = box.log.read_text()
    assert "getaddrinfo 'example.invalid'" in logged and "'192.0.2.1'" in logged and "127.0.0.1" not in logged


def test_package_for_triton(box):
    r = box.run("package", CNN, "--to", "triton", "-o", "repo")
    assert r.returncode == 0, r.stderr
    box.check()


@pytest.mark.slow
def test_package_for_mlflow_with_an_sqlite_registry(box):
    """MLflow's telemetry looks up its host and writes ~/.config/mlflow/telemetry.json unless switched off."""
    r = box.run("package", CNN, "--to", "mlflow", "-o", "m", "--registry", "sqlite:///registry.db")
    assert r.returncode == 0, r.stderr
    assert "registered in sqlite:///registry.db" in r.stdout
    box.check()


def test_tune_on_an_sqlite_storage_url(box):
    r = box.run("tune", CNN, "--trials", "2", "--trial-seconds", "0.15", "--confirm", "0", "--space", "threads=1,2",
                "--storage", "sqlite:///study.db", "--study", "s", "-o", "best.json")
    assert r.returncode == 0, r.stderr
    box.check()


def test_openvino_convert_and_bench(box):
    """OpenVINO's converter reports usage through openvino_telemetry (no opt-out variable: without a consent file
    it sends, and writes a client id under ~/intel); NNCF uses the same module. optkit makes it unimportable."""
    pytest.importorskip("openvino")
    r = box.run("convert", CNN, "-o", "cnn.xml")
    assert r.returncode == 0, r.stderr
    r = box.run("bench", "cnn.xml", "--runs", "5")
    assert r.returncode == 0, r.stderr
    box.check()


# ------------------------------------------------------------------ bench --url against a local v2 server

METADATA = {"name": "m", "versions": ["1"], "platform": "fake",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]}


class _V2(http.server.BaseHTTPRequestHandler):
    """The least of a KServe v2 server for model m: ready, metadata, and an answer of the right shape."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, body: dict, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        answers = {"/v2/health/ready": {}, "/v2/models/m/ready": {}, "/v2": {"name": "fake", "version": "0",
                                                                               "extensions": []},
                   "/v2/models/m": METADATA}
        self._send(answers.get(self.path.split("?")[0], {"error": "no such thing"}),
                   200 if self.path.split("?")[0] in answers else 404)

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        batch = request["inputs"][0]["shape"][0]
        self._send({"model_name": "m", "model_version": "1",
                    "outputs": [{"name": "y", "datatype": "FP32", "shape": [batch, 2], "data": [0.5] * (2 * batch)}]})


@pytest.fixture
def v2_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _V2)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_bench_url_against_a_local_server(box, v2_url):
    secret = "pw-Bench-51c"
    r = box.run("bench", "--url", f"http://alice:{secret}@{v2_url}/v2/models/m", "--warmup", "1", "--runs", "3",
                "--report", "report.json")
    assert r.returncode == 0, r.stderr
    box.check()
    assert secret not in r.stdout + r.stderr and secret not in (box.work / "report.json").read_text()
