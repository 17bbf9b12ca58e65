"""The runtime of a model served over the KServe v2 HTTP protocol (Triton, MLServer, KServe, ...).

`RemoteSession.run(feeds)` is one POST /v2/models/NAME/infer, so `optkit bench --url` (measure.remote) times a
served model with the same loops and statistics as an in-process runtime (measure.latency,
measure.concurrency), and its figures read the same way: p50/p90/p99 with their 95% bands, mean, throughput, and under load N requests in
flight from N threads. Each thread keeps its own keep-alive connection. The request body of a feed is encoded
once and re-sent (a load generator's inputs are ready before the clock starts).

Everything the server says is input (DESIGN: files read back are input): its model metadata and every answer
go through one schema each (`ModelMetadata`, `InferResponse`, pydantic, strict types). What a user or server
gets from it:
- an answer that is not v2 (not JSON, not an object, a key of the wrong type, data that is not numbers for a
  numeric type, a negative dim), a server that cannot be reached, refuses (4xx/5xx), closes the connection or is
  too slow: exit 2, one line naming the server, the request and the key, as for any bad input;
- a v2 answer that is not what the model declares (an output missing, extra or twice, another datatype, rank or
  static dim, a batch other than the request's, fewer or more values than its shape holds, binary sizes that do
  not add up): exit 3 naming the output, as a pass whose output fails its check. A server that does no work would
  otherwise be timed as a fast one. The values themselves (NaN included) are not judged.

Time bounds are deadlines for a whole request (connect, send, every byte of the answer), not per socket read: a
server sending a byte at a time cannot stretch a request past CHECK_TIMEOUT_S (each check before timing) or
REQUEST_TIMEOUT_S (each inference); `deadline` (measure.remote sets it) bounds all requests of a bench together.

Only the standard library is used (http.client). JSON tensors always; the binary tensor extension (raw bytes
after the JSON header) where the server lists `binary_tensor_data` among its extensions.
"""
from __future__ import annotations

import base64
import http.client
import io
import json
import math
import re
import threading
import time
from typing import Annotated, Any, Literal, Optional
from urllib.parse import unquote, urlsplit

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from optkit.core.errors import PassError, UsageError
from optkit.core.shapes import MAX_ELEMENTS, TensorSpec, format_shape
from optkit.core.text import first_line, printable, redact_url
from optkit.runtimes.base import Session

CONNECT_TIMEOUT_S = 3.0     # an unreachable host fails fast
CHECK_TIMEOUT_S = 10.0      # each request of the checks before timing (health, readiness, metadata), whole
REQUEST_TIMEOUT_S = 60.0    # one inference, whole
MAX_RESPONSE_BYTES = 1 << 30
MAX_JSON_VALUES = 1 << 24   # input values sent as JSON text (binary tensors carry up to MAX_ELEMENTS)
MAX_RANK = 64               # numpy's
READ_CHUNK = 1 << 20

# KServe v2 datatypes -> numpy dtype names (BYTES: strings, fed as object arrays like onnxruntime's)
V2_DTYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
             "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
             "FP32": "float32", "FP64": "float64", "BYTES": "string"}
NUMPY_TO_V2 = {v: k for k, v in V2_DTYPES.items()} | {"object": "BYTES", "str": "BYTES"}

_URL = re.compile(r"^(?P<prefix>(?:/[^/]+)*?)/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/?$")


# ---------------------------------------------------------------------- what a v2 server may answer
V2Type = Literal["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
                 "FP64", "BYTES", "BF16"]
Name = Annotated[str, Field(min_length=1, max_length=1024)]


class _Answer(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class TensorMetadata(_Answer):
    name: Name
    datatype: V2Type
    shape: Annotated[list[Annotated[int, Field(ge=-1)]], Field(max_length=MAX_RANK)]


class ModelMetadata(_Answer):
    """v2 model metadata: GET /v2/models/NAME[/versions/V]."""
    name: Name
    inputs: Annotated[list[TensorMetadata], Field(max_length=4096)]
    outputs: Annotated[list[TensorMetadata], Field(max_length=4096)]


class ServerMetadata(_Answer):
    """v2 server metadata: GET /v2."""
    name: Optional[str] = None
    version: Optional[str] = None
    extensions: list[str] = []


class _Parameters(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)
    binary_data_size: Optional[Annotated[int, Field(ge=0)]] = None


class OutputTensor(_Answer):
    name: Name
    datatype: V2Type
    shape: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=MAX_RANK)]
    data: Optional[list] = None
    parameters: Optional[_Parameters] = None


