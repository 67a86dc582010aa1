"""The clients' HTTP sessions, the sync one (``idegym_env/client/_http.py``) and the async one
(``_http_async.py``, driven here on one event loop of its own), against a real HTTP/1.1 server:
kept-alive connections, one the server closed while idle, timeouts, Unix sockets, every framing
of an answer, bad answers and requests that must never be sent."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import http.server
import io
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from idegym_env.client import AsyncSandbox, Sandbox
from idegym_env.client._http import HTTPSession
from idegym_env.client._http_async import AsyncHTTPSession
from tests.helpers import SandboxProcess


class AsyncSession:
    """An ``AsyncHTTPSession`` called like the sync one: every request on the same event loop."""

    def __init__(self, *args: Any, loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
                 **kwargs: Any) -> None:
        self._runner = asyncio.Runner(loop_factory=loop_factory)
        self.session = AsyncHTTPSession(*args, **kwargs)

    def request(self, *args: Any, **kwargs: Any) -> Any:
        return self._runner.run(self.session.request(*args, **kwargs))

    def wait_until_idle_dropped(self) -> None:
        """Until the server's close has reached the (one) idle connection."""
        deadline = time.monotonic() + 5
        while self.session._idle[0].idle_usable(self._runner.get_loop().time()):
            assert time.monotonic() < deadline, "the server's close never reached the idle connection"
            self._runner.run(asyncio.sleep(0.01))

    def close(self) -> None:
        if not self.session._closed:
            self._runner.run(self.session.aclose())
            self._runner.close()


class SyncSession(HTTPSession):
    def wait_until_idle_dropped(self) -> None:
        assert select.select([self._idle[0].sock], [], [], 5)[0]  # the server's close reached it


