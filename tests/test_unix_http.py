"""The forward path's lean HTTP client (``control_plane.unix_http``) against a scripted Unix-socket
server: every body framing, reuse of kept connections, and each way a sandbox can misbehave.

The happy path against our real sandbox server is covered by every forward in the control-plane
tests; this file covers what our server never does but a broken or restarted one might.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from control_plane.unix_http import ConnectFailed, Disconnected, HttpProtocolError, UnixPool, encode_request

Answer = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


async def _serve(sock: Path, answer: Answer) -> tuple[asyncio.AbstractServer, list[bytes]]:
    """A server that reads each request whole and lets ``answer`` reply; ``answer`` returns whether
    to keep the connection. The requests it saw are collected in order."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                request = head + await reader.readexactly(length)
                seen.append(request)
                if not await answer(request, reader, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_unix_server(handle, path=str(sock)), seen


def _reply(raw: bytes, keep: bool = True) -> Answer:
    async def answer(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(raw)
        await writer.drain()
        return keep
    return answer


def _run(sock: Path, answer: Answer, calls: Callable[[UnixPool], Awaitable[object]]) -> tuple[object, list[bytes]]:
    async def main() -> tuple[object, list[bytes]]:
        server, seen = await _serve(sock, answer)
        pool = UnixPool(str(sock))
        try:
            return await calls(pool), seen
        finally:
            pool.close()
            server.close()
            await server.wait_closed()
    return asyncio.run(main())


def test_content_length_body_and_the_request_sent(tmp_path: Path) -> None:
    answer = _reply(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nX-A: 1\r\nX-A: 2\r\n"
                    b"Content-Length: 11\r\n\r\n{\"ok\":true}")
    reply, seen = _run(tmp_path / "s.sock", answer,
                       lambda pool: pool.request("POST", "api/tools/bash?x=1", {"X-Trace": "t"}, b"{}", 5))
    assert (reply.status, reply.body) == (201, b'{"ok":true}')
    assert reply.headers["content-type"] == "application/json" and reply.headers["x-a"] == "1, 2"
    assert seen == [(b"POST /api/tools/bash?x=1 HTTP/1.1\r\nHost: sandbox\r\nContent-Length: 2\r\n"
                     b"X-Trace: t\r\n\r\n{}")]


def test_on_end_is_called_while_the_answer_is_read_not_a_turn_later(tmp_path: Path) -> None:
    """``on_end`` runs inside the read that completes the exchange (an answer, or a failure), so a
    forward waiting on it resumes in the loop's next turn; a callback of the reply's future runs
    only in that next turn, and what it wakes in the one after.

    Can fail: with ``on_end`` run as a callback of the future (how the forward was woken before),
    no ``data_received`` is on its stack.
    """
    import traceback

    async def calls(pool: UnixPool) -> list[tuple[bool, bool]]:
        await pool.request("GET", "warm", {}, b"", 5)  # a kept connection, so that ``send`` writes at once
        seen = []
        for path in ("ok", "broken"):
            ended = asyncio.get_running_loop().create_future()

            def on_end(ended: asyncio.Future = ended) -> None:
                ended.set_result(any(frame.name == "data_received" for frame in traceback.extract_stack()))

            reply = pool.send("GET", path, {}, b"", 5, on_end=on_end)
            assert reply is not None
            seen.append((await ended, reply.done()))
        return seen

    async def answer(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"NOT HTTP\r\n\r\n" if b"broken" in request else b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        return True

    seen, _ = _run(tmp_path / "s.sock", answer, calls)
    assert seen == [(True, True), (True, True)]


def test_chunked_body_with_trailers_and_an_informational_answer_first(tmp_path: Path) -> None:
    answer = _reply(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")
    reply, _ = _run(tmp_path / "s.sock", answer, lambda pool: pool.request("GET", "api/x", {}, b"", 5))
    assert (reply.status, reply.body) == (200, b"hello world")


def test_close_delimited_body_is_read_to_the_end_and_not_reused(tmp_path: Path) -> None:
    answer = _reply(b"HTTP/1.0 200 OK\r\n\r\nall of it", keep=False)

    async def two(pool: UnixPool) -> list[bytes]:
        return [(await pool.request("GET", "a", {}, b"", 5)).body for _ in range(2)]

    bodies, seen = _run(tmp_path / "s.sock", answer, two)
    assert bodies == [b"all of it"] * 2 and len(seen) == 2


def test_kept_connection_is_reused(tmp_path: Path) -> None:
    connections = []

    async def answer(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        connections.append(id(writer))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        return True

    async def three(pool: UnixPool) -> list[int]:
        return [(await pool.request("POST", "a", {}, b"x", 5)).status for _ in range(3)]

    statuses, _ = _run(tmp_path / "s.sock", answer, three)
    assert statuses == [200] * 3 and len(set(connections)) == 1


def test_a_connection_the_sandbox_closed_while_idle_is_not_reused(tmp_path: Path) -> None:
    """A restarted sandbox closes every kept connection: the next call goes on a new one."""
    async def answer_and_hang_up(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        return False

    async def twice(pool: UnixPool) -> list[bytes]:
        first = (await pool.request("POST", "a", {}, b"", 5)).body
        while pool._idle and not pool._idle[0].closed:  # the hang-up reaches us as the loop runs
            await asyncio.sleep(0.001)
        return [first, (await pool.request("POST", "a", {}, b"", 5)).body]

    bodies, seen = _run(tmp_path / "s.sock", answer_and_hang_up, twice)
    assert bodies == [b"ok", b"ok"] and len(seen) == 2


def test_a_hang_up_mid_request_is_disconnected_and_never_sent_again(tmp_path: Path) -> None:
    """A sandbox that dies while it runs a call may have run it: the call is not repeated."""
    async def hang_up(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        return False

    async def call(pool: UnixPool) -> None:
        with pytest.raises(Disconnected, match="before answering"):
            await pool.request("GET", "a", {}, b"", 5)

    _, seen = _run(tmp_path / "s.sock", hang_up, call)
    assert len(seen) == 1


@pytest.mark.parametrize("raw, match", [
    (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x status line"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", "bad Content-Length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
])
def test_a_broken_answer_is_a_protocol_error(tmp_path: Path, raw: bytes, match: str) -> None:
    async def call(pool: UnixPool) -> None:
        with pytest.raises(HttpProtocolError, match=match):
            await pool.request("GET", "a", {}, b"", 5)

    _run(tmp_path / "s.sock", _reply(raw), call)


def test_a_truncated_body_is_disconnected(tmp_path: Path) -> None:
    async def call(pool: UnixPool) -> None:
        with pytest.raises(Disconnected):
            await pool.request("POST", "a", {}, b"", 5)

    _run(tmp_path / "s.sock", _reply(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", keep=False), call)


def test_no_answer_times_out_and_the_connection_is_dropped(tmp_path: Path) -> None:
    async def silent(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        await reader.read()  # waits until the client hangs up
        return False

    async def call(pool: UnixPool) -> None:
        with pytest.raises(TimeoutError):
            await pool.request("GET", "a", {}, b"", 0.2)
        assert pool._idle == []

    _run(tmp_path / "s.sock", silent, call)


def test_a_cancelled_call_drops_its_connection(tmp_path: Path) -> None:
    received, hung_up = asyncio.Event(), asyncio.Event()

    async def silent(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        received.set()
        await reader.read()
        hung_up.set()
        return False

    async def call(pool: UnixPool) -> None:
        task = asyncio.ensure_future(pool.request("GET", "a", {}, b"", 30))
        await asyncio.wait_for(received.wait(), 5)  # the request is at the server, its answer awaited
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(hung_up.wait(), 5)
        assert pool._busy == 0 and pool._idle == []

    _run(tmp_path / "s.sock", silent, call)


def test_calls_beyond_the_limit_wait_for_a_connection(tmp_path: Path) -> None:
    """With a limit of 2, five concurrent calls use at most two connections at once; all answer."""
    open_now, most = [0], [0]
    release = asyncio.Event()

    async def slow(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        open_now[0] += 1
        most[0] = max(most[0], open_now[0])
        await release.wait()
        open_now[0] -= 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        return True

    async def five(pool: UnixPool) -> list[int]:
        pool.limit = 2
        calls = [asyncio.ensure_future(pool.request("POST", "a", {}, b"", 10)) for _ in range(5)]

        async def two_in_three_waiting() -> None:
            while most[0] < 2 or len(pool._waiting) < 3:
                await asyncio.sleep(0.001)

        await asyncio.wait_for(two_in_three_waiting(), 5)
        assert most[0] == 2 and pool.send("POST", "a", {}, b"", 10) is None
        release.set()
        return [r.status for r in await asyncio.gather(*calls)]

    statuses, seen = _run(tmp_path / "s.sock", slow, five)
    assert statuses == [200] * 5 and most[0] == 2 and len(seen) == 5


def test_nothing_listening_is_connect_failed(tmp_path: Path) -> None:
    async def call() -> None:
        with pytest.raises(ConnectFailed, match="missing.sock"):
            await UnixPool(str(tmp_path / "missing.sock")).request("GET", "a", {}, b"", 5)

    asyncio.run(call())


def test_a_header_that_would_split_the_request_is_refused() -> None:
    with pytest.raises(ValueError, match="line break"):
        encode_request("GET", "/a", {"X-Evil": "1\r\nX-Injected: 2"}, b"")
    assert encode_request("GET", "/a", {"X-Ok": "1"}, b"") == (
        b"GET /a HTTP/1.1\r\nHost: sandbox\r\nContent-Length: 0\r\nX-Ok: 1\r\n\r\n")
