"""A small HTTP/1.1 server on asyncio: just what the sandbox server needs.

Why not aiohttp: importing it costs ~120 ms (its client half comes along), and every sandbox
start pays that — a third of a cold start. Why not h11 (which it used): its events, state machine
and header validation cost every call 60-90 us of the server's CPU, about as much as the rest
of the HTTP layer, the dispatch and a bash call's validation and answer together
(``benchmarks/sandbox_http.py``); in a whole isolated call on a loaded host, 0.15-0.2 ms of the
server's CPU and 0.2-0.5 ms of the call's time (``benchmarks/tool_call.py``'s breakdown).
Requests are parsed strictly (``request_head.py``: chunked bodies, keep-alive, pipelining);
answers are written in one piece. This module adds routing, bounded request bodies (413), JSON
errors for anything that goes wrong, and an aiohttp-like ``cleanup_ctx`` life cycle.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import parse_qsl

from .errors import ApiError, NotFound, PayloadTooLarge, render
from .request_head import HEAD_LIMIT, MalformedRequest, RequestHead, chunk_size, head_end, parse_head, trailers_end
from .settings import DEFAULT_HEADER_TIMEOUT

log = logging.getLogger("sandbox_server.http")

READ_CHUNK = 1 << 20
SERVER_HEADER = "idegym-sandbox"


class AppKey:
    """A typed key for values stored on the app (``app[KEY]``)."""

    def __init__(self, name: str, kind: Any = None) -> None:
        self.name = name
        self.kind = kind

    def __repr__(self) -> str:
        return f"AppKey({self.name!r})"


class Request:
    __slots__ = ("method", "path", "query_string", "headers", "body", "app", "match_info")

    def __init__(self, method: str, target: str, headers: dict[str, str], body: bytes, app: App) -> None:
        self.method = method
        self.path, _, self.query_string = target.partition("?")
        self.headers = headers
        self.body = body
        self.app = app
        self.match_info: dict[str, str] = {}

    @property
    def query(self) -> dict[str, str]:
        return dict(parse_qsl(self.query_string, keep_blank_values=True))

    async def read(self) -> bytes:
        return self.body


class Response:
    __slots__ = ("status", "body", "headers", "content_type")

    def __init__(self, body: bytes | str = b"", status: int = 200, content_type: str = "application/json",
                 headers: dict[str, str] | None = None) -> None:
        self.body = body.encode() if isinstance(body, str) else body
        self.status = status
        self.content_type = content_type
        self.headers = headers or {}


def json_response(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data).encode(), status=status)


Handler = Callable[[Request], Awaitable[Response]]
ErrorHandler = Callable[[Request, BaseException], Response]


class App:
    """Routes, shared state (``app[KEY]``), an error handler and life-cycle contexts."""

    def __init__(self, client_max_size: int, on_error: ErrorHandler) -> None:
        self.client_max_size = client_max_size
        self.on_error = on_error
        self.cleanup_ctx: list[Callable[[App], AsyncIterator[None]]] = []
        self._routes: dict[str, dict[str, Handler]] = {}
        self._state: dict[Any, Any] = {}

    def __setitem__(self, key: Any, value: Any) -> None:
        self._state[key] = value

    def __getitem__(self, key: Any) -> Any:
        return self._state[key]

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        self._routes.setdefault(path, {})[method.upper()] = handler

    def add_get(self, path: str, handler: Handler) -> None:
        self.add_route("GET", path, handler)

    async def dispatch(self, request: Request) -> Response:
        started = time.perf_counter()
        response: Response
        try:
            methods = self._routes.get(request.path)
            if methods is None:
                raise NotFound(f"{request.method} {request.path}: no such endpoint; GET /openapi.json lists them")
            handler = methods.get(request.method) or (methods.get("GET") if request.method == "HEAD" else None)
            if handler is None:
                raise ApiError.for_status(
                    405, f"{request.method} {request.path}: method not allowed; use {', '.join(methods)}")
            response = await handler(request)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a JSON answer
            response = self.on_error(request, exc)
        if log.isEnabledFor(logging.INFO):
            log.info("request", extra={"method": request.method, "path": request.path, "status": response.status,
                                       "ms": round((time.perf_counter() - started) * 1000, 2)})
        return response


class _Connection(asyncio.Protocol):
    """One client connection: requests parsed as they arrive (``request_head.py``), answers
    written in one piece, one request at a time (pipelined ones wait in the buffer).

    A protocol whose bytes go straight into the one buffer the parser reads, not a stream
    reader's buffer and then a copy into it: ~15 us less of the server's CPU a call."""

    def __init__(self, app: App, header_timeout: float, on_serving: Callable[[asyncio.Task], None] | None = None,
                 greeting: bytes = b"") -> None:
        self.app = app
        # A request's head must be complete this many seconds after the connection opens, or after
        # the first byte of a later request: slow-header connections are closed. An idle kept-alive
        # connection between requests is not timed (the control plane's pool keeps them).
        self.header_timeout = header_timeout
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self._on_serving = on_serving
        self._greeting = greeting
        self._waiter: asyncio.Future[None] | None = None  # the serving task, waiting for bytes
        self._drained: asyncio.Future[None] | None = None  # the serving task, waiting for room to write
        self._ended = False  # the client closed its end, or the connection is gone
        self._lost: BaseException | None = None
        self._reading_paused = False

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream's (uvloop's are no subclass)
        if self._greeting:
            self.transport.write(self._greeting)
        task = asyncio.ensure_future(self.serve())
        if self._on_serving is not None:
            self._on_serving(task)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self._waiter is not None:
            self._wake(self._waiter)
        elif len(self.buf) > 2 * READ_CHUNK and self.transport is not None:
            # a client that sends on while its request is handled waits: the buffer stays bounded
            self.transport.pause_reading()
            self._reading_paused = True

    def eof_received(self) -> bool:
        self._ended = True
        if self._waiter is not None:
            self._wake(self._waiter)
        return True  # the answer under way may still be written

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended = True
        self._lost = exc or ConnectionResetError("the connection is closed")
        for waiter in (self._waiter, self._drained):
            if waiter is not None:
                self._wake(waiter)
        self._drained = None

    def pause_writing(self) -> None:
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None:
            self._wake(self._drained)
            self._drained = None

    @staticmethod
    def _wake(waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_result(None)

    # -- reading ----------------------------------------------------------------------------------

    async def _fill(self, deadline: float | None = None) -> bool:
        """More of what the client sent into the buffer (by ``deadline``, loop time, else
        ``TimeoutError``); False once it closed its end."""
        if self._ended:
            return False
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        timer = None if deadline is None else loop.call_at(deadline, waiter.cancel)
        had = len(self.buf)
        try:
            await waiter
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if timer is None or (task is not None and task.cancelling()):
                raise
            raise TimeoutError from None  # the timer cancelled the wait, not someone the task
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        return len(self.buf) > had  # bytes that came with the end are still read

    async def _next_head(self, timed: bool) -> RequestHead | None:
        """The next request's head, within ``header_timeout`` of now (``timed``) or of the
        request's first byte; None when the client closed its end first. Raises ``TimeoutError``
        past it, ``MalformedRequest`` for what is no request."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.header_timeout if timed or self.buf else None
        while True:
            blank = _BLANK_LINES.match(self.buf)  # empty lines before a request are ignored
            if blank is not None and blank.end():
                del self.buf[:blank.end()]
            end = head_end(self.buf)
            if (end[0] if end is not None else len(self.buf)) > HEAD_LIMIT:
                raise MalformedRequest(f"the request head is over {HEAD_LIMIT} bytes", 431)
            if end is not None:
                head = bytes(self.buf[:end[0]])
                del self.buf[:end[1]]
                return parse_head(head)
            if not await self._fill(deadline):
                return None
            if deadline is None:
                deadline = loop.time() + self.header_timeout

    async def _read_body(self, head: RequestHead) -> bytes | None:
        """The body ``head`` announces, whole; None when the client went, or it is over the
        limit (then answered 413)."""
        limit = self.app.client_max_size
        if head.length is not None:
            if head.length > limit:
                await self._too_large(head.length)
                return None
            while len(self.buf) < head.length:
                if not await self._fill():
                    return None
            return self._take(0, head.length, head.length)
        chunks: list[bytes] = []
        size = at = 0  # the body's bytes so far; where the next chunk's size line begins
        while True:
            parsed = chunk_size(self.buf, at)
            if parsed is not None:
                length, data = parsed
                if size + length > limit:
                    await self._too_large(size + length)
                    return None
                if length == 0:
                    end = trailers_end(self.buf, data)
                    if end is not None:
                        del self.buf[:end]
                        return b"".join(chunks)
                elif len(self.buf) >= data + length + 2:
                    if self.buf[data + length:data + length + 2] != b"\r\n":
                        raise MalformedRequest("a chunk's data is not followed by CRLF")
                    with memoryview(self.buf) as view:
                        chunks.append(bytes(view[data:data + length]))
                    size += length
                    at = data + length + 2
                    continue
            del self.buf[:at]  # what was parsed goes only before a read: many small chunks are no quadratic work
            at = 0
            if not await self._fill():
                return None

    def _take(self, start: int, end: int, drop: int) -> bytes:
        """``buf[start:end]`` (one copy: a body may be 256 MiB), with the first ``drop`` bytes gone after."""
        with memoryview(self.buf) as view:
            taken = bytes(view[start:end])
        del self.buf[:drop]
        return taken

    async def serve(self) -> None:
        first = True
        try:
            while True:
                try:
                    head = await self._next_head(first)
                    first = False
                    if head is None:
                        return
                    body = await self._read_body(head)
                except TimeoutError:
                    log.info("closed a connection whose request head took over %g s", self.header_timeout)
                    return
                except MalformedRequest as exc:
                    await self._fail(exc)
                    return
                if body is None:
                    return
                request = Request(head.method, head.target, head.headers, body, self.app)
                response = await self.app.dispatch(request)
                if await self._send(response, head=request.method == "HEAD", close=not head.keep_alive):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            if self.transport is not None:
                self.transport.close()

    async def _too_large(self, size: int) -> None:
        limit = self.app.client_max_size
        await self._fail(PayloadTooLarge(
            f"request body of {size} bytes is over the limit of {limit} bytes; send smaller chunks"))

    async def _fail(self, error: ApiError) -> None:
        await self._send(Response(render(error), status=error.status), close=True)

    async def _send(self, response: Response, head: bool = False, close: bool = False) -> bool:
        """The answer in one write; a handler's header that cannot be sent makes it a 500. True
        when the connection closes after it."""
        bad = _unsendable(response)
        if bad:
            log.error("an answer's %s cannot be sent; answering 500", bad)
            response, close = Response(render(ApiError(f"the server made an answer it cannot send ({bad})")),
                                       status=500), True
        lines = [_STATUS_LINES.get(response.status) or f"HTTP/1.1 {response.status} \r\n",
                 f"content-type: {response.content_type}\r\ncontent-length: {len(response.body)}\r\n"
                 f"server: {SERVER_HEADER}\r\n"]
        lines += [f"{name}: {value}\r\n" for name, value in response.headers.items()]
        if close:
            lines.append("connection: close\r\n")
        lines.append("\r\n")
        data = "".join(lines).encode("latin-1")
        if self._lost is not None or self.transport is None:
            raise ConnectionResetError("the connection is closed")
        self.transport.write(data + response.body if response.body and not head else data)
        while self._drained is not None:  # the client reads slower than we write: wait for room
            await self._drained
        if self._lost is not None:
            raise ConnectionResetError("the connection is closed")
        return close


