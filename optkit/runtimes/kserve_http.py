"""HTTP to a KServe v2 server (standard library http.client): where a model is served (`ServedModel`, from its
URL), and `V2Connections`, idle keep-alive connections whose every request (connect, send, every byte of the
answer) runs against a deadline; a server that cannot be reached, refuses, redirects, asks for credentials or is
too slow is one UsageError line."""
from __future__ import annotations

import base64
import http.client
import io
import json
import math
import re
import threading
import time
from typing import Any
from urllib.parse import unquote, urlsplit

from optkit.core.errors import UsageError
from optkit.core.text import first_line, printable, redact_url

CONNECT_TIMEOUT_S = 3.0     # an unreachable host fails fast
CHECK_TIMEOUT_S = 10.0      # each request of the checks before timing (health, readiness, metadata), whole
REQUEST_TIMEOUT_S = 60.0    # one inference, whole
MAX_RESPONSE_BYTES = 1 << 30
READ_CHUNK = 1 << 20

_URL = re.compile(r"^(?P<prefix>(?:/[^/]+)*?)/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/?$")


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
        """The server's address as every message shows it (an IPv6 host in brackets, as a URL writes it)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.https else 'http'}://{host}:{self.port}{self.prefix}"


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


class V2Connections:
    """Keep-alive connections to one served model (`where`): one per request in flight, opened on demand or
    ahead (`connections(n)`), each request bounded by its timeout and by `deadline` (all requests together)."""

    def __init__(self, url: str, *, connect_timeout: float = CONNECT_TIMEOUT_S,
                 check_timeout: float = CHECK_TIMEOUT_S, timeout: float = REQUEST_TIMEOUT_S,
                 deadline: float = math.inf, deadline_s: float | None = None):
        self.where = ServedModel(url)
        self.connect_timeout, self.check_timeout, self.timeout = connect_timeout, check_timeout, timeout
        self.deadline, self.deadline_s = deadline, deadline_s   # all requests together (monotonic), its length
        self._idle: list[_HTTP] = []   # list.pop / append are atomic under the GIL
        self._connections: list[_HTTP] = []
        self._lock = threading.Lock()

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
            raise UsageError(f"{server} refused {what} with 403 Forbidden{said(data)}: this client may not use "
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


def json_or_none(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def is_json(body: bytes) -> bool:
    return json_or_none(body) is not None


def said(body: bytes) -> str:
    """': <the server's error>' from a v2 error body ({"error": ...}), else a short printable excerpt."""
    reply = json_or_none(body)
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
