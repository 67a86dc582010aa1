"""The synchronous client's HTTP/1.1 session: ``http.client`` connections kept alive in a pool.

httpx spends about 0.5 ms a request in its own layers (URL parsing and merging, header models,
httpcore's pool and h11's state machine, measured: ``benchmarks/tool_call.py``, the rows "control
plane via httpx" against "control plane, Prefer: wait"), a fifth of an isolated tool call. Plans
(``_protocol.py``) need little of it: a method, a path below one base URL, a JSON body, a
timeout, and the status, headers and body back. The async client keeps httpx.
"""

from __future__ import annotations

import base64
import http.client
import json as jsonlib
import select
import socket
import ssl
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

CONNECT_TIMEOUT = 10.0
MAX_IDLE = 32


class _OneWrite:
    """A request's head and body sent in one write. ``http.client`` writes them apart, which wakes
    the server twice for one request and, over TCP, holds the body back until the head is
    acknowledged (Nagle's algorithm): ~0.2 ms of a call through the control plane."""

    _held: list[bytes] | None = None

    def send(self, data: Any) -> None:
        if self._held is not None and isinstance(data, bytes):
            self._held.append(data)
        else:
            super().send(data)  # type: ignore[misc]

    def send_request(self, method: str, target: str, body: bytes | None, headers: Mapping[str, str]) -> None:
        self._held = []
        try:
            self.request(method, target, body=body, headers=headers)  # type: ignore[attr-defined]
            data = b"".join(self._held)
        finally:
            self._held = None
        self.send(data)


class _Connection(_OneWrite, http.client.HTTPConnection):
    pass


class _TLSConnection(_OneWrite, http.client.HTTPSConnection):
    pass


class _UnixConnection(_OneWrite, http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class Response:
    """One answer: status, headers (names in lower case) and the whole body."""

    __slots__ = ("status_code", "headers", "content")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content


class HTTPSession:
    """Requests to one base URL (or a Unix socket), over connections reused across threads."""

    def __init__(self, base_url: str, *, unix_socket: str | None = None, auth: tuple[str, str] | None = None,
                 default_timeout: float = 60.0, max_idle: int = MAX_IDLE) -> None:
        self.base_url = base_url.rstrip("/")
        self.default_timeout = default_timeout
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._prefix = parts.path
        self._unix_socket = unix_socket
        self._headers = {"Accept": "application/json", "User-Agent": "idegym-client"}
        if auth is not None:
            token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode("ascii")
            self._headers["Authorization"] = f"Basic {token}"
        self._ssl: ssl.SSLContext | None = None
        self._idle: list[_Connection | _TLSConnection | _UnixConnection] = []
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._closed = False

    def request(self, method: str, path: str, *, json: Any = None, params: Mapping[str, str] | None = None,
                headers: Mapping[str, str] | None = None, timeout: float | None = 60.0) -> Response:
        """Send one request and read its whole answer. Raises ``TimeoutError`` when no answer
        comes within ``timeout`` seconds (``default_timeout`` when None), ``OSError`` or
        ``http.client.HTTPException`` when the connection fails; it is then dropped, never reused."""
        target = self._prefix + path
        if params:
            target += ("&" if "?" in target else "?") + urlencode(params)
        sent = dict(self._headers)
        body = None
        if json is not None:
            body = jsonlib.dumps(json, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
            sent["Content-Type"] = "application/json"
        if headers:
            sent.update(headers)
        conn = self._checkout()
        try:
            if conn.sock is None:
                conn.connect()
            conn.sock.settimeout(self.default_timeout if timeout is None else timeout)
            conn.send_request(method, target, body, sent)
            resp = conn.getresponse()
            content = resp.read()
        except BaseException:
            conn.close()
            raise
        answer = Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, content)
        if resp.will_close:
            conn.close()
        else:
            self._checkin(conn)
        return answer

    def _checkout(self) -> _Connection | _TLSConnection | _UnixConnection:
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
            while self._idle:
                conn = self._idle.pop()
                # Readable while idle: the server closed it (or sent what nobody asked for).
                if conn.sock is not None and not select.select([conn.sock], [], [], 0)[0]:
                    return conn
                conn.close()
        if self._unix_socket:
            return _UnixConnection(self._unix_socket, CONNECT_TIMEOUT)
        if self._scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            return _TLSConnection(self._host, self._port, timeout=CONNECT_TIMEOUT, context=self._ssl)
        return _Connection(self._host, self._port, timeout=CONNECT_TIMEOUT)

    def _checkin(self, conn: _Connection | _TLSConnection | _UnixConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
