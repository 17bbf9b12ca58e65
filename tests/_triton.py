"""A real tritonserver (from nvidia-pytriton, in the tool folder tools/triton/.venv that .ci/run makes) serving an
optkit package on 127.0.0.1, bounded in time and always stopped.

pytriton bundles tritonserver 2.51 with its Python backend only (Triton's onnxruntime and OpenVINO backends are not
on pip). The proof copies the package and swaps `backend: "onnxruntime"` (or "openvino") for `backend: "python"` in
its config.pbtxt, everything else as written (inputs, outputs, dims, max_batch_size, instance_group,
dynamic_batching, the backend's parameters, warm-up, version_policy); each version folder gets a model.py that runs
that folder's model inside the server with the config's parameters applied: model.onnx with onnxruntime
(MODEL_PY), or the OpenVINO IR model.xml + model.bin with OpenVINO (OPENVINO_PY; the tool folder's openvino,
tools/triton/requirements.txt).

The one place the tests find that tool folder: tests/test_package_triton.py (tritonserver below) and
tests/test_bench_url.py (bench --url against the same server) both skip with `missing()` and start their server
with `tritonserver()`.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from optkit.package.targets import triton

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "triton" / ".venv"
PYTHON = TOOL / "bin" / "python"
INSTALL = "python3 -m venv tools/triton/.venv && tools/triton/.venv/bin/pip install -r tools/triton/requirements.txt"

MODEL_PY = '''\
import json
import os
import sys

sys.path[:0] = {site!r}  # the tool folder's numpy and onnxruntime: the stub embeds its own Python

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {{k: v["string_value"] for k, v in config.get("parameters", {{}}).items()}}
        so = ort.SessionOptions()
        if "intra_op_thread_count" in params:
            so.intra_op_num_threads = int(params["intra_op_thread_count"])
        if "inter_op_thread_count" in params:
            so.inter_op_num_threads = int(params["inter_op_thread_count"])
        if params.get("execution_mode") == "1":
            so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        so.enable_cpu_mem_arena = params.get("enable_mem_arena", "1") == "1"
        so.enable_mem_pattern = params.get("enable_mem_pattern", "1") == "1"
        level = (config.get("optimization", {{}}).get("graph", {{}}) or {{}}).get("level")
        so.graph_optimization_level = {{-1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                        1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                        2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL}}.get(
            level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        here = os.path.join(args["model_repository"], args["model_version"])
        self.session = ort.InferenceSession(os.path.join(here, "model.onnx"), so, providers=["CPUExecutionProvider"])
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]

    def execute(self, requests):
        responses = []
        for request in requests:
            feed = {{n: pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in self.inputs}}
            result = self.session.run(self.outputs, feed)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(n, np.ascontiguousarray(r)) for n, r in zip(self.outputs, result)]))
        return responses
'''

OPENVINO_PY = '''\
import json
import os
import sys

sys.path[:0] = {site!r}  # the tool folder's numpy and openvino: the stub embeds its own Python
sys.modules.setdefault("openvino_telemetry", None)  # no usage reports (as optkit: core/telemetry.py)

import numpy as np
import openvino as ov
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Triton's OpenVINO backend as optkit configures it: the version's IR, compiled on the CPU with the config's
    parameters as OpenVINO properties (PERFORMANCE_HINT, NUM_STREAMS, INFERENCE_NUM_THREADS, ...); a model with
    dynamic dims reshaped to each request's shapes and compiled for them, as optkit measures it."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.properties = {{k: v["string_value"] for k, v in config.get("parameters", {{}}).items()}}
        here = os.path.join(args["model_repository"], args["model_version"])
        self.core = ov.Core()
        self.model = self.core.read_model(os.path.join(here, {model!r}))
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]
        self.dynamic = any(p.get_partial_shape().is_dynamic for p in self.model.inputs)
        self.compiled = {{}}

    def _request(self, feed):
        key = tuple((k, v.shape) for k, v in feed.items()) if self.dynamic else ()
        if key not in self.compiled:
            model = self.model
            if self.dynamic:
                model = model.clone()
                model.reshape({{k: list(v.shape) for k, v in feed.items()}})
            self.compiled[key] = self.core.compile_model(model, "CPU", self.properties).create_infer_request()
        return self.compiled[key]

    def execute(self, requests):
        responses = []
        for request in requests:
            feed = {{n: pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in self.inputs}}
            result = self._request(feed).infer(feed)
            out = {{name: result[port] for port in result for name in port.get_names()}}
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(n, np.ascontiguousarray(out[n])) for n in self.outputs]))
        return responses
'''
STAND_INS = {"onnxruntime": MODEL_PY, "openvino": OPENVINO_PY}


@functools.cache
def missing() -> str | None:
    """None when the tool folder's Python imports tritonserver (pytriton), tritonclient and onnxruntime; else what
    is missing and how to install it (the skip reason of every test that needs the tool folder)."""
    if not PYTHON.exists():
        return (f"nvidia-pytriton (tritonserver) and tritonclient are not installed in tools/triton/.venv: "
                f"run bash .ci/run, or {INSTALL}")
    if _server_dir() is None:
        return f"nvidia-pytriton is missing from tools/triton/.venv: {INSTALL}"
    try:
        _probe()
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return f"{e}: {INSTALL}"
    return None


def needs_tool() -> pytest.MarkDecorator:
    """The mark of a test module that needs the tool folder: skipped loudly, with missing()'s line, without it."""
    return pytest.mark.skipif(missing() is not None, reason=f"SKIPPED LOUDLY: {missing()}")


