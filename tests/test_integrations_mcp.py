"""MCP: ``idegym mcp serve`` driven by the official SDK's own client, over stdio and streamable HTTP."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
from collections.abc import Iterator

import anyio
import pytest

pytest.importorskip("mcp")

from mcp.client import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

from tests.integration_helpers import TASK, alive, control_plane, fix_arguments  # noqa: E402,F401

pytestmark = pytest.mark.timeout(300)
TOOLS = ["reset", "bash", "read_file", "write_file", "edit_file", "patch_file", "run_checks", "submit"]


def serve_argv(cp_url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "idegym_env.cli", "mcp", "serve", "--task", TASK, "--control-plane-url", cp_url,
            *extra]


async def solve(client: Client) -> dict:
    """List the tools, solve the bundled task through them, return submit's structured result."""
    tools = await client.list_tools()
    assert [t.name for t in tools.tools] == TOOLS
    schema = next(t for t in tools.tools if t.name == "edit_file").input_schema
    assert schema["required"] == ["path", "start_line", "end_line", "new_content"]
    instruction = await client.call_tool("reset", {})
    assert not instruction.is_error and "Roman" in instruction.content[0].text
    listing = await client.call_tool("bash", {"command": "ls"})
    assert "roman.py" in listing.content[0].text
    edited = await client.call_tool("edit_file", fix_arguments())
    assert not edited.is_error, edited.content[0].text
    checks = await client.call_tool("run_checks", {})
    assert "OK" in checks.content[0].text
    result = await client.call_tool("submit", {})
    assert not result.is_error
    return result.structured_content


def test_stdio_solves_the_task_and_reports_errors_the_mcp_way(control_plane) -> None:  # noqa: F811
    async def main() -> None:
        server = StdioServerParameters(command=sys.executable, args=serve_argv(control_plane.url)[1:],
                                       env={**os.environ})
        async with Client(server) as client:
            # malformed calls: tool errors (isError) carrying our message
            bad = await client.call_tool("edit_file", {"path": "roman.py", "start_line": 4, "end_line": 1,
                                                        "new_content": "x"})
            assert bad.is_error and "end_line (1) is before start_line (4)" in bad.content[0].text
            missing = await client.call_tool("read_file", {"path": "nope.txt"})
            assert missing.is_error and "no such file" in missing.content[0].text.lower()
            await client.call_tool("write_file", {"path": "kept.txt", "content": "mine"})
            unknown = await client.call_tool("reset", {"task": "../../etc"})
            assert unknown.is_error and "not served here" in unknown.content[0].text
            kept = await client.call_tool("read_file", {"path": "kept.txt"})  # a refused reset ends nothing
            assert not kept.is_error and kept.content[0].text == "mine"
            result = await solve(client)
            assert result["reward"] == 1.0 and result["task_id"] == TASK
            assert result["checks"]["tests"]["scores"]["passed"] == 8
            assert alive(control_plane) == 0  # graded: the sandbox went back
            after = await client.call_tool("bash", {"command": "ls"})
            assert after.is_error and "has ended" in after.content[0].text
    anyio.run(main)
    assert alive(control_plane) == 0


def test_control_plane_down_is_a_protocol_error_not_a_reward(cp_local) -> None:
    async def main() -> None:
        server = StdioServerParameters(command=sys.executable, args=serve_argv(cp_local.url)[1:], env={**os.environ})
        async with Client(server) as client:
            await client.call_tool("reset", {})
            cp_local.kill()  # the control plane goes away mid-episode
            try:
                with pytest.raises(MCPError, match="infrastructure failure") as failure:
                    await client.call_tool("submit", {})
                assert failure.value.code == -32603
                again = await client.call_tool("bash", {"command": "ls"})
                assert again.is_error and "infrastructure failure" in again.content[0].text
            finally:
                cp_local.start()  # so that the fixture's stop() deletes what the killed one left

    anyio.run(main)


