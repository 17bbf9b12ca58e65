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

import http.client
import math
from typing import Any

import numpy as np

from optkit.core import strictjson
from optkit.core.errors import PassError, UsageError
from optkit.core.shapes import MAX_ELEMENTS, TensorSpec, format_shape
from optkit.core.text import printable, redact_url
from optkit.runtimes.base import Session
from optkit.runtimes.kserve_answers import (
    MAX_JSON_VALUES,
    NUMPY_TO_V2,
    V2_DTYPES,
    InferResponse,
    ModelMetadata,
    OutputTensor,
    ServerMetadata,
    json_values,
    parse,
    tensor_spec,
)
from optkit.runtimes.kserve_http import (
    CHECK_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    ServedModel,
    V2Connections,
    is_json,
    said,
)

__all__ = ["CHECK_TIMEOUT_S", "CONNECT_TIMEOUT_S", "REQUEST_TIMEOUT_S", "ModelMetadata", "RemoteSession",
           "ServedModel"]


class RemoteSession(V2Connections, Session):
    """A served model behind the KServe v2 HTTP protocol. `open_url()` checks, quickly and before any timing, that
    the server answers, speaks v2, serves the model and has it ready; each failure is one UsageError line. Its
    requests go over V2Connections (optkit.runtimes.kserve_http); the answers are read by the schemas of
    optkit.runtimes.kserve_answers."""

    runtime = "kserve-v2"
    provider = "http"

    def __init__(self, url: str, *, connect_timeout: float = CONNECT_TIMEOUT_S,
                 check_timeout: float = CHECK_TIMEOUT_S, timeout: float = REQUEST_TIMEOUT_S,
                 binary: bool | None = None, deadline: float = math.inf, deadline_s: float | None = None):
        super().__init__(url, connect_timeout=connect_timeout, check_timeout=check_timeout, timeout=timeout,
                         deadline=deadline, deadline_s=deadline_s)
        self._body: tuple | None = None   # (feeds, their arrays, body, headers, batch)
        self.binary = binary
        self.server_meta: dict[str, Any] = {}
        self.meta: ModelMetadata | None = None
        self._accepted: set[tuple] = set()   # signatures of answers that matched the metadata
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []

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
        if status == 404 or status >= 500 and not is_json(body):
            raise UsageError(f"{w.server} is not a KServe v2 server: GET /v2/health/ready answered {status}"
                             f"{said(body)}")
        # a server is ready only when all its models are (Triton's strict readiness): the named model decides
        server_ready = "" if status == 200 else f"; nor is the server (GET /v2/health/ready answered {status})"
        status, _, body = self.request("GET", f"{w.prefix}/v2", timeout=self.check_timeout)
        if status == 200:
            self.server_meta = parse(ServerMetadata, body, f"{w.server}'s answer to GET {w.prefix}/v2").model_dump()
        status, _, body = self.request("GET", f"{w.model_path}/ready", timeout=self.check_timeout)
        if status != 200:
            if status == 404 and not is_json(body):
                raise UsageError(f"{w.server} is not a KServe v2 server: GET {w.model_path}/ready answered 404"
                                 f"{said(body)}")
            raise UsageError(f"model {w.name!r} at {w.server} is not ready (GET {w.model_path}/ready answered "
                             f"{status}{said(body)}{server_ready}): check the name, wait for it to load, or read "
                             "the server's log")
        status, _, body = self.request("GET", w.model_path, timeout=self.check_timeout)
        if status != 200:
            raise UsageError(f"{w.server} is not a KServe v2 server: GET {w.model_path} did not answer v2 model "
                             f"metadata (a JSON object with inputs and outputs; it answered {status}{said(body)})")
        self.meta = parse(ModelMetadata, body, f"{w.server}'s answer to GET {w.model_path}")
        self._check_metadata(self.meta)
        self.inputs = [tensor_spec(t) for t in self.meta.inputs]
        self.outputs = [tensor_spec(t) for t in self.meta.outputs]
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
                             f"{self.where.name!r}{said(data)}", details={"status": status})
        return self._decode(resp, data, batch)

    def request_bytes(self, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
        """What one inference request of `feeds` sends: the body's bytes (JSON header and tensors as this session
        encodes them) and the tensors' own bytes."""
        body, _, _ = self._encoded(feeds)
        return {"body_bytes": len(body), "tensor_bytes": int(sum(np.asarray(v).nbytes for v in feeds.values())),
                "encoding": "binary tensors" if self.binary else "json tensors"}

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
                if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                    raise UsageError(f"input {name!r} holds NaN or infinite values, which a JSON tensor cannot carry "
                                     "(JSON has no such numbers): send it binary (--binary) or give finite data")
                t["data"] = [str(x) for x in arr.ravel()] if dtype == "BYTES" else arr.ravel().tolist()
            tensors.append(t)
        request: dict[str, Any] = {"inputs": tensors}
        wanted = [{"name": s.name, "parameters": {"binary_data": True}} for s in self.outputs if s.dtype != "string"]
        if self.binary and wanted:
            request["outputs"] = wanted + [{"name": s.name} for s in self.outputs if s.dtype == "string"]
        head = strictjson.dumps(request, separators=(",", ":")).encode()
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
        reply = parse(InferResponse, data[:head_len], where)
        offset, got = head_len, {}
        for i, t in enumerate(reply.outputs):
            if t.name in got:
                raise self._wrong(t.name, "came back twice")
            params = t.parameters.binary_data_size if t.parameters else None
            if params is not None:
                arr, offset = self._binary(t, data, offset, params)
            else:
                arr = json_values(t, f"{where}: outputs.{i}.data")
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

