"""Stdio tool calls started early (``idegym_env.integrations._mcp_early``): before the SDK's dispatch,
only when the SDK is sure to hand them to the handler as they stand, and never ahead of an earlier
request. The server runs as stdio serves it (``EpisodeServer.serve_streams``) over in-memory streams
that carry raw JSON-RPC messages, parsed by the SDK's own adapter as its stdio transport parses them,
in both eras: the 2026-07-28 per-request envelope (the SDK's own ``Client``) and the handshake."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

import mcp_types as types  # noqa: E402
from mcp.shared._context_streams import create_context_streams  # noqa: E402
from mcp.shared.message import SessionMessage  # noqa: E402
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY  # noqa: E402
from mcp_types.version import LATEST_MODERN_VERSION  # noqa: E402

from idegym_env.integrations._episode import close_shared_clients  # noqa: E402
from idegym_env.integrations.mcp import EpisodeServer  # noqa: E402
from tests.integration_helpers import TASK, alive, control_plane  # noqa: E402,F401

pytestmark = pytest.mark.timeout(120)
ENVELOPE = {PROTOCOL_VERSION_META_KEY: LATEST_MODERN_VERSION, CLIENT_CAPABILITIES_META_KEY: {},
            CLIENT_INFO_META_KEY: {"name": "test", "version": "0"}}
ERAS = ["envelope", "handshake"]


class Wire:
    """One client's side of a stdio connection: raw JSON-RPC messages out, the server's answers in."""

    def __init__(self, send: Any, receive: Any, era: str) -> None:
        self._send, self._receive = send, receive
        self.era = era
        self._next = 0
        self.answers: dict[Any, dict] = {}

    async def send(self, message: dict) -> None:
        await self._send.send(SessionMessage(types.jsonrpc_message_adapter.validate_python(message, by_name=False)))

    async def ask(self, method: str, params: dict | None = None) -> int:
        """Send a request (on an envelope connection, with the envelope unless it has a ``_meta``); its id."""
        self._next += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next, "method": method}
        if self.era == "envelope" and "_meta" not in (params or {}):
            params = {**(params or {}), "_meta": ENVELOPE}
        if params is not None:
            message["params"] = params
        await self.send(message)
        return self._next

    async def answer(self, request: Any) -> dict:
        """The server's answer to request ``request`` (answers to others are kept for later)."""
        with anyio.fail_after(60):
            while request not in self.answers:
                item = await self._receive.receive()
                message = item.message.model_dump(by_alias=True, exclude_unset=True, mode="json")
                if "id" in message and "method" not in message:
                    self.answers[message["id"]] = message
        return self.answers.pop(request)

    async def call(self, name: str, arguments: dict, **params: Any) -> dict:
        """A tool call and its answer (a result, or a JSON-RPC error)."""
        return await self.answer(await self.ask("tools/call", {"name": name, "arguments": arguments, **params}))

    async def bash(self, command: str) -> str:
        answer = await self.call("bash", {"command": command})
        assert not answer["result"]["isError"], answer
        return answer["result"]["content"][0]["text"]


@asynccontextmanager
async def connected(server: EpisodeServer, era: str) -> AsyncIterator[Wire]:
    """A client connected to ``server`` served as stdio serves it: its first request carries the
    2026-07-28 envelope (``era="envelope"``), or it is past the initialize handshake."""
    to_server, server_reads = create_context_streams[Any](0)
    server_writes, from_server = create_context_streams[Any](0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve_streams, server_reads, server_writes)
        wire = Wire(to_server, from_server, era)
        if era == "envelope":
            found = await wire.answer(await wire.ask("server/discover"))
            assert LATEST_MODERN_VERSION in found["result"]["supportedVersions"], found
        else:
            opened = await wire.answer(await wire.ask("initialize", {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}))
            assert opened["result"]["protocolVersion"] == "2025-06-18"
            await wire.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        try:
            yield wire
        finally:
            await to_server.aclose()  # the client goes: serving ends


@pytest.fixture
def server(control_plane) -> Any:  # noqa: F811
    server = EpisodeServer(task=TASK, control_plane_url=control_plane.url)
    yield server
    server.close()
    close_shared_clients()
    assert alive(control_plane) == 0


@pytest.mark.parametrize("era", ERAS)
def test_a_running_episodes_calls_start_early_and_answer_as_before(server: EpisodeServer, era: str) -> None:
    """Can fail: with the SDK dispatching first (no early start) the count stays 0."""
    async def main() -> None:
        async with connected(server, era) as wire:
            reset = await wire.call("reset", {})
            assert not reset["result"]["isError"]
            assert server.early_started == 0  # reset runs on a worker thread, as before
            assert (await wire.bash("echo $((6 * 7))")).startswith("42\n")
            written = await wire.call("write_file", {"path": "kept.txt", "content": "mine"})
            assert not written["result"]["isError"], written
            read = await wire.call("read_file", {"path": "kept.txt"})
            assert read["result"]["content"][0]["text"] == "mine"
            missing = await wire.call("read_file", {"path": "nope.txt"})  # the tool's error, as before
            assert missing["result"]["isError"] and "no such file" in missing["result"]["content"][0]["text"].lower()
            bad = await wire.call("bash", {})  # the arguments refused: the handler's own refusal
            assert bad["result"]["isError"] and "invalid arguments" in bad["result"]["content"][0]["text"]
            assert server.early_started == 4

    anyio.run(main)


