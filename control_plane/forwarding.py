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
    """One kept-alive connection pool per sandbox endpoint."""

    def __init__(self, read_timeout: float) -> None:
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=read_timeout)
        self._sessions: dict[str, aiohttp.ClientSession] = {}

    def _session(self, endpoint: Endpoint) -> aiohttp.ClientSession:
        key = endpoint.unix_socket or "tcp"
        session = self._sessions.get(key)
        if session is None or session.closed:
            connector: aiohttp.BaseConnector
            if endpoint.unix_socket:
                connector = aiohttp.UnixConnector(path=endpoint.unix_socket, limit=64)
            else:
                connector = aiohttp.TCPConnector(limit=0, limit_per_host=64, ttl_dns_cache=60)
            session = aiohttp.ClientSession(connector=connector, timeout=self._timeout, auto_decompress=True,
                                            skip_auto_headers=("User-Agent",))
            self._sessions[key] = session
        return session

    async def request(self, endpoint: Endpoint, method: str, path: str, headers: dict[str, str] | None = None,
                      body: bytes | None = None, timeout: float | None = None) -> Reply:
        """``path`` is relative to the sandbox root (``api/tools/bash?x=1``)."""
        url = endpoint.base_url.rstrip("/") + "/" + path.lstrip("/")
        sent = {k: v for k, v in (headers or {}).items() if k.lower() not in HOP_BY_HOP}
        try:
            session = self._session(endpoint)
            kwargs = {} if timeout is None else {"timeout": aiohttp.ClientTimeout(total=timeout)}
            async with session.request(method, url, data=body or None, headers=sent, allow_redirects=False,
                                       **kwargs) as resp:
                data = await resp.read()
                out = {k.lower(): v for k, v in resp.headers.items() if k.lower() not in RESPONSE_DROP}
                return Reply(resp.status, out, data)
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientConnectorError, FileNotFoundError, ConnectionRefusedError) as exc:
            raise ForwardError(410, f"{FORWARD_FAILED}: unable to connect to {url}: {type(exc).__name__} ({exc})") \
                from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise ForwardError(410, f"{FORWARD_FAILED}: the sandbox at {url} closed the connection: "
                                    f"{type(exc).__name__} ({exc})") from exc
        except asyncio.TimeoutError as exc:
            raise ForwardError(500, f"{FORWARD_FAILED} to {url}: no answer within the read timeout") from exc
        except Exception as exc:  # noqa: BLE001 - every other failure is ours, marked as the client expects
            raise ForwardError(500, f"{FORWARD_FAILED} to {url}: {type(exc).__name__} ({exc})") from exc

    async def forget(self, endpoint: Endpoint) -> None:
        """Close the pool of a sandbox that is gone (its socket is)."""
        if endpoint.unix_socket:
            session = self._sessions.pop(endpoint.unix_socket, None)
            if session is not None:
                await session.close()

    async def close(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
