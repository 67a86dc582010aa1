"""Forwards served below aiohttp: a tool call's route without aiohttp's request machinery.

In a whole tool call, aiohttp's share of a forward (its request objects, a task and a turn of
the loop more, routing, the middleware's wrapping, the answer's headers) was ~330 us of the
control plane's ~600 us of CPU per call (its thread's CPU time stamped along 1,800 calls, load
3.5): each call runs with caches the caller's and the sandbox's processes have just used, where
every object touched costs. With a bash call between requests, a route answering a fixed body
cost the server 400 us of CPU through aiohttp and 250 us through ``sandbox_server/web.py``
(medians of 5 rounds, load 3.3). ``benchmarks/forward_http.py`` compares the two ways of a
forward on one control plane.

Each connection is served here until a request comes that is not a plain forward (another
route, a body chunked or of ``SMALL`` bytes or more, ``Expect``, an upgrade, a header given twice,
a path aiohttp would decode or normalise, a head ``request_head`` refuses): the connection is
then aiohttp's for good, with every byte read so far. A forward here passes what the middleware
does (authentication, the shutdown's 503, the metrics and the log line, errors rendered as
JSON) and the same handler (``app.relay``), so its answer is the one aiohttp would give; a body
this small is not counted in the body budget there either.
"""

from __future__ import annotations

import asyncio
import functools
import re
import select
import time
from collections.abc import Callable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING

from aiohttp import web
from multidict import CIMultiDict

from sandbox_server.request_head import MalformedRequest, RequestHead, head_end, parse_head

from .body_budget import SMALL
from .errors import ApiError
from .forward_calls import ForwardedCall
from .http import int_param, log_request, unexpected, uuid_param
from .tenants import SINGLE

if TYPE_CHECKING:
    from .app import Relayed
    from .metrics import Metrics
    from .service import ControlPlane
    from .startup import Shutdown

PREFIX = "/api/forward/"
ROUTE = "/api/forward/{client_id}/{server_id}/{path}"  # as aiohttp names the route in the metrics
# RFC 3986's unreserved and sub-delimiting characters but "+", and ":@/?": nothing aiohttp would
# decode, and no "#", "%" or character it might refuse
PLAIN_TARGET = re.compile(r"[A-Za-z0-9._~!$&'()*,;=:@/?-]+")
METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH"})
MAX_HEAD = 8190  # aiohttp's limit of a line: a longer head is left to it
PENDING_LIMIT = 1 << 20  # bytes read ahead of the request being served before reading pauses
#: Connections waiting to be accepted (Python's default is 100: a trainer's burst of new connections
#: overflowed it; the kernel caps it at net.core.somaxconn).
LISTEN_BACKLOG = 1024
UNREAD_GRACE = 0.5  # seconds until an idle connection with bytes unread at its deadline is looked at again


class Forwarding:
    """What a forward served here needs of the control plane (one per app)."""

    def __init__(self, app: web.Application, cp: ControlPlane, metrics: Metrics, shutdown: Shutdown,
                 authenticate: Callable[[Mapping[str, str]], str] | None) -> None:
        self.app = app
        self.cp = cp
        self.metrics = metrics
        self.shutdown = shutdown
        self.authenticate = authenticate
        self.connections: set[Connection] = set()
        self.closing = False  # answers close their connections

    def target(self, head: RequestHead, lines: int) -> tuple[str, str, str] | None:
        """(client id, server id, path below the sandbox's root with its query) of a forward
        served here; None for anything aiohttp serves."""
        headers = head.headers
        if (head.method not in METHODS or head.length is None or head.length >= SMALL
                or head.length > self.cp.config.max_body_bytes or len(headers) != lines
                or "expect" in headers or "upgrade" in headers or not head.target.startswith(PREFIX)):
            return None
        if not PLAIN_TARGET.fullmatch(head.target) or "//" in head.target or "/." in head.target:
            return None  # aiohttp decodes (a query's + too) and normalises such targets before routing them
        path, mark, query = head.target.partition("?")
        parts = path[len(PREFIX):].split("/", 2)
        if len(parts) < 3 or not parts[0] or not parts[1]:
            return None
        return parts[0], parts[1], parts[2] + mark + query

    async def answer(self, head: RequestHead, target: tuple[str, str, str], body: bytes) -> bytes:
        """The whole answer to a forward, as the middleware and ``app.forward`` make it."""
        from .app import relay

        started = time.perf_counter()
        status = 500
        try:
            headers = CIMultiDict(head.headers)
            try:
                tenant = SINGLE if self.authenticate is None else self.authenticate(headers)
                with self.shutdown.in_flight():
                    client_id, server_id = uuid_param(target[0], "client_id"), int_param(target[1], "server_id")
                    endpoint = self.cp.forward_endpoint(client_id, server_id, tenant)
                    call = ForwardedCall(client_id, server_id, head.method, target[2], headers, body)
                    relayed = await relay(self.app, endpoint, call)
            except ApiError as exc:
                relayed = _failure(exc)
            except Exception as exc:  # a bug: say so, keep the server up
                relayed = _failure(unexpected("control plane", head.method, head.target, exc))
            keep_alive = head.keep_alive and not self.closing
            idle = self.cp.config.header_timeout if keep_alive else None
            try:
                answer = encode_answer(relayed, idle)
            except ValueError as exc:
                relayed = _failure(unexpected("control plane", head.method, head.target, exc))
                answer = encode_answer(relayed, idle)
            status = relayed.status
            return answer
        finally:
            seconds = time.perf_counter() - started
            asyncio.get_running_loop().call_soon(self.metrics.observe_route, head.method, ROUTE, status, seconds)
            log_request(head.method, head.target.partition("?")[0], status, seconds)

    def close(self) -> None:
        """Close the connections waiting for a request (those answering close after their answer)."""
        self.closing = True
        for conn in list(self.connections):
            conn.close_when_idle()


