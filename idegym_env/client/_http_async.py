"""The async client's HTTP/1.1 session: ``_http.HTTPSession`` on asyncio, the same bytes out and
the same parser (``_http.read_answer``) for what comes back.

httpx (over httpcore and anyio) spent ~0.8 ms of CPU a call where the sync session spends ~0.2:
URL and header models, anyio's cancel scopes, a head and a body written apart (two wake-ups of
the server). Here a connection is a plain ``asyncio.Protocol`` holding what arrived: a request is
one write, and an answer that has arrived whole is parsed without another wait.
"""

from __future__ import annotations

import asyncio
import http.client
import ssl
from collections.abc import Mapping
from typing import IO, Any, cast

from ._http import (
    CONNECT_TIMEOUT,
    KEEPALIVE_EXPIRY,
    MAX_IDLE,
    MAX_LINE,
    Answer,
    Base,
    Exactly,
    Line,
    Response,
    basic_authorization,
    keepalive_expiry,
    outgoing,
    read_answer,
    request_head,
    with_length,
)


class _Connection(asyncio.Protocol):
    """One kept-alive connection: what the server sent, kept until it is read."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._eof = False
        self._lost: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None  # set while the transport's buffer is full
        self.idle_since = 0.0  # the loop's time when it went back to the pool
        self.expiry = KEEPALIVE_EXPIRY  # how long it may idle (keepalive_expiry of its last answer)

    # -- asyncio's calls ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are no subclass of asyncio's

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._lost = exc
        self._wake()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- ours ---------------------------------------------------------------------------------------

    def idle_usable(self, now: float) -> bool:
        """Not idle past its expiry (``_http.keepalive_expiry``), and nothing arrived while idle (the
        server did not close it, nor send what nobody asked for)."""
        return now - self.idle_since <= self.expiry and not self._eof and not self._buffer \
            and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def write(self, data: bytes) -> None:
        assert self.transport is not None
        if self._eof:
            raise ConnectionResetError("the connection was closed")
        self.transport.write(data)
        if self._drained is not None:
            await self._drained

    async def _more(self) -> None:
        if self._eof:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def line(self, what: str) -> bytes:
        start = 0
        while (end := self._buffer.find(b"\n", start)) < 0:
            if len(self._buffer) > MAX_LINE:
                raise http.client.LineTooLong(what)
            if self._eof:
                return self._take(len(self._buffer))
            start = len(self._buffer)
            await self._more()
        if end >= MAX_LINE:
            raise http.client.LineTooLong(what)
        return self._take(end + 1)

    async def exactly(self, n: int) -> bytes:
        while len(self._buffer) < n and not self._eof:
            await self._more()
        return self._take(min(n, len(self._buffer)))

    async def rest(self) -> bytes:
        while not self._eof:
            await self._more()
        return self._take(len(self._buffer))

    def _take(self, n: int) -> bytes:
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    async def answer(self, method: str) -> Answer:
        reader = read_answer(method)
        step = next(reader)
        buffer = self._buffer
        try:
            while True:  # what has arrived is taken without a coroutine (an answer mostly arrives whole)
                if isinstance(step, Line):
                    end = buffer.find(b"\n", 0, MAX_LINE)
                    data = self._take(end + 1) if end >= 0 else await self.line(step.what)
                elif isinstance(step, Exactly):
                    data = self._take(step.n) if len(buffer) >= step.n else await self.exactly(step.n)
                else:
                    data = await self.rest()
                step = reader.send(data)
        except StopIteration as done:
            answer: Answer = done.value
            return answer


class AsyncHTTPSession:
    """Requests to one base URL (or a Unix socket), over connections reused by the calls of one
    event loop."""

    def __init__(self, base_url: str, *, unix_socket: str | None = None, auth: tuple[str, str] | None = None,
                 authorization: str | None = None, default_timeout: float = 60.0, max_idle: int = MAX_IDLE) -> None:
        """``auth`` (user, password), or the ``Authorization`` header it makes (``authorization``)."""
        self.base_url = base_url.rstrip("/")
        self.default_timeout = default_timeout
        self._base = Base.of(self.base_url, unix_socket)
        self._unix_socket = unix_socket
        self._headers = {"Accept": "application/json", "User-Agent": "idegym-client"}
        authorization = authorization or basic_authorization(auth)
        if authorization is not None:
            self._headers["Authorization"] = authorization
        self._ssl: ssl.SSLContext | None = None
        self._idle: list[_Connection] = []
        self._max_idle = max_idle
        self._closed = False

    async def request(self, method: str, path: str, *, json: Any = None, data: bytes | None = None,
                      params: Mapping[str, str] | None = None,
                      headers: Mapping[str, str] | None = None, timeout: float | None = 60.0,
                      content: IO[bytes] | None = None, content_length: int = 0) -> Response:
        """As ``HTTPSession.request``: ``TimeoutError`` when no answer comes within ``timeout``
        seconds (``default_timeout`` when None), ``OSError`` or ``http.client.HTTPException`` when
        the connection fails (it is then dropped, never reused)."""
        if self._closed:
            raise RuntimeError("the client is closed")
        target, sent, body = outgoing(self._base, self._headers, path, params, json, data, headers)
        if content is not None:
            head = request_head(method, target, self._base.host_header, {**sent, "Content-Length": str(content_length)})
        else:
            head = request_head(method, target, self._base.host_header, with_length(method, sent, body)) + (body or b"")
        conn = self._checkout()
        try:
            async with asyncio.timeout(self.default_timeout if timeout is None else timeout):
                if conn is None:
                    conn = await self._connect()
                status, got, answer, reusable = await self._exchange(conn, method, head, content)
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        if reusable and not self._closed and len(self._idle) < self._max_idle:
            conn.idle_since = asyncio.get_running_loop().time()
            conn.expiry = keepalive_expiry(got)
            self._idle.append(conn)
        else:
            conn.close()
        return Response(status, got, answer)

    @staticmethod
    async def _exchange(conn: _Connection, method: str, head: bytes, content: IO[bytes] | None) -> Answer:
        await conn.write(head)
        if content is not None:  # a body streamed from a file; a server that answers early is heard
            content.seek(0)
            try:
                while chunk := content.read(1 << 20):
                    await conn.write(chunk)
            except OSError:
                status, got, body, _ = await conn.answer(method)
                return status, got, body, False
        return await conn.answer(method)

    def _checkout(self) -> _Connection | None:
        now = asyncio.get_running_loop().time() if self._idle else 0.0
        while self._idle:
            conn = self._idle.pop()
            if conn.idle_usable(now):
                return conn
            conn.close()
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(CONNECT_TIMEOUT):
            if self._unix_socket:
                _, conn = await loop.create_unix_connection(_Connection, self._unix_socket)
            else:
                if self._base.scheme == "https" and self._ssl is None:
                    self._ssl = ssl.create_default_context()
                tls = self._ssl
                # TCP_NODELAY: asyncio's and uvloop's TCP transports set it
                _, conn = await loop.create_connection(_Connection, self._base.host,
                                                       self._base.port or (443 if tls else 80), ssl=tls)
        return conn

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Close its connections (on its event loop's thread)."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
