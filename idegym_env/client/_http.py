"""The synchronous client's HTTP/1.1 session: connections of its own, kept alive in a pool.

httpx spends about 0.5 ms a request in its own layers (URL parsing and merging, header models,
httpcore's pool and h11's state machine, measured: ``benchmarks/tool_call.py``, the rows "control
plane via httpx" against "control plane, Prefer: wait"), a fifth of an isolated tool call, and
``http.client`` ~50 µs (see ``ClientConnection``). Plans (``_protocol.py``) need little of it: a
method, a path below one base URL, a JSON body, a timeout, and the status, headers and body back.
Failures are ``http.client``'s exceptions. The async client's session (``_http_async.py``)
writes the same bytes and reads answers with the same parser (``read_answer``).
"""

from __future__ import annotations

import base64
import functools
import http.client
import json as jsonlib
import re
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import IO, Any, NamedTuple
from urllib.parse import urlencode, urlsplit

CONNECT_TIMEOUT = 10.0
MAX_IDLE = 32
#: How long a connection may idle and still be reused when its server does not say (``Keep-Alive:
#: timeout=N``; the control plane says its header timeout, 15 s by default): a server closes the
#: ones idle past its own limit, and one reused as it closes is reset under the request
#: (``ConnectionResetError``, ``RemoteDisconnected``) with no way to tell whether the server saw it.
#: As httpx's default.
KEEPALIVE_EXPIRY = 5.0
#: Reuse a connection only this long before the limit its server says (the server's timer and our
#: checkout are not one clock, and a busy server's timer runs late or early by its loop's lag); half
#: the limit when that is shorter, so a server that says 2 s or less still has its connections reused.
KEEPALIVE_MARGIN = 2.0
_KEEP_ALIVE_TIMEOUT = re.compile(r"(?:^|[,;\s])timeout\s*=\s*(\d+)", re.IGNORECASE)


def keepalive_expiry(headers: Mapping[str, str]) -> float:
    """How long a connection that carried an answer with ``headers`` may idle and be reused."""
    said = _KEEP_ALIVE_TIMEOUT.search(headers.get("keep-alive", ""))
    if said is None:
        return KEEPALIVE_EXPIRY
    limit = int(said.group(1))
    return limit - min(KEEPALIVE_MARGIN, limit / 2)


MAX_LINE = 65536  # as http.client: a status or header line
MAX_HEADERS = 100
_UNSAFE_TARGET = re.compile(r"[\x00-\x20\x7f]")  # http.client refuses these in a request target
_UNSAFE_HEADER = re.compile(r"[\r\n\x00]")


# -- one request's bytes and its answer's parsing, shared with the async session (``_http_async.py``) --


def request_head(method: str, target: str, host: str, headers: Mapping[str, str]) -> bytes:
    """A request's head; a target or header that would break the framing is refused, never sent."""
    if _UNSAFE_TARGET.search(target):
        raise http.client.InvalidURL(f"the request target {target!r} holds a control character or a space")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Accept-Encoding: identity"]
    for name, value in headers.items():
        if _UNSAFE_HEADER.search(name) or _UNSAFE_HEADER.search(value) or ":" in name:
            raise ValueError(f"header {name!r} cannot be sent: it holds a line break, a NUL or a colon")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def with_length(method: str, headers: Mapping[str, str], body: bytes | None) -> Mapping[str, str]:
    if body is not None or method in ("POST", "PUT", "PATCH"):
        return {**headers, "Content-Length": str(len(body or b""))}
    return headers


@dataclass(frozen=True)
class Line:
    """Read a line (with its ending) of at most ``MAX_LINE`` bytes; more is ``LineTooLong``."""

    what: str  # "status line" or "header line": named in the error


@dataclass(frozen=True)
class Exactly:
    """Read ``n`` bytes (fewer only at the connection's end)."""

    n: int


@dataclass(frozen=True)
class Rest:
    """Read until the connection's end."""


Answer = tuple[int, dict[str, str], bytes, bool]
#: Reading one answer without I/O: it yields what to read and is sent the bytes read (``read_answer``).
AnswerReader = Generator["Line | Exactly | Rest", bytes, Answer]