_BLANK_LINES = re.compile(rb"[\r\n]*")
_STATUS_LINES = {int(s): f"HTTP/1.1 {int(s)} {s.phrase}\r\n" for s in HTTPStatus}
_FIELD_NAME = re.compile(r"[-!#$%&'*+.^_`|~0-9A-Za-z]+")  # RFC 9110's token
# No control character but a tab, nothing Latin-1 cannot encode (what a head is written in).
_FIELD_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f\u0100-\U0010ffff]*")
_FRAMING = frozenset({"content-length", "transfer-encoding", "connection", "content-type", "server"})


def _unsendable(response: Response) -> str:
    """What of an answer's head cannot be sent (a control character, a name that is no token, a
    framing header a handler must not set), or ""."""
    if not 100 <= response.status <= 999:
        return f"status {response.status}"
    if not _FIELD_VALUE.fullmatch(response.content_type):
        return f"content type {response.content_type!r}"
    for name, value in response.headers.items():
        if not _FIELD_NAME.fullmatch(name) or not _FIELD_VALUE.fullmatch(value) or name.lower() in _FRAMING:
            return f"header {name!r}: {value!r}"
    return ""


async def connect_unix(app: App, path: str, greeting: bytes,
                       header_timeout: float = DEFAULT_HEADER_TIMEOUT) -> tuple[asyncio.BaseTransport, asyncio.Task]:
    """Connect to the socket at ``path``, write ``greeting``, then serve ``app`` on that
    connection; its transport (to close it) and the task serving it."""
    served: list[asyncio.Task] = []
    transport, _ = await asyncio.get_running_loop().create_unix_connection(
        lambda: _Connection(app, header_timeout, served.append, greeting), path)
    return transport, served[0]


