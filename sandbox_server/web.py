"""A small HTTP/1.1 server on asyncio and h11: just what the sandbox server needs.

Why not aiohttp: importing it costs ~120 ms (its client half comes along), and every sandbox
start pays that — a third of a cold start. h11 parses HTTP correctly (chunked bodies,
keep-alive, pipelining rules); this module adds routing, bounded request bodies (413), JSON
errors for anything that goes wrong, and an aiohttp-like ``cleanup_ctx`` life cycle.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

import h11

from .errors import ApiError, BadRequest, NotFound, PayloadTooLarge, render
from .settings import DEFAULT_HEADER_TIMEOUT

log = logging.getLogger("sandbox_server.http")

READ_CHUNK = 1 << 20
SERVER_HEADER = b"idegym-sandbox"


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


class _Connection:
    """One client connection: h11 events in, responses out, one request at a time."""

    def __init__(self, app: App, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 header_timeout: float) -> None:
        self.app = app
        self.reader = reader
        self.writer = writer
        # A request's head must be complete this many seconds after the connection opens, or after
        # the first byte of a later request: slow-header connections are closed. An idle kept-alive
        # connection between requests is not timed (the control plane's pool keeps them).
        self.header_timeout = header_timeout
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 << 10)

    async def _next_event(self) -> Any:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await self.reader.read(READ_CHUNK)
            self.conn.receive_data(data)  # b"" tells h11 the peer closed

    async def _next_head(self, timed: bool) -> Any:
        """The next request's first event, within ``header_timeout`` of now (``timed``) or of the
        request's first byte; raises ``TimeoutError`` past it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.header_timeout if timed or self.conn.trailing_data[0] else None
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            if deadline is None:
                data = await self.reader.read(READ_CHUNK)
                deadline = loop.time() + self.header_timeout
            else:
                data = await asyncio.wait_for(self.reader.read(READ_CHUNK), max(deadline - loop.time(), 0))
            self.conn.receive_data(data)

    async def serve(self) -> None:
        first = True
        try:
            while True:
                try:
                    event = await self._next_head(first)
                    first = False
                except TimeoutError:
                    log.info("closed a connection whose request head took over %g s", self.header_timeout)
                    return
                except h11.RemoteProtocolError as exc:
                    await self._fail(ApiError.for_status(exc.error_status_hint, f"malformed HTTP request: {exc}"))
                    return
                if isinstance(event, (h11.ConnectionClosed, h11.EndOfMessage)) or event is h11.PAUSED:
                    return
                if not isinstance(event, h11.Request):
                    return
                request = await self._read_request(event)
                if request is None:
                    return
                response = await self.app.dispatch(request)
                await self._send(response, head=request.method == "HEAD")
                if self.conn.our_state is h11.MUST_CLOSE or self.conn.their_state is h11.MUST_CLOSE:
                    return
                try:
                    self.conn.start_next_cycle()
                except h11.LocalProtocolError:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self.writer.close()

    async def _read_request(self, event: h11.Request) -> Request | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
        declared = headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.app.client_max_size:
            await self._too_large(int(declared))
            return None
        chunks, size = [], 0
        while True:
            try:
                part = await self._next_event()
            except h11.RemoteProtocolError as exc:
                await self._fail(BadRequest(f"malformed HTTP request body: {exc}"))
                return None
            if isinstance(part, h11.Data):
                size += len(part.data)
                if size > self.app.client_max_size:
                    await self._too_large(size)
                    return None
                chunks.append(part.data)
            elif isinstance(part, h11.EndOfMessage):
                break
            else:
                return None
        target = event.target.decode("latin-1")
        return Request(event.method.decode("ascii"), target, headers, b"".join(chunks), self.app)

    async def _too_large(self, size: int) -> None:
        limit = self.app.client_max_size
        await self._fail(PayloadTooLarge(
            f"request body of {size} bytes is over the limit of {limit} bytes; send smaller chunks"))

    async def _fail(self, error: ApiError) -> None:
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            await self._send(Response(render(error), status=error.status, headers={"Connection": "close"}))

    async def _send(self, response: Response, head: bool = False) -> None:
        headers = [(b"content-type", response.content_type.encode()),
                   (b"content-length", str(len(response.body)).encode()), (b"server", SERVER_HEADER)]
        headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()]
        data = self.conn.send(h11.Response(status_code=response.status, headers=headers))
        if response.body and not head:
            data += self.conn.send(h11.Data(data=response.body))
        data += self.conn.send(h11.EndOfMessage())
        self.writer.write(data)
        await self.writer.drain()


async def serve_connection(app: App, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           header_timeout: float = DEFAULT_HEADER_TIMEOUT) -> None:
    """Serve ``app`` on one connection made some other way (e.g. one this process opened)."""
    await _Connection(app, reader, writer, header_timeout).serve()


class Server:
    """Serve an ``App`` on TCP or a Unix socket; ``start()`` runs the cleanup contexts' set-up."""

    def __init__(self, app: App, header_timeout: float = DEFAULT_HEADER_TIMEOUT) -> None:
        self.app = app
        self.header_timeout = header_timeout
        self._server: asyncio.Server | None = None
        self._contexts: list[AsyncIterator[None]] = []
        self._connections: set[asyncio.Task] = set()

    async def start(self, *, host: str | None = None, port: int | None = None, unix_socket: str | None = None) -> None:
        for factory in self.app.cleanup_ctx:
            context = factory(self.app)
            await context.__anext__()
            self._contexts.append(context)
        if unix_socket is not None:
            if os.path.exists(unix_socket):
                os.unlink(unix_socket)
            self._server = await asyncio.start_unix_server(self._handle, path=unix_socket, limit=READ_CHUNK)
        else:
            self._server = await asyncio.start_server(self._handle, host, port, reuse_address=True, limit=READ_CHUNK)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await _Connection(self.app, reader, writer, self.header_timeout).serve()
        finally:
            self._connections.discard(task)

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
