"""The runtime of a model served over the KServe v2 HTTP protocol (Triton, MLServer, KServe, ...).

`RemoteSession.run(feeds)` is one POST /v2/models/NAME/infer, so `optkit bench --url` (measure.remote) times a
served model with the same loops and statistics as an in-process runtime (measure.latency,
measure.concurrency), and its figures read the same way: p50/p90/p99 with their 95% bands, mean, throughput, and under load N requests in
flight from N threads. Each thread keeps its own keep-alive connection. The request body of a feed is encoded
once and re-sent (a load generator's inputs are ready before the clock starts); every response is checked:
status 200, and each output the model declares back with as many values as its shape holds.

Only the standard library is used (http.client). JSON tensors always; the binary tensor extension (raw bytes
after the JSON header) where the server lists `binary_tensor_data` among its extensions.
"""
from __future__ import annotations

import http.client
import json
import math
import re
import threading
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from optkit.core.errors import UsageError
from optkit.core.shapes import TensorSpec
from optkit.core.text import first_line
from optkit.runtimes.base import Session

CONNECT_TIMEOUT_S = 3.0     # an unreachable host fails fast
CHECK_TIMEOUT_S = 10.0      # each request of the checks before timing (health, readiness, metadata)
REQUEST_TIMEOUT_S = 60.0    # one inference
MAX_RESPONSE_BYTES = 1 << 30

# KServe v2 datatypes -> numpy dtype names (BYTES: strings, fed as object arrays like onnxruntime's)
V2_DTYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
             "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
             "FP32": "float32", "FP64": "float64", "BYTES": "string"}
NUMPY_TO_V2 = {v: k for k, v in V2_DTYPES.items()} | {"object": "BYTES", "str": "BYTES"}

_URL = re.compile(r"^(?P<prefix>(?:/[^/]+)*?)/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/?$")


class ServedModel:
    """Where a v2 model is served: scheme, host, port, path prefix, name and version, parsed from its URL."""

    def __init__(self, url: str):
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"--url {url!r}: give the model's KServe v2 address, "
                             "http://HOST:PORT/v2/models/NAME")
        m = _URL.match(parts.path)
        if not m:
            raise UsageError(f"--url {url!r}: the path must be /v2/models/NAME (or /v2/models/NAME/versions/V), "
                             "as the KServe v2 protocol names a model")
        try:
            port = parts.port
        except ValueError:
            raise UsageError(f"--url {url!r}: the port is not a number from 1 to 65535") from None
        self.url = url.strip()
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = port or (443 if self.https else 80)
        self.prefix = m["prefix"]
        self.name = m["name"]
        self.version = m["version"]
        self.model_path = f"{self.prefix}/v2/models/{self.name}" + (f"/versions/{self.version}" if self.version
                                                                      else "")

    @property
    def server(self) -> str:
        return f"{'https' if self.https else 'http'}://{self.host}:{self.port}{self.prefix}"