class InferResponse(_Answer):
    """a v2 inference response: POST /v2/models/NAME/infer (its JSON part)."""
    model_name: Name
    model_version: Optional[str] = None
    outputs: list[OutputTensor]


def _parse(schema: type[_Answer], body: bytes, where: str):
    """`body` read as `schema`; anything else is one UsageError line naming `where` and the key."""
    try:
        return schema.model_validate_json(body)   # JSON NaN and Infinity read as floats, as json.loads reads them
    except ValidationError as e:
        err = e.errors()[0]
        what = f"{where} is not {schema.__doc__.split(':')[0]}"
        if not err["loc"]:   # not JSON, or not an object
            if "recursion limit" in str(err.get("msg", "")):
                raise UsageError(f"{what} (a JSON object): it nests lists or objects deeper than any v2 answer "
                                 "(the JSON parser's recursion limit)") from None
            raise UsageError(f"{what} (a JSON object){_said(body)}") from None
        key = ".".join(str(p) for p in err["loc"])
        raise UsageError(f"{what}: {printable(key)[:120]}: {err['msg']}") from None


class ServedModel:
    """Where a v2 model is served: scheme, host, port, path prefix, name and version, parsed from its URL."""

    def __init__(self, url: str):
        parts = urlsplit(url.strip())
        shown = redact_url(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"--url {shown!r}: give the model's KServe v2 address, "
                             "http://HOST:PORT/v2/models/NAME")
        m = _URL.match(parts.path)
        if not m:
            raise UsageError(f"--url {shown!r}: the path must be /v2/models/NAME (or /v2/models/NAME/versions/V), "
                             "as the KServe v2 protocol names a model")
        try:
            port = parts.port
        except ValueError:
            raise UsageError(f"--url {shown!r}: the port is not a number from 1 to 65535") from None
        if parts.query:
            bare = redact_url(parts._replace(query="", fragment="").geturl())   # a query may hold any secret
            raise UsageError(f"--url {bare + '?...'!r}: optkit sends no query string (a token in it would never "
                             "reach the server); for HTTP basic auth put user:password@ before the host")
        # user:password@ in the URL: sent as HTTP basic auth on every request, as curl does (never shown)
        self.auth: str | None = None
        if parts.username is not None:
            token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self.auth = "Basic " + base64.b64encode(token).decode("ascii")
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


# ---------------------------------------------------------------------- connections with a deadline
class _DeadlineReader(io.RawIOBase):
    """A response's socket reads, each allowed only the time left before the request's deadline. It reads
    through, and closes, the socket file http.client opened, which keeps the socket open until the response is
    read (http.client closes its connection early when the answer ends with the connection)."""

    def __init__(self, conn: _Deadlined, sock, file: io.BufferedReader):
        self.conn, self.sock, self.file = conn, sock, file

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        left = self.conn.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self.sock.settimeout(left)
        return self.file.raw.readinto(buf)

    def close(self) -> None:
        self.file.close()
        super().close()


class _Deadlined:
    """http.client's connection whose responses are read against `deadline` (time.monotonic())."""

    deadline = math.inf

    def response_class(self, sock, *args, **kwargs) -> http.client.HTTPResponse:
        resp = http.client.HTTPResponse(sock, *args, **kwargs)
        resp.fp = io.BufferedReader(_DeadlineReader(self, sock, resp.fp))
        return resp


class _HTTP(_Deadlined, http.client.HTTPConnection):
    pass


class _HTTPS(_Deadlined, http.client.HTTPSConnection):
    pass