@pytest.fixture(params=["sync", "async", "async-uvloop"])
def make(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """A session of either kind (the async one on asyncio's loop and on uvloop's, whose transports
    are not asyncio's); closed at the end of the test."""
    made: list[Any] = []

    def session(*args: Any, **kwargs: Any) -> Any:
        if request.param == "sync":
            made.append(SyncSession(*args, **kwargs))
        else:
            made.append(AsyncSession(*args, **kwargs, loop_factory=uvloop.new_event_loop
                                     if request.param == "async-uvloop" else None))
        return made[-1]

    yield session
    for one in made:
        one.close()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body.get("sleep"):
            time.sleep(body["sleep"])
        out = json.dumps({"got": body, "auth": self.headers.get("Authorization"),
                          "peer": self.client_address and str(self.client_address),
                          "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.send_header("X-Mixed-Case", "yes")
        if body.get("keep_alive"):
            self.send_header("Keep-Alive", body["keep_alive"])
        self.end_headers()
        self.wfile.write(out)
        if body.get("then_close"):  # keep-alive promised, then the connection dropped while idle
            self.close_connection = True

    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        out = json.dumps({"length": len(body), "sha256": hashlib.sha256(body).hexdigest()}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


class UnixServer(http.server.ThreadingHTTPServer):
    address_family = socket.AF_UNIX

    def get_request(self):  # noqa: ANN201 - socketserver's shape
        conn, _ = self.socket.accept()
        return conn, ("unix", 0)


@pytest.fixture
def server() -> Iterator[http.server.ThreadingHTTPServer]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_connections_are_kept_alive_and_one_the_server_dropped_is_not_reused(server, make) -> None:
    """Can fail: without the readability check on checkout, the second call goes out on the
    connection the server closed and fails (RemoteDisconnected)."""
    session = make(f"http://127.0.0.1:{server.server_address[1]}/base", auth=("u", "p"))
    try:
        one = session.request("POST", "/x", json={"n": 1}, params={"q": "a b"})
        two = session.request("POST", "/x", json={"n": 2})
        assert one.status_code == two.status_code == 200
        assert one.headers["x-mixed-case"] == "yes"
        first, second = json.loads(one.content), json.loads(two.content)
        assert first["path"] == "/base/x?q=a+b" and first["auth"] == "Basic dTpw"
        assert first["peer"] == second["peer"]  # the same connection
        session.request("POST", "/x", json={"then_close": True})
        session.wait_until_idle_dropped()
        after = json.loads(session.request("POST", "/x", json={"n": 3}).content)
        assert after["got"] == {"n": 3} and after["peer"] != second["peer"]
    finally:
        session.close()


def test_a_connection_idle_past_the_expiry_is_not_reused(server, make, monkeypatch) -> None:
    """A server closes a connection idle past its own limit; one reused just as it does is reset
    under the request. Can fail: without the expiry, the call after the idle goes out on the same
    connection."""
    import idegym_env.client._http as sync_http
    import idegym_env.client._http_async as async_http
    for module in (sync_http, async_http):
        monkeypatch.setattr(module, "KEEPALIVE_EXPIRY", 0.3)
    session = make(f"http://127.0.0.1:{server.server_address[1]}")
    try:
        peers = [json.loads(session.request("POST", "/x", json={"n": n}).content)["peer"] for n in (1, 2)]
        time.sleep(0.5)  # idle past the expiry (the server keeps the connection open)
        peers.append(json.loads(session.request("POST", "/x", json={"n": 3}).content)["peer"])
        assert peers[0] == peers[1] != peers[2], peers
    finally:
        session.close()


def test_a_connection_is_reused_within_the_idle_limit_its_server_says(server, make, monkeypatch) -> None:
    """``Keep-Alive: timeout=2``, less the margin (half of it, as it is under twice the 2 s margin): reused
    for 1 s of idle, not past it, whatever the default. Can fail: with the header ignored, the default
    (100 s here) reuses it; with the whole margin taken off 2 s, the first two calls are not one connection."""
    import idegym_env.client._http as sync_http
    import idegym_env.client._http_async as async_http
    for module in (sync_http, async_http):
        monkeypatch.setattr(module, "KEEPALIVE_EXPIRY", 100.0)
    session = make(f"http://127.0.0.1:{server.server_address[1]}")
    try:
        def peer() -> str:
            return json.loads(session.request("POST", "/x", json={"keep_alive": "timeout=2, max=100"}).content)["peer"]

        peers = [peer(), peer()]
        time.sleep(1.3)  # idle past what the server said, less the margin
        peers.append(peer())
        assert peers[0] == peers[1] != peers[2], peers
    finally:
        session.close()


def test_no_answer_within_the_timeout_raises_and_drops_the_connection(server, make) -> None:
    session = make(f"http://127.0.0.1:{server.server_address[1]}")
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            session.request("POST", "/slow", json={"sleep": 10}, timeout=0.3)
        assert time.monotonic() - started < 5  # the timeout's, not the 10 s answer's, at any load
        assert json.loads(session.request("POST", "/x", json={"n": 1}).content)["got"] == {"n": 1}
    finally:
        session.close()
    with pytest.raises(RuntimeError, match="closed"):
        session.request("POST", "/x", json={})


def test_unix_sockets_and_a_clear_error_when_nothing_listens(tmp_path: Path, make) -> None:
    path = str(tmp_path / "s.sock")
    srv = UnixServer(path, Handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        session = make("http://sandbox", unix_socket=path)
        assert json.loads(session.request("POST", "/x", json={"n": 1}).content)["got"] == {"n": 1}
        session.close()
    finally:
        srv.shutdown()
        srv.server_close()
    with pytest.raises(OSError):
        make("http://sandbox", unix_socket=str(tmp_path / "none.sock")).request("POST", "/x", json={})
    with pytest.raises(ValueError, match="not an http"):
        make("ftp://x")



class Scripted:
    """A TCP server that answers the requests it reads, on whatever connection, with the next
    step of ``script``: raw bytes, then whether to close the connection (an answer of None closes
    it without answering). It records every request and counts connections."""

    def __init__(self, script: list[tuple[bytes | None, bool]]) -> None:
        self.script = list(script)
        self.requests: list[bytes] = []
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while self.script:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                data = b""
                while self.script:
                    while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                        data += chunk
                    if b"\r\n\r\n" not in data:
                        break
                    head, _, data = data.partition(b"\r\n\r\n")
                    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length:")), 0)
                    while len(data) < length:
                        data += conn.recv(65536)
                    self.requests.append(head + b"\r\n\r\n" + data[:length])
                    data = data[length:]
                    answer, close = self.script.pop(0)
                    if answer is not None:
                        conn.sendall(answer)
                    if close or answer is None:
                        break

    def close(self) -> None:
        self.listener.close()


def test_every_framing_of_an_answer_is_read(make) -> None:
    """The session reads answers itself (not with http.client): Content-Length, chunked (with an
    extension and trailers), 204 and HEAD without a body, an interim 100 skipped, a folded header,
    an HTTP/1.0 answer delimited by the connection's end; ``Connection: close`` is obeyed. A
    request goes out in one piece: head (Host, Content-Length) and body."""
    script = [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Folded: a\r\n b\r\n\r\nok", False),
        (b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nT: x\r\n\r\n",
         False),
        (b"HTTP/1.1 204 No Content\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", False),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n1", False),
        (b"HTTP/1.0 200 OK\r\n\r\nuntil the end", True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbye", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlast", False),
    ]
    server = Scripted(script)
    session = make(f"http://127.0.0.1:{server.port}")
    try:
        first = session.request("POST", "/a", json={"n": 1}, headers={"Prefer": "wait=5"})
        assert (first.status_code, first.content, first.headers["x-folded"]) == (200, b"ok", "a b")
        got = [(r.status_code, r.content) for r in (session.request("GET", "/b"), session.request("POST", "/c"),
                                                    session.request("HEAD", "/d"), session.request("POST", "/e"),
                                                    session.request("GET", "/f"))]
        assert got == [(201, b"abcde"), (204, b""), (200, b""), (200, b"1"), (200, b"until the end")]
        assert server.connections == 1  # all on one kept-alive connection, until the HTTP/1.0 answer
        assert session.request("GET", "/g").content == b"bye" and server.connections == 2
        assert session.request("GET", "/h").content == b"last" and server.connections == 3  # not reused
    finally:
        session.close()
        server.close()
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /a HTTP/1.1" and b"Host: 127.0.0.1:%d" % server.port in lines
    assert b"Content-Length: 7" in lines and b"Prefer: wait=5" in lines and body == b'{"n":1}'
    assert not any(line.startswith(b"Content-Length") for line in server.requests[1].split(b"\r\n"))  # a GET


def test_a_bad_answer_is_an_http_client_error_and_a_bad_request_is_never_sent(make) -> None:
    server = Scripted([
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", True),
        (b"HTTP/9 200 OK\r\n\r\n", True),
        (None, True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", False),
    ])
    session = make(f"http://127.0.0.1:{server.port}")
    try:
        with pytest.raises(http.client.IncompleteRead):
            session.request("GET", "/truncated")
        with pytest.raises(http.client.BadStatusLine):
            session.request("GET", "/bad-status")
        with pytest.raises(http.client.RemoteDisconnected):
            session.request("GET", "/no-answer")
        with pytest.raises(ValueError, match="line break"):
            session.request("GET", "/x", headers={"X-Evil": "a\r\nX-Injected: 1"})
        with pytest.raises(http.client.InvalidURL):
            session.request("GET", "/a b")
        assert session.request("GET", "/fine").content == b"ok"
    finally:
        session.close()
        server.close()
    assert [r.split(b" ")[1] for r in server.requests] == [b"/truncated", b"/bad-status", b"/no-answer", b"/fine"]


def test_a_body_streamed_from_a_file_arrives_whole(server, make) -> None:
    """A build's upload goes out from a file, a chunk at a time (more than one chunk here)."""
    data = bytes(range(256)) * (5 << 12)  # 5 MiB
    session = make(f"http://127.0.0.1:{server.server_address[1]}")
    for _ in range(2):  # and the connection carries the next request
        answer = json.loads(session.request("PUT", "/up", content=io.BytesIO(data), content_length=len(data)).content)
        assert answer == {"length": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_the_async_client_costs_its_caller_about_what_the_sync_one_does(tmp_path: Path) -> None:
    """Can fail: over httpx the async client spent ~5x the sync client's CPU on the same bash call
    (~0.8 ms more: URL and header models, anyio's cancel scopes, head and body written apart).
    The caller's own thread's CPU is compared, the least of three blocks of each: load on the
    machine hardly moves it, unlike a latency. An event loop's own wake-ups cost ~30-100 µs a call
    more than blocking reads (quiet: 0.23-0.25 ms against 0.135, 1.7-1.8x; so the bound is 2.5x,
    which the httpx client's 5x is far above)."""
    project = tmp_path / "project"
    project.mkdir()
    proc = SandboxProcess(project, "tcp", tmp_path)
    url = f"http://127.0.0.1:{proc.port}"
    sync, runner = Sandbox.connect(url), asyncio.Runner()
    asynchronous = AsyncSandbox.connect(url)

    async def async_block(n: int) -> float:
        started = time.thread_time()
        for _ in range(n):
            assert (await asynchronous.bash("echo hello")).stdout == "hello\n"
        return time.thread_time() - started

    def sync_block(n: int) -> float:
        started = time.thread_time()
        for _ in range(n):
            assert sync.bash("echo hello").stdout == "hello\n"
        return time.thread_time() - started

    try:
        sync_block(10), runner.run(async_block(10))  # connections made, code warm
        sync_cpu = min(sync_block(50) for _ in range(3))
        async_cpu = min(runner.run(async_block(50)) for _ in range(3))
    finally:
        runner.run(asynchronous.close())
        runner.close()
        sync.close()
        proc.stop()
    assert async_cpu <= 2.5 * sync_cpu, f"async {async_cpu * 20:.3f} ms a call, sync {sync_cpu * 20:.3f} ms"