@pytest.fixture
def http_process(control_plane) -> Iterator[tuple[str, subprocess.Popen]]:  # noqa: F811
    proc = subprocess.Popen(serve_argv(control_plane.url, "--transport", "streamable-http", "--port", "0"),
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    url = None
    ready, _, _ = select.select([proc.stderr], [], [], 60)
    if ready:
        match = re.search(r"(http://\S+)", proc.stderr.readline())
        url = match.group(1) if match else None
    try:
        assert url, "the MCP server did not say where it listens"
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


@pytest.fixture
def http_server(http_process: tuple[str, subprocess.Popen]) -> str:
    return http_process[0]


def test_stateless_http_clients_run_separate_episodes_by_id(control_plane, http_server) -> None:  # noqa: F811
    async def main() -> None:
        async with Client(http_server) as first, Client(http_server) as second:  # 2026-07-28: no sessions
            one = (await first.call_tool("reset", {"new": True})).structured_content
            two = (await second.call_tool("reset", {"new": True})).structured_content
            assert one["episode_id"] != two["episode_id"] and one["task_id"] == TASK
            assert alive(control_plane) == 2  # a sandbox per episode
            await first.call_tool("write_file", {"path": "mine.txt", "content": "first",
                                                 "episode_id": one["episode_id"]})
            seen = await second.call_tool("bash", {"command": "ls mine.txt", "episode_id": two["episode_id"]})
            assert "No such file" in seen.content[0].text  # the episodes do not share a sandbox
            await first.call_tool("edit_file", {**fix_arguments(), "episode_id": one["episode_id"]})
            graded = (await first.call_tool("submit", {"episode_id": one["episode_id"]})).structured_content
            assert graded["reward"] == 1.0 and graded["episode_id"] == one["episode_id"]
            untouched = (await second.call_tool("submit", {"episode_id": two["episode_id"]})).structured_content
            assert untouched["reward"] < 1.0
            assert alive(control_plane) == 0
            stale = await first.call_tool("bash", {"command": "ls", "episode_id": "no-such-episode"})
            assert stale.is_error and "unknown episode" in stale.content[0].text

    anyio.run(main)


def test_legacy_http_session_has_its_own_episode_ended_with_the_session(control_plane,  # noqa: F811
                                                                        http_server) -> None:
    async def main() -> None:
        async with Client(http_server, mode="legacy") as client:  # initialize handshake, mcp-session-id
            result = await solve(client)
            assert result["reward"] == 1.0
            await client.call_tool("reset", {})
            assert alive(control_plane) == 1
        # the client's DELETE ended the session, and with it the episode

    anyio.run(main)
    assert alive(control_plane) == 0


def test_server_exit_hands_open_episodes_back(control_plane, http_process) -> None:  # noqa: F811
    url, proc = http_process

    async def main() -> None:
        async with Client(url) as client:
            await client.call_tool("reset", {"new": True})
            await client.call_tool("reset", {})

    anyio.run(main)
    assert alive(control_plane) == 2
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    assert alive(control_plane) == 0


def test_idle_episodes_are_handed_back(control_plane) -> None:  # noqa: F811
    from idegym_env.integrations._episode import close_shared_clients
    from idegym_env.integrations.mcp import EpisodeServer

    server = EpisodeServer(task=TASK, control_plane_url=control_plane.url, idle_timeout=0.2)

    async def main() -> None:
        async with Client(server.mcp) as client:  # the SDK's in-process connection to the same server
            await client.call_tool("reset", {"new": True})
            await client.call_tool("bash", {"command": "true"})  # the default episode starts on first use
            assert alive(control_plane) == 2 and server.session_count == 2
            await anyio.sleep(0.5)
            server.end_idle()
            assert alive(control_plane) == 0 and server.session_count == 0

    try:
        anyio.run(main)
    finally:
        server.close()
        close_shared_clients()