def read_answer(method: str) -> AnswerReader:
    """One answer: status, headers (names in lower case), body, and whether the connection may
    carry another request. Every framing HTTP/1.1 allows; failures are ``http.client``'s."""
    while True:
        line = yield Line("status line")
        if not line:
            raise http.client.RemoteDisconnected("the server closed the connection without an answer")
        version, _, rest = line.decode("latin-1").rstrip("\r\n").partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit() or rest[3:4] not in ("", " "):
            raise http.client.BadStatusLine(line.decode("latin-1", errors="replace"))
        status = int(code)
        headers = yield from _read_headers()
        if not 100 <= status < 200:
            break  # an interim answer (100 Continue) is skipped, as http.client does
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    reusable = "close" not in tokens and (version != "HTTP/1.0" or "keep-alive" in tokens)
    if method == "HEAD" or status in (204, 304):
        return status, headers, b"", reusable
    coding = headers.get("transfer-encoding", "").split(",")[-1].strip().lower()
    if coding == "chunked":
        return status, headers, (yield from _read_chunked()), reusable
    if "content-length" in headers:
        length = headers["content-length"].strip()
        if not length.isdigit():
            raise http.client.HTTPException(f"invalid Content-Length {length!r}")
        body = yield Exactly(int(length))
        if len(body) < int(length):
            raise http.client.IncompleteRead(body, int(length) - len(body))
        return status, headers, body, reusable
    return status, headers, (yield Rest()), False  # delimited by the connection's end


def _read_headers() -> Generator[Line, bytes, dict[str, str]]:
    headers: dict[str, str] = {}
    name = None
    for _ in range(MAX_HEADERS + 1):
        line = yield Line("header line")
        if line in (b"\r\n", b"\n", b""):
            return headers
        text = line.decode("latin-1").rstrip("\r\n")
        if text[:1] in (" ", "\t") and name is not None:  # a folded line continues the last header
            headers[name] += " " + text.strip()
            continue
        name, colon, value = text.partition(":")
        if not colon:
            raise http.client.HTTPException(f"malformed header line {text!r}")
        name = name.strip().lower()
        headers[name] = value.strip()
    raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")


def _read_chunked() -> Generator[Line | Exactly, bytes, bytes]:
    chunks = list[bytes]()
    while True:
        line = yield Line("chunk size line")
        size = line.split(b";", 1)[0].strip()
        try:
            length = int(size, 16)
        except ValueError:
            raise http.client.IncompleteRead(b"".join(chunks)) from None
        if length == 0:
            break
        chunk = yield Exactly(length)
        if len(chunk) < length or (yield Line("chunk end")) not in (b"\r\n", b"\n"):
            raise http.client.IncompleteRead(b"".join(chunks) + chunk)
        chunks.append(chunk)
    yield from _read_headers()  # trailers, ignored
    return b"".join(chunks)


class ClientConnection:
    """One kept-alive HTTP/1.1 connection: a request written in one piece, its answer read from a
    buffered reader. ``http.client`` took ~50 µs a call more (it parses headers with the ``email``
    package) and wrote a request's head and body apart, which woke the server twice."""

    def __init__(self, connect: Callable[[], socket.socket], host: str) -> None:
        self._connect = connect
        self._host = host  # the Host header
        self.sock: socket.socket | None = None
        self._file: Any = None
        self.idle_since = 0.0  # time.monotonic() when it went back to the pool
        self.expiry = KEEPALIVE_EXPIRY  # how long it may idle (keepalive_expiry of its last answer)

    def idle_usable(self, now: float) -> bool:
        """Not idle past its expiry, and nothing arrived while idle (the server did not close it,
        nor send what nobody asked for); ``poll``, as a descriptor may be past select's 1024."""
        if self.sock is None or now - self.idle_since > self.expiry:
            return False
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return not poller.poll(0)

    def connect(self) -> None:
        self.sock = self._connect()
        self._file = self.sock.makefile("rb")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def exchange(self, method: str, target: str, headers: Mapping[str, str], body: bytes | None,
                 stream: IO[bytes] | None = None, stream_length: int = 0) -> Answer:
        """One request and its answer: status, headers (names in lower case), body, and whether
        the connection may carry another request. ``stream`` is a body sent from a file."""
        assert self.sock is not None
        if stream is not None:
            return self._exchange_streamed(method, target, headers, stream, stream_length)
        self.sock.sendall(request_head(method, target, self._host, with_length(method, headers, body)) + (body or b""))
        return self._answer(method)

    def _exchange_streamed(self, method: str, target: str, headers: Mapping[str, str], stream: IO[bytes],
                           length: int) -> Answer:
        """A body of ``length`` bytes from ``stream``; a server that answers before it has read
        it all (a 413, say) is heard, and the connection is not used again."""
        assert self.sock is not None
        head = {**headers, "Content-Length": str(length)}
        self.sock.sendall(request_head(method, target, self._host, head))
        try:
            while chunk := stream.read(1 << 20):
                self.sock.sendall(chunk)
        except OSError:
            status, got, content, _ = self._answer(method)  # its answer, if it gave one before closing
            return status, got, content, False
        return self._answer(method)

    def _answer(self, method: str) -> Answer:
        fp, reader = self._file, read_answer(method)
        step = next(reader)
        try:
            while True:
                if isinstance(step, Line):
                    data = fp.readline(MAX_LINE + 1)
                    if len(data) > MAX_LINE:
                        raise http.client.LineTooLong(step.what)
                elif isinstance(step, Exactly):
                    data = fp.read(step.n)
                else:
                    data = fp.read()
                step = reader.send(data)
        except StopIteration as done:
            answer: Answer = done.value
            return answer


