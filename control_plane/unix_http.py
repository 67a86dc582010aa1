"""A lean HTTP/1.1 client for sandboxes behind Unix sockets (the local backend's forward path).

aiohttp's client spends about 0.3 ms a request on machinery a forward does not use (cookie jars,
redirects, tracing, decompression); at 1 ms of budget for the whole forward that is too much.
This client writes the request in one go and reads the answer with a stream reader. It still
reads every body framing HTTP allows (Content-Length, chunked, until close) and checks what it
parses, so a misbehaving sandbox gets a protocol error, not a hang or a wrong answer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from yarl import URL

HEAD_LIMIT = 64 << 10
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


class ProtocolError(Exception):
    """The sandbox answered with something that is not HTTP/1.x."""


class ConnectFailed(OSError):
    """Nothing listens on the socket (the sandbox is gone or not up yet)."""


@dataclass
class RawReply:
    status: int
    headers: dict[str, str]
    body: bytes


def request_target(path: str) -> str:
    """The request target for ``path`` (relative to the sandbox root), quoted as aiohttp quotes it."""
    return URL("http://sandbox/" + path.lstrip("/")).raw_path_qs


def encode_request(method: str, target: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: sandbox", f"Content-Length: {len(body)}"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"header {name!r} cannot be sent: it contains a line break or a colon")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + body


async def read_response(reader: asyncio.StreamReader, method: str) -> tuple[RawReply, bool]:
    """One response from ``reader``; also whether the connection may carry another request."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError as exc:
            raise ProtocolError(f"response head over {HEAD_LIMIT} bytes") from exc
        lines = head[:-4].decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if version not in ("HTTP/1.1", "HTTP/1.0") or not code.isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
        status = int(code)
        if status >= 200 or status == 101:
            break  # 1xx informational answers come before the real one
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ProtocolError(f"malformed header line: {line[:100]!r}")
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    keep = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
    if method == "HEAD" or status in (204, 304):
        return RawReply(status, headers, b""), keep
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return RawReply(status, headers, await _read_chunked(reader)), keep
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise ProtocolError(f"bad Content-Length: {length[:40]!r}")
        return RawReply(status, headers, await reader.readexactly(int(length))), keep
    return RawReply(status, headers, await reader.read()), False


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        line = (await reader.readuntil(b"\r\n"))[:-2].split(b";", 1)[0].strip()
        try:
            size = int(line, 16)
        except ValueError as exc:
            raise ProtocolError(f"bad chunk size: {line[:40]!r}") from exc
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise ProtocolError("chunk not followed by CRLF")


@dataclass
class UnixPool:
    """Kept-alive connections to one sandbox's socket, at most ``limit`` at once."""

    path: str
    limit: int = 64
    _idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)
    _slots: asyncio.Semaphore | None = None

    async def request(self, method: str, path: str, headers: dict[str, str], body: bytes,
                      timeout: float) -> RawReply:
        """Send one request; raises ``ConnectFailed``, ``ConnectionError`` (the sandbox hung up),
        ``asyncio.IncompleteReadError``, ``ProtocolError`` or ``TimeoutError``."""
        data = encode_request(method, request_target(path), headers, body)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        async with self._slots, asyncio.timeout(timeout):
            conn = self._take()
            if conn is not None:
                try:
                    return await self._exchange(conn, method, data)
                except (ConnectionError, asyncio.IncompleteReadError):
                    # The sandbox may have closed the kept connection as we reused it (a restart).
                    # Only a request that is safe to repeat is sent again, as aiohttp does.
                    if method not in IDEMPOTENT:
                        raise
            return await self._exchange(await self._connect(), method, data)

    def _take(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        while self._idle:
            reader, writer = self._idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.open_unix_connection(self.path, limit=HEAD_LIMIT)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise ConnectFailed(exc.errno, f"{exc.strerror}: {self.path}") from exc

    async def _exchange(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], method: str,
                        data: bytes) -> RawReply:
        reader, writer = conn
        try:
            writer.write(data)
            if len(data) > HEAD_LIMIT:
                await writer.drain()
            reply, keep = await read_response(reader, method)
        except BaseException:
            writer.close()
            raise
        if keep and len(self._idle) < self.limit:
            self._idle.append(conn)
        else:
            writer.close()
        return reply

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
