"""The env's two hops of a model call in pass-through mode (the direct channel to the sandbox
server, the model server) write each request in one piece: a head and a body written apart wake
the server twice (``benchmarks/agent_gateway.py``)."""

from __future__ import annotations

import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idegym_env.agents.channel import DirectChannel
from idegym_env.agents.upstream import Upstream
from sandbox_server.models import AgentExchangeRequest, AgentExchangeResponse, AgentState, ModelReply
from tests import agent_policies as policies


class _Counted(socket.socket):
    """A socket that counts the writes made on it."""

    def __init__(self, sock: socket.socket) -> None:
        timeout = sock.gettimeout()
        super().__init__(sock.family, sock.type, sock.proto, fileno=sock.detach())
        self.settimeout(timeout)
        self.writes = 0

    def send(self, data: Any, *args: Any) -> int:
        self.writes += 1
        return super().send(data, *args)

    def sendall(self, data: Any, *args: Any) -> None:
        self.writes += 1
        super().sendall(data, *args)


class _CountedListener(socket.socket):
    def accept(self) -> tuple[socket.socket, Any]:
        sock, address = super().accept()
        self.accepted = _Counted(sock)
        return self.accepted, address


@pytest.fixture
def model_url() -> Iterator[str]:
    with policies.fixed_model() as url:
        yield url


def test_a_request_to_the_model_server_is_one_write(model_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[_Counted] = []
    connect = socket.create_connection

    def counted(*args: Any, **kwargs: Any) -> socket.socket:
        made.append(_Counted(connect(*args, **kwargs)))
        return made[-1]

    monkeypatch.setattr(socket, "create_connection", counted)
    upstream = Upstream(model_url, "k", 10.0)
    try:
        for _ in range(3):
            upstream.chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    finally:
        upstream.close()
    assert len(made) == 1 and made[0].writes == 3  # one kept-alive connection, a write a call


def test_an_exchange_on_the_direct_channel_is_one_write() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as root:  # a socket's path: 107 bytes at most
        _exchange_three_times(DirectChannel(Path(root)))


def _exchange_three_times(channel: DirectChannel) -> None:
    assert channel._listener is not None
    listener = _CountedListener(fileno=channel._listener.detach())
    channel._listener = listener
    server = socket.socket(socket.AF_UNIX)
    answer = AgentExchangeResponse(call=None, agent=AgentState(running=True)).model_dump_json().encode()
    try:
        server.connect(str(channel.path))
        server.sendall(channel.secret.encode() + b"\n")
        assert channel.accept()
        got = threading.Event()

        def serve() -> None:  # the sandbox server's side: three requests, each answered
            with server.makefile("rb") as stream:
                for _ in range(3):
                    length = 0
                    while (line := stream.readline()) not in (b"\r\n", b""):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":")[1])
                    AgentExchangeRequest.model_validate_json(stream.read(length))
                    server.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                   b"content-length: %d\r\n\r\n%s" % (len(answer), answer))
            got.set()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        for n in range(3):
            reply = ModelReply(call_id=f"call-{n}", body_base64="e30=") if n else None
            assert channel.exchange(AgentExchangeRequest(reply=reply, wait=1.0)).call is None
        thread.join(10)
        assert got.is_set()
        assert listener.accepted.writes == 3
    finally:
        server.close()
        channel.close()