class Response:
    """One answer: status, headers (names in lower case) and the whole body."""

    __slots__ = ("status_code", "headers", "content")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content


class Base(NamedTuple):
    """Where a session's requests go, from its base URL (both sessions)."""

    scheme: str
    host: str
    port: int | None
    host_header: str  # "localhost" over a Unix socket
    prefix: str  # the URL's path, before every request's

    @classmethod
    def of(cls, base_url: str, unix_socket: str | None) -> Base:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # an IPv6 address
        default = 443 if parts.scheme == "https" else 80
        header = "localhost" if unix_socket else host if parts.port in (None, default) else f"{host}:{parts.port}"
        return cls(parts.scheme, parts.hostname, parts.port, header, parts.path)


def outgoing(base: Base, headers: Mapping[str, str], path: str, params: Mapping[str, str] | None, json: Any,
             data: bytes | None, extra: Mapping[str, str] | None) -> tuple[str, dict[str, str], bytes | None]:
    """A request's target, headers (``headers``, then ``extra``) and body (``json`` encoded, or
    ``data`` as it is)."""
    target = base.prefix + path
    if params:
        target += ("&" if "?" in target else "?") + urlencode(params)
    sent = dict(headers)
    body = data  # JSON already encoded
    if json is not None:
        body = jsonlib.dumps(json, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if body is not None:
        sent["Content-Type"] = "application/json"
    if extra:
        sent.update(extra)
    return target, sent, body


class HTTPSession:
    """Requests to one base URL (or a Unix socket), over connections reused across threads."""

    def __init__(self, base_url: str, *, unix_socket: str | None = None, auth: tuple[str, str] | None = None,
                 default_timeout: float = 60.0, max_idle: int = MAX_IDLE) -> None:
        self.base_url = base_url.rstrip("/")
        self.default_timeout = default_timeout
        self._base = Base.of(self.base_url, unix_socket)
        self.unix_socket = unix_socket
        self._headers = {"Accept": "application/json", "User-Agent": "idegym-client"}
        self.authorization = basic_authorization(auth)
        if self.authorization is not None:
            self._headers["Authorization"] = self.authorization
        self._ssl: ssl.SSLContext | None = None
        self._idle: list[ClientConnection] = []
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._closed = False

    def request(self, method: str, path: str, *, json: Any = None, data: bytes | None = None,
                params: Mapping[str, str] | None = None,
                headers: Mapping[str, str] | None = None, timeout: float | None = 60.0,
                content: IO[bytes] | None = None, content_length: int = 0) -> Response:
        """Send one request and read its whole answer. Raises ``TimeoutError`` when no answer
        comes within ``timeout`` seconds (``default_timeout`` when None), ``OSError`` or
        ``http.client.HTTPException`` when the connection fails; it is then dropped, never reused."""
        target, sent, body = outgoing(self._base, self._headers, path, params, json, data, headers)
        conn = self._checkout()
        try:
            if conn.sock is None:
                conn.connect()
            assert conn.sock is not None
            conn.sock.settimeout(self.default_timeout if timeout is None else timeout)
            status, got, answer, reusable = conn.exchange(method, target, sent, body, content, content_length)
        except BaseException:
            conn.close()
            raise
        if reusable:
            conn.expiry = keepalive_expiry(got)
            self._checkin(conn)
        else:
            conn.close()
        return Response(status, got, answer)

    def _checkout(self) -> ClientConnection:
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
            now = time.monotonic()
            while self._idle:
                conn = self._idle.pop()
                if conn.idle_usable(now):
                    return conn
                conn.close()
        if self.unix_socket:
            return ClientConnection(functools.partial(_unix_socket, self.unix_socket), self._base.host_header)
        if self._base.scheme == "https" and self._ssl is None:
            self._ssl = ssl.create_default_context()
        return ClientConnection(functools.partial(_tcp_socket, self._base.host, self._base.port, self._ssl),
                           self._base.host_header)

    def _checkin(self, conn: ClientConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def basic_authorization(auth: tuple[str, str] | None) -> str | None:
    """The ``Authorization`` header of ``(user, password)``."""
    if auth is None:
        return None
    return "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode("ascii")


def _unix_socket(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock


def _tcp_socket(host: str, port: int | None, tls: ssl.SSLContext | None) -> socket.socket:
    sock = socket.create_connection((host, port or (443 if tls else 80)), timeout=CONNECT_TIMEOUT)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return tls.wrap_socket(sock, server_hostname=host) if tls is not None else sock
    except BaseException:
        sock.close()
        raise
