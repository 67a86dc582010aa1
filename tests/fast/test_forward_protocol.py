"""Forwards served below aiohttp (``control_plane.forward_protocol``): a connection that carries
only forwards is answered there, anything else hands it to aiohttp with the bytes read so far,
and either way a forward gets the same answer; on the in-process backend, over a raw socket."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from control_plane.app import FORWARDING

from .harness import IMAGE, run, served


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes,
                    answers: int = 1) -> list[tuple[int, dict[str, str], bytes]]:
    """Write ``data`` (one request or several, pipelined) and read ``answers`` answers."""
    writer.write(data)
    out = []
    for _ in range(answers):
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in head[1:] if line)}
        body = await reader.readexactly(int(headers["content-length"]))
        out.append((int(head[0].split()[1]), headers, body))
    return out


def _post(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: cp\r\nContent-Type: application/json\r\nPrefer: wait=30\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def test_a_connection_of_forwards_is_served_below_aiohttp_until_it_asks_for_anything_else(tmp_path: Path) -> None:
    """Can fail: every connection served by aiohttp (on main: no ``FORWARDING``, no connection of
    ours), or a hand-over that loses the bytes read (the pipelined request after the forward)."""
    async def scenario() -> None:
        async with served(tmp_path) as cp:
            from idegym_env.client import AsyncIdeGymClient

            async with AsyncIdeGymClient(cp.url, unix_socket=cp.unix_socket) as client:
                sandbox = await client.start(IMAGE)
                bash = f"/api/forward/{client.client_id}/{sandbox.server_id}/api/tools/bash"
                forwarding = cp.app[FORWARDING]
                reader, writer = await asyncio.open_unix_connection(cp.unix_socket)
                try:
                    [(status, headers, body)] = await _exchange(reader, writer, _post(bash, b'{"command": "echo hi"}'))
                    assert status == 200 and json.loads(body)["stdout"] == "hi\n"
                    assert headers["x-idegym-forwarded"] == "sandbox" and headers["preference-applied"] == "wait=30"
                    assert len(forwarding.connections) == 1  # served here, not by aiohttp
                    pipelined = _post(bash, b'{"command": "echo one"}') + b"GET /health HTTP/1.1\r\nHost: cp\r\n\r\n" \
                        + _post(bash, b'{"command": "echo two"}')
                    answers = await _exchange(reader, writer, pipelined, answers=3)
                    assert [a[0] for a in answers] == [200, 200, 200]
                    assert json.loads(answers[0][2])["stdout"] == "one\n"
                    assert json.loads(answers[1][2])["status"] == "healthy"
                    assert json.loads(answers[2][2])["stdout"] == "two\n"
                    assert answers[2][1]["x-idegym-forwarded"] == "sandbox"
                    assert forwarding.connections == set()  # aiohttp's now
                finally:
                    writer.close()

    run(scenario())


def test_a_forward_gets_the_same_answer_from_either_server(tmp_path: Path) -> None:
    """The sandbox's answer, a bad id (422), an unknown server (404) and a body too large for this
    path, on a connection of forwards and on one aiohttp took: the same statuses and bodies (but an
    error's timestamp), the same headers of ours."""
    async def scenario() -> None:
        async with served(tmp_path) as cp:
            from idegym_env.client import AsyncIdeGymClient

            async with AsyncIdeGymClient(cp.url, unix_socket=cp.unix_socket) as client:
                sandbox = await client.start(IMAGE)
                base = f"/api/forward/{client.client_id}"
                requests = [_post(f"{base}/{sandbox.server_id}/api/tools/bash", b'{"command": "echo hi"}'),
                            _post(f"{base}/{sandbox.server_id}/api/tools/bash", b'{"command": 7}'),
                            _post(f"/api/forward/not-a-uuid/{sandbox.server_id}/api/tools/bash", b"{}"),
                            _post(f"{base}/999999/api/tools/bash", b"{}"),
                            _post(f"{base}/{sandbox.server_id}/api/tools/bash",
                                  json.dumps({"command": "true", "pad": "x" * (70 << 10)}).encode())]
                answers = {}
                for via in ("ours", "aiohttp"):
                    reader, writer = await asyncio.open_unix_connection(cp.unix_socket)
                    try:
                        if via == "aiohttp":
                            await _exchange(reader, writer, b"GET /health HTTP/1.1\r\nHost: cp\r\n\r\n")
                        answers[via] = [await _exchange(reader, writer, r) for r in requests]
                    finally:
                        writer.close()
                for (ours,), (theirs,) in zip(answers["ours"], answers["aiohttp"], strict=True):
                    assert ours[0] == theirs[0]
                    mine, other = json.loads(ours[2]), json.loads(theirs[2])
                    for body in (mine, other):
                        if isinstance(body, dict):
                            body.pop("timestamp", None)
                            body.pop("duration_seconds", None)
                    assert mine == other
                    for name in ("content-type", "x-idegym-forwarded", "preference-applied"):
                        assert ours[1].get(name) == theirs[1].get(name), name
                assert [a[0][0] for a in answers["ours"]] == [200, 422, 422, 404, 200]

    run(scenario())


def test_a_connection_of_forwards_waits_for_a_head_no_longer_than_the_header_timeout(tmp_path: Path) -> None:
    """After an answer, and with a head that never ends, the connection is closed once the header
    timeout has passed (as aiohttp's keep-alive timer closes its own); while a forward is being
    answered it is not."""
    async def scenario() -> None:
        async with served(tmp_path, header_timeout=0.5) as cp:
            from idegym_env.client import AsyncIdeGymClient

            async with AsyncIdeGymClient(cp.url, unix_socket=cp.unix_socket) as client:
                sandbox = await client.start(IMAGE)
                bash = f"/api/forward/{client.client_id}/{sandbox.server_id}/api/tools/bash"
                reader, writer = await asyncio.open_unix_connection(cp.unix_socket)
                late = _post(bash, b'{"command": "sleep 0.8; echo late"}')
                [(status, _, body)] = await _exchange(reader, writer, late)
                assert status == 200 and json.loads(body)["stdout"] == "late\n"  # longer than the timeout
                loop = asyncio.get_running_loop()
                idle_since = loop.time()
                assert await asyncio.wait_for(reader.read(), 5) == b""
                assert 0.4 <= loop.time() - idle_since < 2
                writer.close()
                reader, writer = await asyncio.open_unix_connection(cp.unix_socket)
                writer.write(_post(bash, b"{}")[:40])
                started = loop.time()
                assert await asyncio.wait_for(reader.read(), 5) == b""
                assert 0.4 <= loop.time() - started < 2
                writer.close()
                assert cp.app[FORWARDING].connections == set()

    run(scenario())
