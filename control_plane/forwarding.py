"""HTTP from the control plane to sandboxes, with the failure markers the client relies on.

Connection failures become 410 (the sandbox is gone or unreachable), cancellations 499, and any
other failure of ours 500 with a body starting ``Failed to forward request`` (wire contract
§6.3). The sandbox's own answers pass through untouched.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from .backends.base import Endpoint
from .unix_http import ConnectFailed, ProtocolError, UnixPool

FORWARD_FAILED = "Failed to forward request"
HOP_BY_HOP = {
    "host", "authorization", "content-length", "transfer-encoding", "connection", "keep-alive", "prefer",
    "upgrade", "te", "trailer", "proxy-authorization", "proxy-authenticate", "accept-encoding",
}
RESPONSE_DROP = {"transfer-encoding", "connection", "content-length", "content-encoding", "keep-alive", "date",
                 "server"}


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


class ForwardError(Exception):
    def __init__(self, status_code: int, body: str) -> None:
        super().__init__(body)
        self.status_code = status_code
        self.body = body


class Forwarder:
    """Kept-alive connections per sandbox: a lean client for Unix sockets (the local backend,
    where every 0.1 ms shows), aiohttp for TCP (Kubernetes pods)."""

    def __init__(self, read_timeout: float) -> None:
        self._read_timeout = read_timeout
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=read_timeout)
        self._session: aiohttp.ClientSession | None = None
        self._pools: dict[str, UnixPool] = {}

    def _tcp_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=64, ttl_dns_cache=60)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout, auto_decompress=True,
                                                  skip_auto_headers=("User-Agent",))
        return self._session

    async def request(self, endpoint: Endpoint, method: str, path: str, headers: dict[str, str] | None = None,
                      body: bytes | None = None, timeout: float | None = None) -> Reply:
        """``path`` is relative to the sandbox root (``api/tools/bash?x=1``)."""
        url = endpoint.base_url.rstrip("/") + "/" + path.lstrip("/")
        sent = {k: v for k, v in (headers or {}).items() if k.lower() not in HOP_BY_HOP}
        try:
            if endpoint.unix_socket:
                pool = self._pools.get(endpoint.unix_socket)
                if pool is None:
                    pool = self._pools[endpoint.unix_socket] = UnixPool(endpoint.unix_socket)
                raw = await pool.request(method, path, sent, body or b"", timeout or self._read_timeout)
                out = {k: v for k, v in raw.headers.items() if k not in RESPONSE_DROP}
                return Reply(raw.status, out, raw.body)
            return await self._tcp(url, method, sent, body, timeout)
        except asyncio.CancelledError:
            raise
        except (ConnectFailed, aiohttp.ClientConnectorError, FileNotFoundError, ConnectionRefusedError) as exc:
            raise ForwardError(410, f"{FORWARD_FAILED}: unable to connect to {url}: {type(exc).__name__} ({exc})") \
                from exc
        except (ConnectionError, asyncio.IncompleteReadError, aiohttp.ServerDisconnectedError,
                aiohttp.ClientOSError) as exc:
            raise ForwardError(410, f"{FORWARD_FAILED}: the sandbox at {url} closed the connection: "
                                    f"{type(exc).__name__} ({exc})") from exc
        except asyncio.TimeoutError as exc:
            raise ForwardError(500, f"{FORWARD_FAILED} to {url}: no answer within the read timeout") from exc
        except ProtocolError as exc:
            raise ForwardError(500, f"{FORWARD_FAILED} to {url}: the sandbox's answer is not valid HTTP: {exc}") \
                from exc
        except Exception as exc:  # noqa: BLE001 - every other failure is ours, marked as the client expects
            raise ForwardError(500, f"{FORWARD_FAILED} to {url}: {type(exc).__name__} ({exc})") from exc

    async def _tcp(self, url: str, method: str, headers: dict[str, str], body: bytes | None,
                   timeout: float | None) -> Reply:
        kwargs = {} if timeout is None else {"timeout": aiohttp.ClientTimeout(total=timeout)}
        async with self._tcp_session().request(method, url, data=body or None, headers=headers, allow_redirects=False,
                                               **kwargs) as resp:
            data = await resp.read()
            out = {k.lower(): v for k, v in resp.headers.items() if k.lower() not in RESPONSE_DROP}
            return Reply(resp.status, out, data)

    async def forget(self, endpoint: Endpoint) -> None:
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