@functools.cache
def missing_openvino() -> str | None:
    """None when the tool folder's Python also imports openvino (the OpenVINO stand-in's runtime); else the line."""
    if missing() is not None:
        return missing()
    proc = subprocess.run([str(PYTHON), "-c", "import sys; sys.modules['openvino_telemetry'] = None; import openvino"],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode:
        return (f"tools/triton/.venv/bin/python cannot import openvino "
                f"({(proc.stderr.strip().splitlines() or ['?'])[-1]}): {INSTALL}")
    return None


def skip_unless_tool() -> None:
    """The same skip, from inside a fixture (a module whose other tests need no server)."""
    if missing() is not None:
        pytest.skip(f"SKIPPED LOUDLY: {missing()}")


@functools.cache
def _probe() -> dict:
    """The tool Python's version and libpython folder, once it has imported what the servers need."""
    proc = subprocess.run([str(PYTHON), "-c", "import json, sys, sysconfig, pytriton, tritonclient, onnxruntime; "
                           "print(json.dumps({'version': '%d.%d' % sys.version_info[:2], "
                           "'libdir': sysconfig.get_config_var('LIBDIR') or ''}))"],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode:
        raise RuntimeError(f"tools/triton/.venv/bin/python cannot import pytriton, tritonclient and onnxruntime "
                           f"({(proc.stderr.strip().splitlines() or ['?'])[-1]})")
    return json.loads(proc.stdout)


def env(*libs: Path) -> dict:
    """os.environ for a Triton server of the tool folder, `libs` and the tool Python's libpython first on
    LD_LIBRARY_PATH: Triton's Python backend stub loads libpython3.x.so, and it must be the one of the Python
    whose standard library and site-packages it runs (pyenv's, say), not another of the same minor version the
    loader finds first (Debian's /usr/lib/x86_64-linux-gnu: a stdlib/libpython mismatch fails the model's set-up)."""
    path = [_probe()["libdir"], *map(str, libs), os.environ.get("LD_LIBRARY_PATH", "")]
    return {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(p for p in path if p)}


def _site() -> Path:
    return next((TOOL / "lib").glob("python3*/site-packages"))


def _server_dir() -> Path | None:
    found = list((TOOL / "lib").glob("python3*/site-packages/pytriton/tritonserver/bin/tritonserver"))
    return found[0].parents[1] if found else None


def check_config(*pbtxt: Path) -> dict | list[dict]:
    """Parse with tritonclient's model_config_pb2 in the tool folder's Python (package/targets/triton_check.py)."""
    checker = ROOT / "optkit" / "package" / "targets" / "triton_check.py"
    proc = subprocess.run([str(TOOL / "bin" / "python"), str(checker),
                           *map(str, pbtxt)], capture_output=True, text=True, timeout=60)
    if proc.returncode:
        raise ValueError(proc.stderr.strip())
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    return out[0] if len(pbtxt) == 1 else out


def proof_repository(package_repo: Path, dest: Path) -> Path:
    """The package, with the Python backend standing in for the onnxruntime or OpenVINO backend (see the module's
    text)."""
    shutil.copytree(package_repo, dest)
    for config in dest.glob("*/config.pbtxt"):
        text = config.read_text()
        if 'platform: "ensemble"' in text:  # an ensemble: Triton's own scheduler runs it, as packaged
            continue
        parsed = triton.loads(text, config)
        backend = parsed["backend"]
        # the Python backend loads default_model_filename as its model.py: the IR's name goes into model.py instead
        model_file = parsed.pop("default_model_filename", "model.xml")
        config.write_text(triton.dumps({**parsed, "backend": "python"}))
        for version in config.parent.iterdir():
            if version.is_dir() and version.name.isdigit():
                (version / "model.py").write_text(STAND_INS[backend].format(site=[str(_site())], model=model_file))
    return dest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def tritonserver(repository: Path, workdir: Path, start_timeout: float = 40, control: str = "none",
                 options: tuple[str, ...] = ()):
    """Yield (base URL, process) once the server is ready, or (None, process) when it exited (refused the
    repository); the server is stopped (and killed after 10 s) on every exit path. `control` is Triton's
    --model-control-mode ("explicit" loads every model at start and lets the repository API unload them);
    `options` are more tritonserver flags."""
    server = _server_dir()
    backends = workdir / "backends" / "python"
    backends.mkdir(parents=True)
    for f in (server / "backends" / "python").iterdir():
        if f.is_file():
            shutil.copy(f, backends / f.name)
    # the stub of the tool Python's version: model.py runs that Python's numpy and onnxruntime
    stub = server / "python_backend_stubs" / _probe()["version"] / "triton_python_backend_stub"
    shutil.copy(stub, backends / stub.name)
    http, grpc = _free_port(), _free_port()
    log = open(workdir / "tritonserver.log", "w")
    proc = subprocess.Popen(
        [str(server / "bin" / "tritonserver"), f"--model-repository={repository}",
         f"--backend-directory={workdir / 'backends'}", "--http-address=127.0.0.1", f"--http-port={http}",
         "--grpc-address=127.0.0.1", f"--grpc-port={grpc}", "--allow-metrics=false", "--exit-on-error=true",
         "--exit-timeout-secs=5", f"--model-control-mode={control}",
         *(["--load-model=*"] if control == "explicit" else []), *options],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env=env(server.parent.parent / "nvidia_pytriton.libs", server / "external_libs"))
    url = f"http://127.0.0.1:{http}"
    try:
        deadline = time.monotonic() + start_timeout
        ready = False
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as r:
                    ready = r.status == 200
            except (urllib.error.URLError, OSError):
                pass
            if ready:
                break
            time.sleep(0.2)
        if not ready and proc.poll() is None:
            raise TimeoutError(f"tritonserver not ready in {start_timeout} s: {log_tail(workdir)}")
        yield (url if ready else None), proc
    finally:
        stop_group(proc)
        log.close()


def stop_group(proc: subprocess.Popen) -> None:
    """Stop a server started in its own process group: SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def log_tail(workdir: Path, n: int = 4000) -> str:
    return (workdir / "tritonserver.log").read_text(errors="replace")[-n:]


def infer(url: str, model: str, inputs: dict, version: str | None = None) -> dict:
    """A KServe v2 JSON infer request; {output name: (datatype, shape, data)}."""
    body = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": _v2_type(v.dtype),
                        "data": v.ravel().tolist()} for k, v in inputs.items()]}
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        out = json.loads(r.read())
    return {o["name"]: (o["datatype"], o["shape"], o["data"]) for o in out["outputs"]}


def _v2_type(dtype) -> str:
    return {"float32": "FP32", "float64": "FP64", "float16": "FP16", "int64": "INT64", "int32": "INT32",
            "int8": "INT8", "uint8": "UINT8", "bool": "BOOL"}[str(dtype)]