class RemoteSession(Session):
    """A served model behind the KServe v2 HTTP protocol. `open_url()` checks, quickly and before any timing, that
    the server answers, speaks v2, serves the model and has it ready; each failure is one UsageError line."""

    runtime = "kserve-v2"
    provider = "http"

    def __init__(self, url: str, *, connect_timeout: float = CONNECT_TIMEOUT_S,
                 check_timeout: float = CHECK_TIMEOUT_S, timeout: float = REQUEST_TIMEOUT_S,
                 binary: bool | None = None, deadline: float = math.inf, deadline_s: float | None = None):
        self.where = ServedModel(url)
        self.connect_timeout, self.check_timeout, self.timeout = connect_timeout, check_timeout, timeout
        self.deadline, self.deadline_s = deadline, deadline_s   # all requests together (monotonic), its length
        self._idle: list[_HTTP] = []   # list.pop / append are atomic under the GIL
        self._connections: list[_HTTP] = []
        self._lock = threading.Lock()
        self._body: tuple | None = None   # (feeds, their arrays, body, headers, batch)
        self.binary = binary
        self.server_meta: dict[str, Any] = {}
        self.meta: ModelMetadata | None = None
        self._accepted: set[tuple] = set()   # signatures of answers that matched the metadata
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []

    # ------------------------------------------------------------------ connections
    def _new_connection(self) -> _HTTP:
        cls = _HTTPS if self.where.https else _HTTP
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
                    conn.deadline = min(time.monotonic() + self.connect_timeout, self.deadline)
                    self._connect(conn)
        finally:
            self._idle.extend(opened)

    def _connect(self, conn: _HTTP) -> None:
        wait = min(self.connect_timeout, conn.deadline - time.monotonic())
        if wait <= 0:
            raise UsageError(self._late("a connection", self.connect_timeout, conn.deadline))
        conn.timeout = wait
        try:
            conn.connect()                       # http.client sets TCP_NODELAY
        except TimeoutError:
            conn.close()
            raise UsageError(f"{self.where.server} did not accept a connection within {wait:g} s: "
                             "check --url and that the server is up") from None
        except OSError as e:
            conn.close()
            raise UsageError(f"cannot reach {self.where.server} ({e.strerror or first_line(e) or type(e).__name__})"
                             ": check --url and that the server is running") from None

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
                timeout: float | None = None) -> tuple[int, http.client.HTTPResponse, bytes]:
        """(status, response, body) of one request over an idle keep-alive connection (one per request in
        flight; a connection the server closed while idle is reopened once), all of it within `timeout` (and
        the session's deadline). Unreachable, too slow, too big: a UsageError."""
        wait = timeout or self.timeout
        deadline = min(time.monotonic() + wait, self.deadline)
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._new_connection()
        conn.deadline = deadline
        keep = False
        try:
            for attempt in (0, 1):
                fresh = conn.sock is None
                try:
                    if fresh:
                        self._connect(conn)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    conn.sock.settimeout(left)   # sending; the answer is read by _DeadlineReader
                    sent = dict(headers or {})
                    if self.where.auth:
                        sent["Authorization"] = self.where.auth
                    conn.request(method, path, body=body, headers=sent)
                    resp = conn.getresponse()
                    data = self._read(resp, path)
                except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                    conn.close()
                    if fresh or attempt:
                        raise UsageError(f"{self.where.server} closed the connection on {method} {path} "
                                         f"({first_line(e) or type(e).__name__}): is it a KServe v2 server?") from None
                    continue
                except TimeoutError:
                    raise UsageError(self._late(f"{method} {path}", wait, deadline)) from None
                except (OSError, http.client.HTTPException) as e:
                    raise UsageError(f"{self.where.server} did not answer {method} {path} over HTTP "
                                     f"({first_line(e) or type(e).__name__}): is it a KServe v2 server?") from None
                keep = not resp.will_close
                self._refused(method, path, resp, data)
                return resp.status, resp, data
            raise AssertionError("unreachable")
        finally:
            if keep:
                self._idle.append(conn)
            else:
                conn.close()
                self._idle.append(conn)   # reopened on its next use

    def _refused(self, method: str, path: str, resp: http.client.HTTPResponse, data: bytes) -> None:
        """A redirect, a refusal for want of credentials, or a compressed answer: one UsageError line saying so
        (not "model not ready", not a shape to probe). optkit follows no redirect (it would leave the address
        the user gave, possibly for another host) and asks for no compression."""
        status, what = resp.status, f"{method} {path}"
        server = self.where.server
        if 300 <= status < 400:
            to = resp.getheader("Location")
            to = f" to {printable(redact_url(to))[:200]}" if to else ""
            raise UsageError(f"{server} redirected {what} ({status}){to}: optkit follows no redirect; give the "
                             "address the model is served at in --url")
        if status in (401, 407):
            asks = resp.getheader("Proxy-Authenticate" if status == 407 else "WWW-Authenticate")
            asks = f" ({printable(asks)[:80]})" if asks else ""
            hint = ("the user and password in --url were sent and not accepted" if self.where.auth else
                    "put user:password@ before the host in --url (HTTP basic auth)")
            raise UsageError(f"{server} refused {what} with {status}: it asks for credentials{asks}; {hint}")
        if status == 403:
            raise UsageError(f"{server} refused {what} with 403 Forbidden{_said(data)}: this client may not use "
                             f"it{' with the credentials in --url' if self.where.auth else ''}")
        coding = (resp.getheader("Content-Encoding") or "identity").strip().lower()
        if coding != "identity" and data:
            raise UsageError(f"{server} answered {what} with Content-Encoding {printable(coding)[:40]!r}, which "
                             "optkit did not ask for (it sends no Accept-Encoding): is it a KServe v2 server?")

    def _late(self, what: str, wait: float, deadline: float) -> str:
        if deadline >= self.deadline and self.deadline_s is not None:
            return (f"{self.where.server} did not answer {what} before the bench's deadline ({self.deadline_s:g} s "
                    "for all its requests, from --warmup, --runs or --duration and --concurrency)")
        return f"{self.where.server} did not answer {what} within {wait:g} s"

    def _read(self, resp: http.client.HTTPResponse, path: str) -> bytes:
        """The whole body, at most MAX_RESPONSE_BYTES (a larger Content-Length is refused before reading)."""
        if resp.length is not None and resp.length <= MAX_RESPONSE_BYTES:
            return resp.read()
        chunks, size = [], 0
        while size <= MAX_RESPONSE_BYTES and resp.length is None:
            chunk = resp.read(READ_CHUNK)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            chunks.append(chunk)
        raise UsageError(f"{self.where.server}{path} answered more than {MAX_RESPONSE_BYTES:,} bytes")

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
        if status == 200:
            self.server_meta = _parse(ServerMetadata, body, f"{w.server}'s answer to GET {w.prefix}/v2").model_dump()
        status, _, body = self.request("GET", f"{w.model_path}/ready", timeout=self.check_timeout)
        if status != 200:
            if status == 404 and not _is_json(body):
                raise UsageError(f"{w.server} is not a KServe v2 server: GET {w.model_path}/ready answered 404"
                                 f"{_said(body)}")
            raise UsageError(f"model {w.name!r} at {w.server} is not ready (GET {w.model_path}/ready answered "
                             f"{status}{_said(body)}{server_ready}): check the name, wait for it to load, or read "
                             "the server's log")
        status, _, body = self.request("GET", w.model_path, timeout=self.check_timeout)
        if status != 200:
            raise UsageError(f"{w.server} is not a KServe v2 server: GET {w.model_path} did not answer v2 model "
                             f"metadata (a JSON object with inputs and outputs; it answered {status}{_said(body)})")
        self.meta = _parse(ModelMetadata, body, f"{w.server}'s answer to GET {w.model_path}")
        self._check_metadata(self.meta)
        self.inputs = [_spec(t) for t in self.meta.inputs]
        self.outputs = [_spec(t) for t in self.meta.outputs]
        if self.binary is None:
            self.binary = "binary_tensor_data" in (self.server_meta.get("extensions") or [])

    def _check_metadata(self, meta: ModelMetadata) -> None:
        w = self.where
        if not meta.inputs:
            raise UsageError(f"model {w.name!r} at {w.server} declares no inputs; optkit has nothing to send it")
        for kind, tensors in (("input", meta.inputs), ("output", meta.outputs)):
            names = [t.name for t in tensors]
            twice = next((n for n in names if names.count(n) > 1), None)
            if twice is not None:
                raise UsageError(f"model {w.name!r} at {w.server} declares {kind} {printable(twice)!r} twice")
        for t in meta.inputs:
            if t.datatype == "BF16":
                raise UsageError(f"input {printable(t.name)!r} of {w.name!r} is BF16, which optkit cannot send over "
                                 "v2 HTTP yet")
            elements = math.prod(max(d, 1) for d in t.shape)
            if elements > MAX_ELEMENTS:
                raise UsageError(f"input {printable(t.name)!r} of {w.name!r} is declared {format_shape(t.shape)}: "
                                 f"{elements:,} values, more than optkit sends ({MAX_ELEMENTS:,})")

    def describe(self) -> dict[str, Any]:
        """What the report says about the server and the protocol."""
        return {"url": redact_url(self.where.url), "model": self.where.name, "version": self.where.version,
                "server": self.server_meta.get("name"), "server_version": self.server_meta.get("version"),
                "protocol": "kserve-v2 http, " + ("binary tensors" if self.binary else "json tensors")}

    # ------------------------------------------------------------------ inference
    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        body, headers, batch = self._encoded(feeds)
        status, resp, data = self.request("POST", f"{self.where.model_path}/infer", body, headers)
        if status != 200:
            raise UsageError(f"{self.where.server} answered {status} to an inference request of "
                             f"{self.where.name!r}{_said(data)}", details={"status": status})
        return self._decode(resp, data, batch)

    def _encoded(self, feeds: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str], int | None]:
        cached = self._body
        if cached is not None and cached[0] is feeds and all(a is b for a, b in zip(cached[1], feeds.values())):
            return cached[2], cached[3], cached[4]
        arrays = {name: np.asarray(value) for name, value in feeds.items()}
        values = sum(a.size for a in arrays.values())
        most = MAX_ELEMENTS if self.binary else MAX_JSON_VALUES
        if values > most:
            raise UsageError(f"the inputs hold {values:,} values, more than optkit sends "
                             f"{'in one request' if self.binary else 'as JSON tensors'} ({most:,}): give a smaller "
                             "--batch or --shape")
        tensors, raw = [], []
        for name, arr in arrays.items():
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
        batch = self._batch(arrays)
        self._body = (feeds, list(feeds.values()), body, headers, batch)
        return body, headers, batch

    def _batch(self, arrays: dict[str, np.ndarray]) -> int | None:
        """The request's batch where the metadata shows one: every input's first dim dynamic (-1, as a batching
        server declares it) and all sent with the same first dim."""
        if self.meta is None or not all(t.shape and t.shape[0] == -1 for t in self.meta.inputs):
            return None
        firsts = {a.shape[0] for a in arrays.values() if a.ndim}
        return firsts.pop() if len(firsts) == 1 else None

    def _decode(self, resp: http.client.HTTPResponse, data: bytes, batch: int | None = None) -> list[np.ndarray]:
        where = f"{self.where.server}'s answer to POST {self.where.model_path}/infer"
        size = resp.getheader("Inference-Header-Content-Length")
        head_len = len(data)
        if size is not None:
            if not (size.strip().isdigit() and int(size) <= len(data)):
                raise UsageError(f"{where}: Inference-Header-Content-Length {printable(size)[:40]!r} is not a "
                                 f"number of bytes from 0 to the {len(data):,} it sent")
            head_len = int(size)
        reply = _parse(InferResponse, data[:head_len], where)
        offset, got = head_len, {}
        for i, t in enumerate(reply.outputs):
            if t.name in got:
                raise self._wrong(t.name, "came back twice")
            params = t.parameters.binary_data_size if t.parameters else None
            if params is not None:
                arr, offset = self._binary(t, data, offset, params)
            else:
                arr = _values(t, f"{where}: outputs.{i}.data")
            count = math.prod(t.shape)
            if arr.size != count:
                raise self._wrong(t.name, f"has {arr.size:,} values for its shape {format_shape(t.shape)}")
            got[t.name] = (t, arr.reshape(t.shape))
        if offset != len(data):
            raise self._wrong(None, f"{len(data) - offset:,} bytes follow the outputs' binary data "
                                    "(binary_data_size does not add up)")
        self._check_answer({n: t for n, (t, _) in got.items()}, batch)
        if self.meta is not None and self.meta.outputs:
            return [got[t.name][1] for t in self.meta.outputs]
        return [arr for _, arr in got.values()]

    def _binary(self, t: OutputTensor, data: bytes, offset: int, size: int) -> tuple[np.ndarray, int]:
        if t.datatype in ("BYTES", "BF16"):
            dtype = np.dtype("<u2") if t.datatype == "BF16" else None
        else:
            dtype = np.dtype(V2_DTYPES[t.datatype]).newbyteorder("<")
        if dtype is None or size != math.prod(t.shape) * dtype.itemsize:
            raise self._wrong(t.name, f"is {size:,} bytes of binary data for {t.datatype} {format_shape(t.shape)}")
        if offset + size > len(data):
            raise self._wrong(t.name, f"is cut short: {size:,} bytes of binary data declared, "
                                      f"{max(len(data) - offset, 0):,} sent")
        return np.frombuffer(data, dtype=dtype, count=math.prod(t.shape), offset=offset), offset + size

    def _check_answer(self, got: dict[str, OutputTensor], batch: int | None) -> None:
        """The answer against the model's metadata: every declared output once, nothing else, its datatype,
        rank and static dims, and a batch dim (dynamic first dims) equal to the request's."""
        if not got:
            raise self._wrong(None, "holds no output")
        signature = (batch, *((n, t.datatype, *t.shape) for n, t in got.items()))
        if signature in self._accepted:   # the timed loops get the same answer each call: checked once
            return
        declared = {t.name: t for t in self.meta.outputs} if self.meta is not None else {}
        if not declared:
            return
        extra = next((n for n in got if n not in declared), None)
        if extra is not None:
            raise self._wrong(extra, "is not an output the model declares "
                                     f"({', '.join(printable(n) for n in declared)})")
        for name, want in declared.items():
            t = got.get(name)
            if t is None:
                raise self._wrong(name, "is missing")
            if t.datatype != want.datatype:
                raise self._wrong(name, f"came back {t.datatype}; the model declares {want.datatype}")
            if len(t.shape) != len(want.shape) or any(w > 0 and d != w for d, w in zip(t.shape, want.shape)):
                raise self._wrong(name, f"came back with shape {format_shape(t.shape)}; the model declares "
                                        f"{format_shape(want.shape)}")
            if batch is not None and want.shape and want.shape[0] == -1 and t.shape[0] != batch:
                raise self._wrong(name, f"came back with batch {t.shape[0]} (shape {format_shape(t.shape)}) for "
                                        f"a request of batch {batch}")
        if len(self._accepted) < 64:
            self._accepted.add(signature)

    def _wrong(self, output: str | None, what: str) -> PassError:
        subject = f"output {printable(output)[:200]!r}" if output is not None else "the answer"
        return PassError(f"{self.where.server}'s answer for {self.where.name!r}: {subject} {what}: the served "
                         "model does not answer as its metadata declares")