REFUSED = {  # era -> requests (params beyond name and arguments) the SDK refuses before the handler
    "envelope": [
        {"_meta": {}},  # no envelope on an envelope connection
        {"_meta": {**ENVELOPE, PROTOCOL_VERSION_META_KEY: "2099-01-01"}},  # a version it does not serve
        {"_meta": {**ENVELOPE, PROTOCOL_VERSION_META_KEY: 20260728}},
        {"_meta": {**ENVELOPE, "progressToken": [1]}},
        {"_meta": {**ENVELOPE, CLIENT_CAPABILITIES_META_KEY: 5}},  # the protocol's surface refuses these two,
        {"_meta": {**ENVELOPE, "io.modelcontextprotocol/logLevel": "loud"}},  # the params model would not
        {"task": {"ttl": "soon"}},
    ],
    "handshake": [
        {"_meta": ENVELOPE},  # the envelope on a handshake connection
        {"_meta": {"progressToken": [1]}},
        {"task": {"ttl": "soon"}},
    ],
}


@pytest.mark.parametrize("era", ERAS)
def test_a_request_the_sdk_refuses_never_runs(server: EpisodeServer, era: str) -> None:
    """A request the SDK refuses before its handler runs has not run its command. Can fail: started
    when its message is read (without the SDK's checks first), the command ran."""
    async def main() -> None:
        async with connected(server, era) as wire:
            await wire.call("reset", {})
            for params in REFUSED[era]:
                if era == "envelope" and "_meta" not in params:
                    params = {**params, "_meta": ENVELOPE}
                answer = await wire.call("bash", {"command": "echo ran >> ran.txt"}, **params)
                assert "error" in answer, (params, answer)
            assert server.early_started == 0
            assert (await wire.bash("cat ran.txt 2>&1 || true")).startswith("cat: ran.txt: No such file")
            assert server.early_started == 1

    anyio.run(main)


@pytest.mark.parametrize("era", ERAS)
def test_no_call_starts_early_while_another_request_is_unanswered(server: EpisodeServer, era: str) -> None:
    """``submit`` and a ``bash`` sent at once go as the SDK dispatches them (concurrently: the
    handlers' order is not the wire's): the bash does not start ahead of its dispatch, while submit
    is unanswered. Can fail: without the check for unanswered requests, the bash starts early."""
    async def main() -> None:
        async with connected(server, era) as wire:
            await wire.call("reset", {})
            submit = await wire.ask("tools/call", {"name": "submit", "arguments": {}})
            after = await wire.ask("tools/call", {"name": "bash", "arguments": {"command": "echo after"}})
            graded, late = await wire.answer(submit), await wire.answer(after)
            assert not graded["result"]["isError"] and "reward" in graded["result"]["structuredContent"]
            assert "result" in late, late  # ran, or found the episode ended: either is the SDK's dispatch
            assert server.early_started == 0

    anyio.run(main)


async def in_flight(server: EpisodeServer) -> Any:
    """The connection's episode once a call of it has started early and holds it."""
    slot = server._slots[server._main["local"]]
    with anyio.fail_after(30):
        while not slot.lock.locked():
            await anyio.sleep(0.01)
    assert server.early_started == 1
    return slot


@pytest.mark.parametrize("era", ERAS)
def test_a_cancelled_call_started_early_frees_its_episode(server: EpisodeServer, era: str) -> None:
    """The client cancels a call started early: the call is cancelled (not left to sleep its 30 s),
    no answer comes, and the next call takes the episode and starts early at once."""
    async def main() -> None:
        async with connected(server, era) as wire:
            await wire.call("reset", {})
            slow = await wire.ask("tools/call", {"name": "bash", "arguments": {"command": "sleep 30"}})
            slot = await in_flight(server)
            await wire.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                             "params": {"requestId": slow, "reason": "the test"}})
            with anyio.fail_after(10):
                while slot.lock.locked():
                    await anyio.sleep(0.01)
            assert (await wire.bash("echo next")).startswith("next\n")
            assert server.early_started == 2 and not server._early
            assert slow not in wire.answers

    anyio.run(main)


def test_a_call_in_flight_when_the_client_goes_is_cancelled_and_nothing_is_held(server: EpisodeServer) -> None:
    held: list[Any] = []

    async def main() -> None:
        async with connected(server, "envelope") as wire:
            await wire.call("reset", {})
            await wire.ask("tools/call", {"name": "bash", "arguments": {"command": "sleep 30"}})
            held.append(await in_flight(server))

    started = time.monotonic()
    anyio.run(main)
    assert time.monotonic() - started < 20  # not the sleep's 30 s
    assert not server._early and not held[0].lock.locked()  # serving ended: the call went with it


def test_with_tracing_on_no_call_starts_before_its_span(control_plane, monkeypatch) -> None:  # noqa: F811
    """With OpenTelemetry set up, the SDK's middleware stays and every call goes through it."""
    monkeypatch.setenv("OTEL_SERVICE_NAME", "idegym-test")
    server = EpisodeServer(task=TASK, control_plane_url=control_plane.url)
    assert server.mcp.middleware

    async def main() -> None:
        async with connected(server, "envelope") as wire:
            await wire.call("reset", {})
            assert (await wire.bash("echo traced")).startswith("traced\n")
        assert server.early_started == 0

    try:
        anyio.run(main)
    finally:
        server.close()
        close_shared_clients()
