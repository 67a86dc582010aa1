"""A lean HTTP/1.1 client for sandboxes behind Unix sockets (the local backend's forward path).

aiohttp's client spends about 0.3 ms a request on machinery a forward does not use (cookie jars,
redirects, tracing, stream readers, a task per request); with 1 ms of budget for the whole
forward that is too much. Here a request is one write on a kept-alive connection, and the
connection's protocol parses the answer as it arrives and completes a future: no task, no stream
reader. It still reads every body framing HTTP allows (Content-Length, chunked, until close) and
checks what it parses, so a misbehaving sandbox gets a protocol error, not a hang or a wrong answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from yarl import URL

from sandbox_server.http import Reply

HEAD_LIMIT = 64 << 10


class HttpProtocolError(Exception):
    """The sandbox answered with something that is not HTTP/1.x."""


class ConnectFailed(OSError):
    """Nothing listens on the socket (the sandbox is gone or not up yet)."""


class Disconnected(ConnectionError):
    """The sandbox closed the connection before its answer was complete."""


_TARGETS: dict[str, str] = {}


def request_target(path: str) -> str:
    """The request target for ``path`` (relative to the sandbox root), quoted as aiohttp quotes it.
    Agents call the same few paths over and over: they are quoted once."""
    target = _TARGETS.get(path)
    if target is None:
        if len(_TARGETS) >= 1024:
            _TARGETS.clear()
        target = _TARGETS[path] = URL("http://sandbox/" + path.lstrip("/")).raw_path_qs
    return target


def encode_request(method: str, target: str, headers: dict[str, str], body: bytes | bytearray) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: sandbox", f"Content-Length: {len(body)}"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"header {name!r} cannot be sent: it contains a line break or a colon")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + body


class _Connection(asyncio.Protocol):
    """One kept-alive connection; one request at a time, its answer parsed as bytes arrive."""

    def __init__(self, pool: UnixPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reply: asyncio.Future[Reply] | None = None
        self._on_end: Callable[[], None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._buf = bytearray()
        self._method = ""
        self._reset_parse()

    def _reset_parse(self) -> None:
        self._buf.clear()
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body_at = -1  # where the body starts in the buffer, once the head is parsed
        self._framing = ""  # "length", "chunked", "close" or "none"
        self._length = 0
        self._chunks: list[bytes] = []
        self._keep = False

    def send(self, data: bytes, method: str, timeout: float,
             on_end: Callable[[], None] | None = None) -> asyncio.Future[Reply]:
        """Write a request; its answer completes the future, and ``on_end`` is called at once when
        the exchange ends (the future's own callbacks wait for the loop's next turn)."""
        assert self.transport is not None and self.reply is None
        loop = asyncio.get_running_loop()
        self.reply = reply = loop.create_future()
        self._on_end = on_end
        self._method = method
        self._timer = loop.call_later(timeout, self._time_out)
        reply.add_done_callback(self._cancelled)
        self.transport.write(data)
        return reply

    def _cancelled(self, reply: asyncio.Future[Reply]) -> None:
        if reply.cancelled() and reply is self.reply:  # its answer would come on a connection nobody reads
            self._fail(asyncio.CancelledError())

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.reply is None:  # bytes nobody asked for: this connection cannot be trusted
            self._close()
            return
        self._buf += data
        try:
            done = self._parse()
        except HttpProtocolError as exc:
            self._fail(exc)
            return
        if done:
            self._finish()

    def eof_received(self) -> bool:
        if self.reply is not None and self._framing == "close":
            self._keep = False
            self._finish(bytes(self._buf[self._body_at:]))
        else:
            self._fail(Disconnected("the sandbox closed the connection before answering"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.reply is not None:
            self._fail(Disconnected(f"the sandbox closed the connection: {exc}" if exc else
                                    "the sandbox closed the connection before answering"))

    # -- parsing ----------------------------------------------------------------------------------

    def _parse(self) -> bool:
        """Parse what has arrived; True once the whole answer is there."""
        buf = self._buf
        while self._body_at < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > HEAD_LIMIT:
                    raise HttpProtocolError(f"response head over {HEAD_LIMIT} bytes")
                return False
            if self._head(bytes(buf[:end]).decode("latin-1")):
                self._body_at = end + 4
            else:  # a 1xx answer comes before the real one
                del buf[:end + 4]
        if self._framing == "none":
            return True
        if self._framing == "length":
            return len(buf) - self._body_at >= self._length
        if self._framing == "chunked":
            return self._parse_chunks()
        return False  # until the sandbox closes the connection

    def _head(self, head: str) -> bool:
        lines = head.split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if version not in ("HTTP/1.1", "HTTP/1.0") or not code.isdigit():
            raise HttpProtocolError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
        status = int(code)
        if 100 <= status < 200 and status != 101:
            return False
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise HttpProtocolError(f"malformed header line: {line[:100]!r}")
            key = name.lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        self._status, self._headers = status, headers
        self._keep = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
        length = headers.get("content-length")
        if self._method == "HEAD" or status in (204, 304):
            self._framing = "none"
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._framing, self._length = "chunked", 0
        elif length is not None:
            if not length.isdigit():
                raise HttpProtocolError(f"bad Content-Length: {length[:40]!r}")
            self._framing, self._length = "length", int(length)
        else:
            self._framing, self._keep = "close", False
        return True

    def _parse_chunks(self) -> bool:
        """Consume whole chunks from the buffer (``_length`` counts bytes consumed after the head)."""
        buf = self._buf
        while True:
            at = self._body_at + self._length
            eol = buf.find(b"\r\n", at)
            if eol < 0:
                return False
            size_text = bytes(buf[at:eol]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError as exc:
                raise HttpProtocolError(f"bad chunk size: {size_text[:40]!r}") from exc
            if size == 0:  # then optional trailer lines and an empty line
                return buf.find(b"\r\n\r\n", eol) >= 0
            if len(buf) < eol + 2 + size + 2:
                return False
            if buf[eol + 2 + size:eol + 4 + size] != b"\r\n":
                raise HttpProtocolError("chunk not followed by CRLF")
            self._chunks.append(bytes(buf[eol + 2:eol + 2 + size]))
            self._length = eol + 4 + size - self._body_at

    # -- ending an exchange -----------------------------------------------------------------------

    def _finish(self, body: bytes | None = None) -> None:
        if body is None:
            if self._framing == "length":
                body = bytes(self._buf[self._body_at:self._body_at + self._length])
            elif self._framing == "chunked":
                body = b"".join(self._chunks)
            else:
                body = b""
        reply, result, keep, on_end = self.reply, Reply(self._status, self._headers, body), self._keep, self._on_end
        self._end_exchange()
        if keep:
            self.pool.release(self)
        else:
            self._close()
        if reply is not None and not reply.done():
            reply.set_result(result)
        if on_end is not None:
            on_end()

    def _fail(self, exc: BaseException) -> None:
        reply, on_end = self.reply, self._on_end
        self._end_exchange()
        self._close()
        if reply is not None and not reply.done():
            reply.set_exception(exc)
        if on_end is not None:
            on_end()

    def _time_out(self) -> None:
        self._fail(TimeoutError("no answer within the read timeout"))

    def _end_exchange(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.reply = self._on_end = None
        self._reset_parse()

    def _close(self) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.close()


class UnixPool:
    """Kept-alive connections to one sandbox's socket, at most ``limit`` busy at once."""

    def __init__(self, path: str, limit: int = 64) -> None:
        self.path = path
        self.limit = limit
        self._idle: list[_Connection] = []
        self._busy = 0
        self._waiting: list[asyncio.Future[None]] = []

    def send(self, method: str, path: str, headers: dict[str, str], body: bytes | bytearray,
             timeout: float, on_end: Callable[[], None] | None = None) -> asyncio.Future[Reply] | None:
        """Send on an idle connection at once, without a task; None when there is none to take.
        ``on_end`` is called as soon as the exchange ends (``_Connection.send``)."""
        if self._busy >= self.limit:
            return None
        data = encode_request(method, request_target(path), headers, body)
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return self._start(conn, data, method, timeout, on_end)
        return None

    async def request(self, method: str, path: str, headers: dict[str, str], body: bytes | bytearray,
                      timeout: float) -> Reply:
        """One exchange, connecting if need be. Raises ``ConnectFailed``, ``Disconnected``,
        ``HttpProtocolError``, ``TimeoutError`` (or ``ValueError`` for a header that cannot be sent)."""
        reply = self.send(method, path, headers, body, timeout)
        if reply is not None:
            return await reply
        data = encode_request(method, request_target(path), headers, body)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._busy >= self.limit:  # wait for a slot; a sandbox this busy is the caller's choice
            waiter = loop.create_future()
            self._waiting.append(waiter)
            try:
                await asyncio.wait_for(waiter, max(deadline - loop.time(), 0))
            finally:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
        conn: _Connection
        idle = next((c for c in reversed(self._idle) if not c.closed), None)
        if idle is not None:
            self._idle.remove(idle)
            conn = idle
        else:
            self._busy += 1  # the slot is held while connecting
            try:
                _, conn = await asyncio.wait_for(loop.create_unix_connection(lambda: _Connection(self), self.path),
                                                 max(deadline - loop.time(), 0))
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                raise ConnectFailed(exc.errno, f"{exc.strerror}: {self.path}") from exc
            finally:
                self._busy -= 1
        return await self._start(conn, data, method, max(deadline - loop.time(), 0.001))

    def _start(self, conn: _Connection, data: bytes, method: str, timeout: float,
               on_end: Callable[[], None] | None = None) -> asyncio.Future[Reply]:
        self._busy += 1
        reply = conn.send(data, method, timeout, on_end)
        reply.add_done_callback(self._done)
        return reply

    def _done(self, _: asyncio.Future[Reply]) -> None:
        self._busy -= 1
        while self._waiting:
            waiter = self._waiting.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                break

    def release(self, conn: _Connection) -> None:
        if len(self._idle) < self.limit:
            self._idle.append(conn)
        else:
            conn._close()

    def forget(self, conn: _Connection) -> None:
        if conn in self._idle:
            self._idle.remove(conn)

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn._close()
