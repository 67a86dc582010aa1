"""The sandbox server's HTTP layer (``sandbox_server/web.py``, ``request_head.py``) over a real
socket: kept-alive, pipelined, split, closing and HEAD exchanges, chunked bodies, what is refused
(and with which status), and a handler's header that cannot be sent.

Can fail (each seen failing with h11, which served before): a handler's header holding a line
break made h11 raise and the connection close with no answer (the client saw a disconnect, not a
500); h11 took a request with both Content-Length and Transfer-Encoding, folded header lines,
control characters in values, a head of 70 KiB when it came in one read, and an HTTP/2.0 request
(answered as HTTP/1.1), and waited for a chunk over the body limit instead of answering 413. A
content type Latin-1 cannot encode went out as UTF-8 bytes there; a 500 now (web.py writes heads in
Latin-1: before this check, such an answer ended the connection unanswered).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_server import web
from sandbox_server.app import on_error
from tests.local_helpers import LoopThread, loop_thread


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    yield from loop_thread()


@pytest.fixture
def server(loop: LoopThread, tmp_path: Path) -> Iterator[str]:
    app = web.App(client_max_size=1 << 20, on_error=on_error)

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"method": request.method, "body": request.body.decode()})

    async def injected(request: web.Request) -> web.Response:
        return web.Response(b"{}", headers={"X-Name": "a\r\nSet-Cookie: stolen=1"})

    async def wide(request: web.Request) -> web.Response:
        return web.Response(b"{}", content_type="text/plain; charset=\u20ac")

    async def hold(request: web.Request) -> web.Response:
        await HELD.wait()
        return web.json_response({})

    app.add_route("POST", "/echo", echo)
    app.add_get("/hold", hold)
    app.add_get("/echo", echo)
    app.add_get("/injected", injected)
    app.add_get("/wide", wide)
    srv = web.Server(app)
    path = str(tmp_path / "web.sock")
    loop.run(srv.start(unix_socket=path))
    yield path
    loop.run(srv.close())


HELD = asyncio.Event()  # what ``/hold`` waits for (set on the server's loop)


async def _release() -> None:
    HELD.set()


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(30)
    sock.connect(path)
    return sock


def _answers(sock: socket.socket, count: int) -> tuple[list[tuple[str, dict[str, str], bytes]], bytes]:
    """``count`` answers read off ``sock`` (Content-Length framed), and what came after them."""
    buf, answers = b"", []
    while len(answers) < count:
        while b"\r\n\r\n" not in buf:
            data = sock.recv(65536)
            assert data, f"the server closed the connection after {len(answers)} answers"
            buf += data
        head, _, buf = buf.partition(b"\r\n\r\n")
        status, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        length = int(headers["content-length"])
        while len(buf) < length:
            buf += sock.recv(65536)
        answers.append((status, headers, buf[:length]))
        buf = buf[length:]
    return answers, buf


def _closed(sock: socket.socket) -> bool:
    return sock.recv(1) == b""


def test_kept_alive_and_pipelined_requests_each_get_their_answer(server: str) -> None:
    with _connect(server) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\none"
                     b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\ntwo")
        answers, rest = _answers(sock, 2)
        assert rest == b""
        assert [json.loads(body)["body"] for _, _, body in answers] == ["one", "two"]
        for status, headers, _ in answers:
            assert status == "HTTP/1.1 200 OK"
            assert headers["content-type"] == "application/json"
            assert headers["server"] == "idegym-sandbox"
            assert "connection" not in headers
        # A request split across writes, on the same connection.
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Le")
        sock.sendall(b"ngth: 5\r\n\r\nthr")
        sock.sendall(b"ee")
        (answer,), _ = _answers(sock, 1)
        assert json.loads(answer[2])["body"] == "three"


def test_pipelined_requests_past_what_the_connection_buffers_are_each_answered(server: str, loop: LoopThread) -> None:
    """4.8 MB of requests sent behind one the server holds, their answers as large: the server
    stops reading while it holds more than it buffers (the client's writes wait), and waits for
    room to write while the client is busy sending; every answer comes, whole and in order."""
    bodies = [bytes([ord("a") + i % 26]) * (400 << 10) for i in range(12)]
    data = b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n" + b"".join(
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b) for b in bodies)
    sent = threading.Semaphore(0)

    def send(sock: socket.socket) -> None:
        for at in range(0, len(data), 64 << 10):
            sock.sendall(data[at:at + (64 << 10)])
            if at >= 2 << 20:
                sent.release()  # past what the server buffers while it holds /hold

    with _connect(server) as sock:
        sender = threading.Thread(target=send, args=(sock,))
        sender.start()
        assert sent.acquire(timeout=30)
        loop.run(_release())
        answers, rest = _answers(sock, 1 + len(bodies))
        sender.join(30)
        assert not sender.is_alive()
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nnext")
        (last,), _ = _answers(sock, 1)
    assert rest == b"" and answers[0][0] == "HTTP/1.1 200 OK"
    assert [json.loads(body)["body"] for _, _, body in answers[1:]] == [b.decode() for b in bodies]
    assert json.loads(last[2])["body"] == "next"


@pytest.mark.parametrize("request_bytes", [
    b"GET /echo HTTP/1.0\r\n\r\n",
    b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Close\r\n\r\n",
])
def test_a_client_that_closes_gets_its_answer_then_the_end(server: str, request_bytes: bytes) -> None:
    with _connect(server) as sock:
        sock.sendall(request_bytes + b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")  # never answered
        (answer,), rest = _answers(sock, 1)
        assert answer[0] == "HTTP/1.1 200 OK" and answer[1]["connection"] == "close"
        assert rest == b"" and _closed(sock)


def test_head_has_the_length_and_no_body(server: str) -> None:
    with _connect(server) as sock:
        sock.sendall(b"HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\nGET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        head = b""
        while head.count(b"\r\n\r\n") < 2 or not head.endswith(b"}"):
            data = sock.recv(65536)
            assert data
            head += data
        first, _, second = head.partition(b"\r\n\r\n")
        assert b"content-length: " in first and int(first.split(b"content-length: ")[1].split(b"\r\n")[0]) > 0
        assert second.startswith(b"HTTP/1.1 200 OK\r\n"), "the HEAD answer carried a body"
        assert json.loads(second.partition(b"\r\n\r\n")[2])["method"] == "GET"


@pytest.mark.security
@pytest.mark.parametrize("path", ["/injected", "/wide"])
def test_a_header_that_cannot_be_sent_is_a_500_not_an_injected_header(server: str, path: str) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
        (answer,), rest = _answers(sock, 1)
        status, headers, body = answer
        assert status == "HTTP/1.1 500 Internal Server Error"
        assert "set-cookie" not in headers and "x-name" not in headers
        assert "cannot send" in json.loads(body)["message"]
        assert headers["connection"] == "close" and rest == b"" and _closed(sock)


def test_a_malformed_request_is_a_400_and_the_end(server: str) -> None:
    with _connect(server) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd")
        (answer,), rest = _answers(sock, 1)
        assert answer[0] == "HTTP/1.1 400 Bad Request" and "malformed" in json.loads(answer[2])["message"]
        assert answer[1]["connection"] == "close" and _closed(sock)


def test_a_chunked_body_with_extensions_and_trailers_is_read_whole(server: str) -> None:
    with _connect(server) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n"
                     b"3;ext=1\r\nabc\r\n")
        sock.sendall(b"A\r\n0123456789\r\n0\r\nX-Trailer: yes\r\n\r\n"
                     b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        answers, _ = _answers(sock, 2)
        assert [json.loads(body)["body"] for _, _, body in answers] == ["abc0123456789", ""]
        # Many small chunks, most of them read at once.
        many = b"".join(b"1\r\n%c\r\n" % (ord("a") + i % 26) for i in range(100_000))
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + many + b"0\r\n\r\n")
        (answer,), _ = _answers(sock, 1)
        assert json.loads(answer[2])["body"] == "".join(chr(ord("a") + i % 26) for i in range(100_000))


@pytest.mark.security
@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
    (b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400),
    (b"GET /echo HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\n\r\n", 400),
    (b"GET /echo HTTP/1.1\r\nHost : x\r\n\r\n", 400),
    (b"GET /echo HTTP/1.1\r\n\r\n", 400),
    (b"GET /echo HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400),
    (b"GET /echo HTTP/2.0\r\nHost: x\r\n\r\n", 505),
    (b"GET /e cho HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    (b"GET /echo HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", 400),
    (b"GET /echo HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n", 400),
    (b"GET /echo HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n", 400),
    (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
    (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n", 400),
    (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n200000\r\n", 413),
    (b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (70 << 10) + b"\r\n\r\n", 431),
])
def test_what_is_no_request_is_refused_with_its_status_and_the_end(server: str, request_bytes: bytes,
                                                                 status: int) -> None:
    with _connect(server) as sock:
        sock.sendall(request_bytes)
        (answer,), _ = _answers(sock, 1)
        assert answer[0].split()[1] == str(status), answer
        assert answer[1]["connection"] == "close" and _closed(sock)


@pytest.mark.parametrize(("body", "too_deep"), [
    (b'{"command": "' + b"[" * 500 + b'"}', False),  # brackets in a string nest nothing
    (b'{"command": "x", "env": {}}', False),
    (b"[" * 100 + b"]" * 100, False),
    (b"[" * 101 + b"]" * 101, True),
])
def test_a_body_is_refused_for_its_nesting_only(body: bytes, too_deep: bool) -> None:
    from sandbox_server.errors import Unprocessable
    from sandbox_server.http import parse_model
    from sandbox_server.models import BashCommandRequest

    try:
        parse_model(body, BashCommandRequest)
    except Unprocessable as exc:
        assert ("deeper than the limit" in exc.message) is too_deep, exc.message
    else:
        assert not too_deep