class RemoteSession(Session):
    """A served model behind the KServe v2 HTTP protocol. `open_url()` checks, quickly and before any timing, that
    the server answers, speaks v2, serves the model and has it ready; each failure is one UsageError line."""

    runtime = "kserve-v2"
    provider = "http"

    def __init__(self, url: str, *, connect_timeout: float = CONNECT_TIMEOUT_S,
                 check_timeout: float = CHECK_TIMEOUT_S, timeout: float = REQUEST_TIMEOUT_S,
                 binary: bool | None = None):
        self.where = ServedModel(url)
        self.connect_timeout, self.check_timeout, self.timeout = connect_timeout, check_timeout, timeout
        self._idle: list[http.client.HTTPConnection] = []   # list.pop / append are atomic under the GIL
        self._connections: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._body: tuple[dict, list, bytes, dict] | None = None   # (feeds, their arrays, body, headers)
        self.binary = binary
        self.server_meta: dict[str, Any] = {}
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []

    # ------------------------------------------------------------------ connections
    def _new_connection(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.where.https else http.client.HTTPConnection
        conn = cls(self.where.host, self.where.port, timeout=self.connect_timeout)
        with self._lock:
            self._connections.append(conn)
        return conn

    def connections(self, n: int) -> None:
        """Open `n` keep-alive connections now, so that N threads in flight each find one ready (the timed
        calls then hold no TCP set-up)."""
        opened = []
        while len(opened) < n:
            try:
                opened.append(self._idle.pop())
            except IndexError:
                opened.append(self._new_connection())
        try:
            for conn in opened:
                if conn.sock is None:
                    self._connect(conn)
        finally:
            self._idle.extend(opened)

    def _connect(self, conn: http.client.HTTPConnection) -> None:
        conn.timeout = self.connect_timeout
        try:
            conn.connect()                       # http.client sets TCP_NODELAY
        except TimeoutError:
            conn.close()
            raise UsageError(f"{self.where.server} did not accept a connection within {self.connect_timeout:g} s: "
                             "check --url and that the server is up") from None
        except OSError as e:
            conn.close()
            raise UsageError(f"cannot reach {self.where.server} ({e.strerror or first_line(e) or type(e).__name__})"
                             ": check --url and that the server is running") from None
        conn.sock.settimeout(self.timeout)
        conn.sock_timeout = self.timeout

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
                timeout: float | None = None) -> tuple[int, http.client.HTTPResponse, bytes]:
        """(status, response, body) of one request over an idle keep-alive connection (one per request in
        flight; a connection the server closed while idle is reopened once). Unreachable: a UsageError."""
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._new_connection()
        keep = False
        try:
            for attempt in (0, 1):
                fresh = conn.sock is None
                if fresh:
                    self._connect(conn)
                wait = timeout or self.timeout
                if conn.sock_timeout != wait:
                    conn.sock.settimeout(wait)
                    conn.sock_timeout = wait
                try:
                    conn.request(method, path, body=body, headers=headers or {})
                    resp = conn.getresponse()
                    data = resp.read(MAX_RESPONSE_BYTES + 1)
                except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                    conn.close()
                    if fresh or attempt:
                        raise UsageError(f"{self.where.server} closed the connection on {method} {path} "
                                         f"({first_line(e) or type(e).__name__}): is it a KServe v2 server?") from None
                    continue
                except TimeoutError:
                    raise UsageError(f"{self.where.server} did not answer {method} {path} within {wait:g} s"
                                     ) from None
                except (OSError, http.client.HTTPException) as e:
                    raise UsageError(f"{self.where.server} did not answer {method} {path} over HTTP "
                                     f"({first_line(e) or type(e).__name__}): is it a KServe v2 server?") from None
                if len(data) > MAX_RESPONSE_BYTES:
                    raise UsageError(f"{self.where.server}{path} answered more than {MAX_RESPONSE_BYTES:,} bytes")
                keep = not resp.will_close
                return resp.status, resp, data
            raise AssertionError("unreachable")
        finally:
            if keep:
                self._idle.append(conn)
            else:
                conn.close()
                self._idle.append(conn)   # reopened on its next use

    def close(self) -> None:
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()

    # ------------------------------------------------------------------ the checks before timing
    @classmethod
    def open_url(cls, url: str, **kwargs) -> RemoteSession:
        session = cls(url, **kwargs)
        try:
            session.check()
        except BaseException:
            session.close()
            raise
        return session

    def check(self) -> None:
        """Server up and speaking v2, the model served and ready, its inputs and outputs read."""
        w = self.where
        status, _, body = self.request("GET", f"{w.prefix}/v2/health/ready", timeout=self.check_timeout)
        if status == 404 or status >= 500 and not _is_json(body):
            raise UsageError(f"{w.server} is not a KServe v2 server: GET /v2/health/ready answered {status}"
                             f"{_said(body)}")
        # a server is ready only when all its models are (Triton's strict readiness): the named model decides
        server_ready = "" if status == 200 else f"; nor is the server (GET /v2/health/ready answered {status})"
        status, _, body = self.request("GET", f"{w.prefix}/v2", timeout=self.check_timeout)
        meta = _json(body) if status == 200 else None
        self.server_meta = {k: meta.get(k) for k in ("name", "version", "extensions")} if isinstance(meta, dict) \
            else {}
        status, _, body = self.request("GET", f"{w.model_path}/ready", timeout=self.check_timeout)
        if status != 200:
            if status == 404 and not _is_json(body):
                raise UsageError(f"{w.server} is not a KServe v2 server: GET {w.model_path}/ready answered 404"
                                 f"{_said(body)}")
            raise UsageError(f"model {w.name!r} at {w.server} is not ready (GET {w.model_path}/ready answered "
                             f"{status}{_said(body)}{server_ready}): check the name, wait for it to load, or read "
                             "the server's log")
        status, _, body = self.request("GET", w.model_path, timeout=self.check_timeout)
        meta = _json(body)
        if status != 200 or not (isinstance(meta, dict) and isinstance(meta.get("inputs"), list)
                                 and isinstance(meta.get("outputs"), list)):
            raise UsageError(f"{w.server} is not a KServe v2 server: GET {w.model_path} did not answer v2 model "
                             f"metadata (a JSON object with inputs and outputs; it answered {status}{_said(body)})")
        self.inputs = [_spec(t, "input", w) for t in meta["inputs"]]
        self.outputs = [_spec(t, "output", w) for t in meta["outputs"]]
        if not self.inputs:
            raise UsageError(f"model {w.name!r} at {w.server} declares no inputs; optkit has nothing to send it")
        if self.binary is None:
            self.binary = "binary_tensor_data" in (self.server_meta.get("extensions") or [])
        bf16 = [s.name for s in self.inputs if s.dtype == "BF16"]
        if bf16:
            raise UsageError(f"input {bf16[0]!r} of {w.name!r} is BF16, which optkit cannot send over v2 HTTP yet")

    def describe(self) -> dict[str, Any]:
        """What the report says about the server and the protocol."""
        return {"url": self.where.url, "model": self.where.name, "version": self.where.version,
                "server": self.server_meta.get("name"), "server_version": self.server_meta.get("version"),
                "protocol": "kserve-v2 http, " + ("binary tensors" if self.binary else "json tensors")}

    # ------------------------------------------------------------------ inference
    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        body, headers = self._encoded(feeds)
        status, resp, data = self.request("POST", f"{self.where.model_path}/infer", body, headers)
        if status != 200:
            raise UsageError(f"{self.where.server} answered {status} to an inference request of "
                             f"{self.where.name!r}{_said(data)}", details={"status": status})
        return self._decode(resp, data)

    def _encoded(self, feeds: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
        cached = self._body
        if cached is not None and cached[0] is feeds and all(a is b for a, b in zip(cached[1], feeds.values())):
            return cached[2], cached[3]
        tensors, raw = [], []
        for name, value in feeds.items():
            arr = np.asarray(value)
            dtype = NUMPY_TO_V2.get(arr.dtype.name if arr.dtype.kind != "U" else "str")
            if dtype is None:
                raise UsageError(f"input {name!r} is {arr.dtype}, which the KServe v2 protocol has no type for")
            t: dict[str, Any] = {"name": name, "shape": list(arr.shape), "datatype": dtype}
            if self.binary and dtype != "BYTES":
                chunk = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
                t["parameters"] = {"binary_data_size": len(chunk)}
                raw.append(chunk)
            else:
                t["data"] = [str(x) for x in arr.ravel()] if dtype == "BYTES" else arr.ravel().tolist()
            tensors.append(t)
        request: dict[str, Any] = {"inputs": tensors}
        wanted = [{"name": s.name, "parameters": {"binary_data": True}} for s in self.outputs if s.dtype != "string"]
        if self.binary and wanted:
            request["outputs"] = wanted + [{"name": s.name} for s in self.outputs if s.dtype == "string"]
        head = json.dumps(request, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"}
        if self.binary:
            headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))}
        body = head + b"".join(raw)
        self._body = (feeds, list(feeds.values()), body, headers)
        return body, headers

    def _decode(self, resp: http.client.HTTPResponse, data: bytes) -> list[np.ndarray]:
        where = f"{self.where.server}'s answer for {self.where.name!r}"
        size = resp.getheader("Inference-Header-Content-Length")
        try:
            head_len = int(size) if size is not None else len(data)
        except ValueError:
            raise UsageError(f"{where}: Inference-Header-Content-Length {size!r} is not a number") from None
        reply = _json(data[:head_len])
        if not isinstance(reply, dict) or not isinstance(reply.get("outputs"), list):
            raise UsageError(f"{where} is not a v2 inference response (a JSON object with outputs)")
        offset, got = head_len, {}
        for t in reply["outputs"]:
            if not isinstance(t, dict) or not isinstance(t.get("shape"), list) or t.get("datatype") not in V2_DTYPES:
                raise UsageError(f"{where}: an output without a v2 name, shape and datatype")
            count = math.prod(int(d) for d in t["shape"])
            dtype = V2_DTYPES[t["datatype"]]
            params = t.get("parameters") or {}
            if "binary_data_size" in params:
                n = int(params["binary_data_size"])
                chunk, offset = data[offset:offset + n], offset + n
                if len(chunk) != n or dtype == "string":
                    raise UsageError(f"{where}: output {t.get('name')!r} is cut short")
                arr = np.frombuffer(chunk, dtype=np.dtype(dtype).newbyteorder("<"))
            else:
                values = t.get("data")
                if not isinstance(values, list):
                    raise UsageError(f"{where}: output {t.get('name')!r} carries no data")
                arr = np.asarray(_flat(values), dtype=object if dtype == "string" else dtype)
            if arr.size != count:
                raise UsageError(f"{where}: output {t.get('name')!r} has {arr.size} values for shape {t['shape']}")
            got[t.get("name")] = arr.reshape(t["shape"])
        missing = [s.name for s in self.outputs if s.name not in got]
        if missing or not got:
            raise UsageError(f"{where} lacks output {', '.join(missing) or '(none came back)'}")
        return [got[s.name] for s in self.outputs] if self.outputs else list(got.values())