class Server:
    """Serve an ``App`` on TCP or a Unix socket; ``start()`` runs the cleanup contexts' set-up."""

    def __init__(self, app: App, header_timeout: float = DEFAULT_HEADER_TIMEOUT) -> None:
        self.app = app
        self.header_timeout = header_timeout
        self._server: asyncio.Server | None = None
        self._contexts: list[AsyncIterator[None]] = []
        self._connections: set[asyncio.Task] = set()

    async def start(self, *, host: str | None = None, port: int = 0, unix_socket: str | None = None) -> None:
        for factory in self.app.cleanup_ctx:
            context = factory(self.app)
            await context.__anext__()
            self._contexts.append(context)
        loop = asyncio.get_running_loop()
        if unix_socket is not None:
            if os.path.exists(unix_socket):
                os.unlink(unix_socket)
            self._server = await loop.create_unix_server(self._connection, path=unix_socket)
        else:
            self._server = await loop.create_server(self._connection, host, port, reuse_address=True)

    def _connection(self) -> _Connection:
        return _Connection(self.app, self.header_timeout, self._serving)

    def _serving(self, task: asyncio.Task) -> None:
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    @property
    def address(self) -> str:
        """Where it listens: ``http://host:port`` (the port chosen when 0 was asked) or the socket path."""
        assert self._server is not None, "not started"
        name = self._server.sockets[0].getsockname()
        if isinstance(name, str):
            return name
        host = f"[{name[0]}]" if ":" in name[0] else name[0]
        return f"http://{host}:{name[1]}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._connections):
            task.cancel()
        for context in reversed(self._contexts):
            try:
                await context.__anext__()
            except StopAsyncIteration:
                pass