def _failure(error: ApiError) -> Relayed:
    from .app import Relayed
    from .errors import render

    return Relayed(error.status, {}, render(error), "application/json")


@functools.lru_cache(maxsize=2)
def keep_alive_value(idle: float) -> str:
    """The ``Keep-Alive`` header's value, ``timeout=N``: how long a kept-alive connection may idle
    here, so that a client reuses it only well within that (one reused as it is closed is reset
    under its request)."""
    return f"timeout={max(int(idle), 1)}"


def _date(second: int) -> str:
    return formatdate(second, usegmt=True)


def encode_answer(relayed: Relayed, keep_alive: float | None) -> bytes:
    """The answer's bytes: status line, headers, body (a header that would break the framing is a
    ``ValueError``, as aiohttp refuses it). ``keep_alive``: how long the connection may idle before
    it is closed (said in ``Keep-Alive``), or None to close it after this answer."""
    try:
        reason = HTTPStatus(relayed.status).phrase
    except ValueError:
        reason = ""
    lines = [f"HTTP/1.1 {relayed.status} {reason}", f"Content-Type: {relayed.content_type}",
             f"Content-Length: {len(relayed.body)}", f"Date: {_date(int(time.time()))}"]
    for name, value in relayed.headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} of the answer holds a line break")
        lines.append(f"{name}: {value}")
    if keep_alive is None:
        lines.append("Connection: close")
    else:
        lines.append(f"Keep-Alive: {keep_alive_value(keep_alive)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + relayed.body


class Connection(asyncio.Protocol):
    """One client's connection: forwards answered here, one at a time and in order, until it is
    handed to aiohttp (``aiohttp_server`` makes the protocol that takes it)."""

    def __init__(self, forwarding: Forwarding, aiohttp_server: Callable[[], asyncio.Protocol],
                 header_timeout: float) -> None:
        self.forwarding = forwarding
        self.aiohttp_server = aiohttp_server
        self.header_timeout = header_timeout
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._serving: asyncio.Task | None = None
        self._read_paused = False
        self._write_paused = False
        self._closing = False
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.forwarding.connections.add(self)
        self._idle()

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._serving is None:
            self._next()
        elif len(self._buf) > PENDING_LIMIT and not self._read_paused:
            self._read_paused = True
            assert self.transport is not None
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        return False  # the client sent all it will: the transport closes (as aiohttp lets it)

    def connection_lost(self, exc: Exception | None) -> None:
        self.forwarding.connections.discard(self)
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._serving is None and self._buf:
            self._next()

    # -- requests ---------------------------------------------------------------------------------

    def _next(self) -> None:
        """Serve the request at the head of the buffer, once it is whole; hand over what is not a
        forward served here."""
        if self._closing or self._write_paused or not self._buf:
            return
        buf = self._buf
        end = head_end(buf)
        if end is None:
            if len(buf) > MAX_HEAD:
                self._hand_over()  # aiohttp says what is wrong with it
            return
        raw = bytes(buf[:end[0]])
        if end[0] > MAX_HEAD or not raw.split(b"\n", 1)[0].rstrip(b"\r").endswith(b" HTTP/1.1"):
            self._hand_over()  # aiohttp's limits, and its answers to HTTP/1.0
            return
        try:
            head = parse_head(raw)
        except MalformedRequest:
            self._hand_over()
            return
        target = self.forwarding.target(head, raw.count(b"\n"))
        if target is None:
            self._hand_over()
            return
        assert head.length is not None
        if len(buf) < end[1] + head.length:
            return  # the rest of the body is on its way
        body = bytes(buf[end[1]:end[1] + head.length])
        del buf[:end[1] + head.length]
        self._serving = asyncio.get_running_loop().create_task(self._serve(head, target, body))

    async def _serve(self, head: RequestHead, target: tuple[str, str, str], body: bytes) -> None:
        try:
            answer = await self.forwarding.answer(head, target, body)
        finally:
            self._serving = None
        if self._closing or self.transport is None:
            return
        self.transport.write(answer)
        if not head.keep_alive or self.forwarding.closing:
            self._close()
            return
        self._idle()
        if self._read_paused and len(self._buf) <= PENDING_LIMIT:
            self._read_paused = False
            self.transport.resume_reading()
        self._next()

    def _hand_over(self) -> None:
        """From now on aiohttp serves this connection, from the bytes read so far."""
        assert self.transport is not None
        self.forwarding.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        protocol = self.aiohttp_server()
        self.transport.set_protocol(protocol)
        protocol.connection_made(self.transport)
        if self._read_paused:
            self.transport.resume_reading()
        data, self._buf = bytes(self._buf), bytearray()
        protocol.data_received(data)

    # -- timeouts and closing ---------------------------------------------------------------------

    def _idle(self) -> None:
        """The next request's head must come within the header timeout (as aiohttp's keep-alive)."""
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + self.header_timeout
        if self._timer is None:
            self._timer = loop.call_at(self._deadline, self._check_idle)

    def _check_idle(self) -> None:
        self._timer = None
        if self._serving is not None or self._closing:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < self._deadline:
            self._timer = loop.call_at(self._deadline, self._check_idle)
        elif self._unread():
            # Bytes the loop has not delivered yet (a busy loop runs this timer before reading them):
            # closing now would reset a request the client sent in time. Look again once they are read.
            self._timer = loop.call_later(UNREAD_GRACE, self._check_idle)
        else:
            self._close()

    def _unread(self) -> bool:
        """Whether the socket holds bytes (or the client's end) not yet read."""
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        try:
            poller = select.poll()
            poller.register(sock, select.POLLIN)  # type: ignore[arg-type]
            return bool(poller.poll(0))
        except (OSError, TypeError, ValueError):  # no socket, or closed meanwhile
            return False

    def close_when_idle(self) -> None:
        if self._serving is None:
            self._close()

    def _close(self) -> None:
        self._closing = True
        if self.transport is not None:
            self.transport.close()


class Sites:
    """The control plane's listening sockets: every connection starts as a ``Connection`` of
    ``forwarding`` and goes to ``runner``'s aiohttp server when it asks for anything else."""

    def __init__(self, runner: web.AppRunner, forwarding: Forwarding, header_timeout: float) -> None:
        self.runner = runner
        self.forwarding = forwarding
        self.header_timeout = header_timeout
        self._servers: list[asyncio.Server] = []

    def _protocol(self) -> Connection:
        server = self.runner.server
        assert server is not None, "the runner is not set up"
        return Connection(self.forwarding, server, self.header_timeout)

    async def tcp(self, host: str | None, port: int) -> int:
        """Listen on ``host:port`` (0: a free port); returns the port."""
        server = await asyncio.get_running_loop().create_server(self._protocol, host, port, reuse_address=True,
                                                                backlog=LISTEN_BACKLOG)
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def unix(self, path: str) -> None:
        self._servers.append(await asyncio.get_running_loop().create_unix_server(self._protocol, path,
                                                                                 backlog=LISTEN_BACKLOG))

    def close(self) -> None:
        """Stop listening and close the connections served here (those answering, once they have
        answered); those aiohttp took are closed by the runner's cleanup."""
        for server in self._servers:
            server.close()
        self._servers = []
        self.forwarding.close()
