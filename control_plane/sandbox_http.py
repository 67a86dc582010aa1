"""HTTP from the control plane to sandboxes, with the failure markers the client relies on.

Connection failures become 410 (the sandbox is gone or unreachable), cancellations 499, and any
other failure of ours 500 with a body starting ``Failed to forward request`` (the marker the
published client reads). The sandbox's own answers pass through untouched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp

from sandbox_server.http import Reply

from .backends.base import SandboxAddress
from .constants import FORWARD_FAILED
from .errors import StatusError
from .unix_http import ConnectFailed, HttpProtocolError, UnixPool

HOP_BY_HOP = {
    "host", "authorization", "content-length", "transfer-encoding", "connection", "keep-alive", "prefer",
    "upgrade", "te", "trailer", "proxy-authorization", "proxy-authenticate", "accept-encoding",
}
RESPONSE_DROP = {"transfer-encoding", "connection", "content-length", "content-encoding", "keep-alive", "date",
                 "server"}


class ForwardError(StatusError):
    """The call did not reach the sandbox (410) or got no usable answer (500); the message starts
    with ``FORWARD_FAILED``, the marker the published client reads."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message, status)


def forward_error(exc: BaseException, url: str) -> ForwardError:
    """The client-facing failure for what went wrong talking to the sandbox at ``url``."""
    if isinstance(exc, ForwardError):
        return exc
    kind = f"{type(exc).__name__} ({exc})"
    if isinstance(exc, (ConnectFailed, aiohttp.ClientConnectorError, FileNotFoundError, ConnectionRefusedError)):
        return ForwardError(410, f"{FORWARD_FAILED}: unable to connect to {url}: {kind}")
    if isinstance(exc, (ConnectionError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
        return ForwardError(410, f"{FORWARD_FAILED}: the sandbox at {url} closed the connection: {kind}")
    if isinstance(exc, asyncio.TimeoutError):
        return ForwardError(500, f"{FORWARD_FAILED} to {url}: no answer within the read timeout")
    if isinstance(exc, HttpProtocolError):
        return ForwardError(500, f"{FORWARD_FAILED} to {url}: the sandbox's answer is not valid HTTP: {exc}")
    return ForwardError(500, f"{FORWARD_FAILED} to {url}: {kind}")


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


@dataclass
class PendingReply:
    """A request under way: ``future`` ends when it does; ``result()`` then gives the reply or
    raises ``ForwardError``."""

    future: asyncio.Future
    url: str

    def __post_init__(self) -> None:
        # A caller that stopped waiting (a shutdown, an abandoned operation) never reads the
        # outcome: its failure is expected then, not an "exception never retrieved".
        self.future.add_done_callback(_retrieved)

    async def wait(self) -> None:
        """Until the request ends; cancelling the wait cancels the request (and drops its connection)."""
        try:
            await asyncio.wait((self.future,))
        except asyncio.CancelledError:
            self.future.cancel()
            raise

    def result(self) -> Reply:
        try:
            value = self.future.result()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise forward_error(exc, self.url) from exc
        return Reply(value.status, {k: v for k, v in value.headers.items() if k not in RESPONSE_DROP}, value.body)


def _ending(pending: PendingReply, on_end: Callable[[], None] | None) -> PendingReply:
    if on_end is not None:
        pending.future.add_done_callback(lambda _: on_end())
    return pending


class Forwarder:
    """Kept-alive connections per sandbox: a lean client for Unix sockets (the local backend,
    where every 0.1 ms shows), aiohttp for TCP (Kubernetes pods)."""

    def __init__(self, read_timeout: float) -> None:
        self._read_timeout = read_timeout
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=read_timeout)
        self._session: aiohttp.ClientSession | None = None
        self._pools: dict[str, UnixPool] = {}

    def start(self, endpoint: SandboxAddress, method: str, path: str, headers: Mapping[str, str] | None = None,
              body: bytes | bytearray | None = None, timeout: float | None = None,
              on_end: Callable[[], None] | None = None) -> PendingReply:
        """Begin a request; ``path`` is relative to the sandbox root (``api/tools/bash?x=1``). On an
        idle kept-alive connection the request is written before this returns, and ``on_end`` is
        called in the same turn of the loop as its answer arrives (else when the future ends)."""
        url = endpoint.base_url.rstrip("/") + "/" + path.lstrip("/")
        sent = {k: v for k, v in (headers or {}).items() if k.lower() not in HOP_BY_HOP}
        if not endpoint.unix_socket:
            return _ending(PendingReply(asyncio.ensure_future(self._tcp(url, method, sent, body, timeout)), url),
                           on_end)
        pool = self._pools.get(endpoint.unix_socket)
        if pool is None:
            pool = self._pools[endpoint.unix_socket] = UnixPool(endpoint.unix_socket)
        limit = timeout or self._read_timeout
        try:
            sent_now = pool.send(method, path, sent, body or b"", limit, on_end)
        except ValueError as exc:
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return _ending(PendingReply(failed, url), on_end)
        if sent_now is not None:
            return PendingReply(sent_now, url)
        return _ending(PendingReply(asyncio.ensure_future(pool.request(method, path, sent, body or b"", limit)), url),
                       on_end)

    async def request(self, endpoint: SandboxAddress, method: str, path: str, headers: Mapping[str, str] | None = None,
                      body: bytes | bytearray | None = None, timeout: float | None = None) -> Reply:
        """One request to the sandbox; raises ``ForwardError``."""
        pending = self.start(endpoint, method, path, headers, body, timeout)
        await pending.wait()
        return pending.result()

    def _tcp_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=64, ttl_dns_cache=60)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout, auto_decompress=True,
                                                  skip_auto_headers=("User-Agent",))
        return self._session

    async def _tcp(self, url: str, method: str, headers: dict[str, str], body: bytes | bytearray | None,
                   timeout: float | None) -> Reply:
        limit = self._timeout if timeout is None else aiohttp.ClientTimeout(total=timeout)
        async with self._tcp_session().request(method, url, data=body or None, headers=headers, allow_redirects=False,
                                               timeout=limit) as resp:
            data = await resp.read()
            return Reply(resp.status, {k.lower(): v for k, v in resp.headers.items()}, data)

    async def forget(self, endpoint: SandboxAddress) -> None:
        """Close the connections to a sandbox that is gone (its socket is)."""
        if endpoint.unix_socket:
            pool = self._pools.pop(endpoint.unix_socket, None)
            if pool is not None:
                pool.close()

    async def close(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
        if self._session is not None:
            await self._session.close()