def _spec(t: Any, kind: str, where: ServedModel) -> TensorSpec:
    if not (isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("shape"), list)
            and isinstance(t.get("datatype"), str)):
        raise UsageError(f"{where.server} is not a KServe v2 server: an {kind} of {where.name!r} in its metadata "
                         "lacks a name, shape or datatype")
    if t["datatype"] not in V2_DTYPES and t["datatype"] != "BF16":
        raise UsageError(f"{kind} {t['name']!r} of {where.name!r} has datatype {t['datatype']!r}, not a KServe v2 "
                         "type")
    shape = [d if isinstance(d, int) and d > 0 else None for d in t["shape"]]
    return TensorSpec(t["name"], shape, V2_DTYPES.get(t["datatype"], t["datatype"]))


def _flat(values: list) -> list:
    """v2 JSON data may be nested row-major lists; flatten them."""
    if values and isinstance(values[0], list):
        return [x for v in values for x in _flat(v)]
    return values


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


def _is_json(body: bytes) -> bool:
    return _json(body) is not None


def _said(body: bytes) -> str:
    """': <the server's error>' from a v2 error body ({"error": ...}), else a short printable excerpt."""
    reply = _json(body)
    text = reply.get("error") if isinstance(reply, dict) and isinstance(reply.get("error"), str) else None
    if text is not None and "\n" in text.strip():  # a server's traceback: its first line and the exception raised
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        raised = [line for line in lines[1:] if re.match(r"^[\w.]*(Error|Exception)\b[^:]*: \S", line)]
        first = re.sub(r"\s*Traceback \(most recent call last\):.*", "", lines[0])
        text = first + (f" ... {raised[-1]}" if raised else "")
        return f": {text[:400]}"
    if text is None:
        text = body[:200].decode("utf-8", "replace")
        if "<" in text and re.search(r"<(!doctype|html|head|body)", text, re.I):
            return ": an HTML page"
    text = " ".join(text.split())[:200]
    return f": {text}" if text else ""