def _spec(t: TensorMetadata) -> TensorSpec:
    shape = [d if d > 0 else None for d in t.shape]
    return TensorSpec(t.name, shape, V2_DTYPES.get(t.datatype, t.datatype))


# JSON data of each datatype: the kinds of numpy array it may read as (np.array of the data, unconverted)
_KINDS = {"BOOL": "b", "BYTES": "U", "FP16": "fiu", "FP32": "fiu", "FP64": "fiu", "BF16": "fiu"}


def _values(t: OutputTensor, where: str) -> np.ndarray:
    """An output's JSON data (flat, or nested row-major lists) as an array of its datatype; data that is not of
    that type (strings, null, objects for a number; ragged lists; a number out of an integer type's range) is a
    UsageError naming the key."""
    if t.data is None:
        raise UsageError(f"{where}: missing (no data and no binary_data_size); it is not a KServe v2 answer")
    try:
        arr = np.array(t.data)
    except (ValueError, RecursionError):
        raise UsageError(f"{where}: ragged lists; it is not a KServe v2 answer") from None
    kinds = _KINDS.get(t.datatype, "iu")
    ok = arr.size == 0 or arr.dtype.kind in kinds
    if ok and arr.size and t.datatype in V2_DTYPES and kinds == "iu":
        info = np.iinfo(V2_DTYPES[t.datatype])
        ok = info.min <= arr.min() and arr.max() <= info.max
    if not ok:
        raise UsageError(f"{where}: not {t.datatype} values (read as {arr.dtype}); it is not a KServe v2 answer")
    if t.datatype == "BYTES":
        return arr.astype(object).ravel()
    return arr.astype(V2_DTYPES.get(t.datatype, "float32")).ravel()


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
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
        return f": {printable(text[:400])}"
    if text is None:
        try:
            text = body[:200].decode("utf-8")
        except UnicodeDecodeError as e:
            if e.start < min(len(body), 200) - 3:   # not a character cut at the excerpt's end
                return f": {len(body):,} bytes that are not UTF-8 text"
            text = body[:e.start].decode("utf-8")
        if "<" in text and re.search(r"<(!doctype|html|head|body)", text, re.I):
            return ": an HTML page"
    text = " ".join(text.split())[:200]
    return f": {printable(text)}" if text else ""
