"""MCP: ``idegym mcp serve`` driven by the official SDK's own client, over stdio and streamable HTTP."""

from __future__ import annotations

import base64
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

pytest.importorskip("mcp")

import httpx2  # noqa: E402 - the MCP SDK's HTTP client
from mcp.client import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

from tests.integration_helpers import TASK, alive, control_plane, fix_arguments  # noqa: E402,F401

pytestmark = pytest.mark.timeout(300)
TOOL_NAMES = ["reset", "bash", "read_file", "write_file", "edit_file", "patch_file", "list_files", "run_checks",
              "submit"]


def serve_argv(cp_url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "idegym_env.cli", "mcp", "serve", "--task", TASK, "--control-plane-url", cp_url,
            *extra]


async def solve(client: Client) -> dict:
    """List the tools, solve the bundled task through them, return submit's structured result."""
    tools = await client.list_tools()
    assert [t.name for t in tools.tools] == TOOL_NAMES
    schema = next(t for t in tools.tools if t.name == "edit_file").input_schema
    assert schema["required"] == ["path", "start_line", "end_line", "new_content"]
    instruction = await client.call_tool("reset", {})
    assert not instruction.is_error and "Roman" in instruction.content[0].text
    listing = await client.call_tool("bash", {"command": "ls"})
    assert "roman.py" in listing.content[0].text
    assert listing.structured_content == {"result": listing.content[0].text}  # the wire MCPServer gave
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


@pytest.mark.security
def test_a_bash_call_cannot_ask_for_more_time_than_the_server_allows(control_plane) -> None:  # noqa: F811
    """Can fail: without the cap the call asks for 3600 s and the sleep runs its full 30 s (seen on
    the code before the cap in ``BashCall.to_request``)."""
    async def main() -> None:
        server = StdioServerParameters(command=sys.executable,
                                       args=serve_argv(control_plane.url, "--bash-timeout", "2")[1:],
                                       env={**os.environ})
        async with Client(server) as client:
            await client.call_tool("reset", {})
            started = anyio.current_time()
            long = await client.call_tool("bash", {"command": "sleep 30; echo overslept", "timeout": 3600})
            took = anyio.current_time() - started
            text = long.content[0].text
            assert "timed out" in text and "overslept" not in text, text
            assert took < 10, f"the call ran {took:.1f} s past a 2 s limit"
            assert "capped at 2 s" in text, text

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


async def refusal(client: Client, tool: str | None = None) -> str:
    """Why ``client`` could not connect (or call ``tool``): the MCP errors' messages."""
    try:
        async with client:
            if tool is not None:
                await client.call_tool(tool, {})
    except Exception as exc:  # noqa: BLE001 - the SDK raises from its task group: an ExceptionGroup
        pending, messages = [exc], []
        while pending:
            error = pending.pop()
            pending.extend(getattr(error, "exceptions", ()))
            if isinstance(error, MCPError):
                messages.append(str(error))
        return "; ".join(messages)
    raise AssertionError("the client connected")


class HttpServer:
    """An ``idegym mcp serve --transport streamable-http`` process with a token of its own."""

    def __init__(self, cp_url: str, token_dir: Path, *extra: str) -> None:
        self.proc = subprocess.Popen(serve_argv(cp_url, "--transport", "streamable-http", "--port", "0",
                                                "--token-dir", str(token_dir), *extra),
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        assert self.proc.stderr is not None
        self.banner = ""
        deadline = time.monotonic() + 60
        while "idegym MCP server on" not in self.banner and time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stderr], [], [], deadline - time.monotonic())
            if not ready:
                break
            line = self.proc.stderr.readline()
            if not line:
                break
            self.banner += line
        match = re.search(r"(http://\S+)", self.banner)
        assert match, f"the MCP server did not say where it listens: {self.banner}"
        self.plain_url = match.group(1)
        token_file = token_dir / "token"
        self.token = token_file.read_text().strip() if token_file.exists() else None
        # HTTP Basic in the URL: user idegym, the token as password
        self.url = self.plain_url.replace("http://", f"http://idegym:{self.token}@") if self.token else self.plain_url

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


@pytest.fixture
def start_http(control_plane, tmp_path: Path) -> Iterator[Callable[..., HttpServer]]:  # noqa: F811
    servers: list[HttpServer] = []

    def start(*extra: str, token_dir: Path | None = None) -> HttpServer:
        server = HttpServer(control_plane.url, token_dir or tmp_path / f"token{len(servers)}", *extra)
        servers.append(server)
        return server

    yield start
    for server in servers:
        assert server.stop() == 0


@pytest.fixture
def http_process(start_http: Callable[..., HttpServer]) -> HttpServer:
    return start_http()


@pytest.fixture
def http_server(http_process: HttpServer) -> str:
    return http_process.url


@pytest.mark.security
def test_http_needs_the_token_on_every_request(http_process: HttpServer, start_http, tmp_path: Path) -> None:
    """Can fail: before the token, any caller that reached the port could reset episodes and run
    commands in sandboxes (seen on the code before this check)."""
    server = http_process
    token_file = tmp_path / "token0" / "token"
    assert server.token and token_file.stat().st_mode & 0o777 == 0o600
    assert "Authorization: Bearer" in server.banner and str(token_file) in server.banner
    for method, path in (("POST", "/mcp"), ("GET", "/mcp"), ("DELETE", "/mcp"), ("GET", "/elsewhere")):
        for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {server.token}x"},
                     {"Authorization": "Basic " + base64.b64encode(f"someone:{server.token}".encode()).decode()}):
            answer = httpx.request(method, server.plain_url.replace("/mcp", path), headers=auth,
                                   json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert answer.status_code == 401, (method, path, auth, answer.text)
            assert "needs credentials" in answer.json()["error"]["message"]

    async def main() -> None:
        assert "needs credentials" in await refusal(Client(server.plain_url))
        async with Client(server.url) as client:  # HTTP Basic, the token as password
            assert not (await client.call_tool("bash", {"command": "true"})).is_error
        bearer = httpx2.AsyncClient(headers={"Authorization": f"Bearer {server.token}"})
        async with bearer, Client(streamable_http_client(server.plain_url, http_client=bearer)) as client:
            assert not (await client.call_tool("bash", {"command": "true"})).is_error

    anyio.run(main)
    assert start_http(token_dir=token_file.parent).token == server.token  # made once, then kept
    open_server = start_http("--auth", "none")
    assert "AUTHENTICATION IS OFF" in open_server.banner and open_server.token is None

    async def without_credentials() -> None:
        async with Client(open_server.plain_url) as client:
            assert not (await client.call_tool("bash", {"command": "true"})).is_error

    anyio.run(without_credentials)


@pytest.mark.security
def test_each_http_client_has_episodes_of_its_own(control_plane, http_server) -> None:  # noqa: F811
    """Can fail: before sessions were required, every client without one acted on the server's
    shared default episode: a second client's reset wiped the first's files (seen on the code before)."""
    async def main() -> None:
        async with Client(http_server) as first, Client(http_server) as second:
            one = (await first.call_tool("reset", {})).structured_content
            await first.call_tool("write_file", {"path": "mine.txt", "content": "first"})
            two = (await second.call_tool("reset", {})).structured_content
            assert one["episode_id"] != two["episode_id"] and alive(control_plane) == 2  # a sandbox each
            kept = await first.call_tool("read_file", {"path": "mine.txt"})
            assert not kept.is_error and kept.content[0].text == "first"
            seen = await second.call_tool("bash", {"command": "ls mine.txt"})
            assert "No such file" in seen.content[0].text
            theirs = await second.call_tool("bash", {"command": "ls", "episode_id": one["episode_id"]})
            assert theirs.is_error and "unknown episode" in theirs.content[0].text  # not another session's
            await first.call_tool("edit_file", fix_arguments())
            assert (await first.call_tool("submit", {})).structured_content["reward"] == 1.0
            assert (await second.call_tool("submit", {})).structured_content["reward"] < 1.0
            assert alive(control_plane) == 0
        # a client that insists on the protocol without sessions
        assert "has no sessions" in await refusal(Client(http_server, mode="2026-07-28"), "reset")

    anyio.run(main)


@pytest.mark.security
def test_episodes_are_bounded_per_session_and_in_all(control_plane, start_http) -> None:  # noqa: F811
    """Can fail: before the bounds, reset(new=true) started episodes without limit (seen on the
    code before them: four of them outlived their client)."""
    url = start_http("--max-episodes-per-session", "2", "--max-episodes", "3").url

    async def main() -> None:
        async with Client(url) as first, Client(url) as second:
            await first.call_tool("reset", {})
            extra = (await first.call_tool("reset", {"new": True})).structured_content["episode_id"]
            refused = await first.call_tool("reset", {"new": True})
            assert refused.is_error and "--max-episodes-per-session 2" in refused.content[0].text
            await second.call_tool("reset", {})
            refused = await second.call_tool("reset", {"new": True})
            assert refused.is_error and "--max-episodes 3" in refused.content[0].text
            assert alive(control_plane) == 3
            await first.call_tool("submit", {"episode_id": extra})  # graded: its place is free again
            assert not (await second.call_tool("reset", {"new": True})).is_error
            assert alive(control_plane) == 3

    anyio.run(main)
    assert alive(control_plane) == 0  # each session's end took all of its episodes


@pytest.mark.security
def test_a_sessions_end_hands_back_every_episode_it_started(control_plane, http_server) -> None:  # noqa: F811
    async def main() -> None:
        async with Client(http_server) as client:  # the handshake: mcp-session-id
            result = await solve(client)
            assert result["reward"] == 1.0
            await client.call_tool("reset", {})
            await client.call_tool("reset", {"new": True})
            await client.call_tool("reset", {"new": True})
            assert alive(control_plane) == 3
        # the client's DELETE ended the session, and with it all three episodes

    anyio.run(main)
    assert alive(control_plane) == 0


def test_server_exit_hands_open_episodes_back(control_plane, http_process: HttpServer) -> None:  # noqa: F811
    async def main() -> None:
        async with Client(http_process.url) as client:
            await client.call_tool("reset", {"new": True})
            await client.call_tool("reset", {})
            assert alive(control_plane) == 2
            assert http_process.stop() == 0  # SIGTERM while the session is open
            assert alive(control_plane) == 0

    anyio.run(main)


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


def test_sigterm_over_stdio_hands_the_episode_back(control_plane) -> None:  # noqa: F811
    proc = subprocess.Popen(serve_argv(control_plane.url), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        answers = _converse(proc, [("tools/call", {"name": "reset", "arguments": {}})])
        assert not answers[-1]["result"]["isError"]
        assert alive(control_plane) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert alive(control_plane) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def _in_our_code(frame: Any) -> bool:
    """Whether a thread's stack (its innermost frame) runs a function of ours."""
    while frame is not None:
        if "idegym_env" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _children() -> set[int]:
    """This process's child processes now."""
    me, found = str(os.getpid()), set()
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1] == me:
                found.add(int(entry))
        except (OSError, IndexError):
            continue  # gone meanwhile
    return found


@pytest.mark.parametrize("where", ["in-process", "stdio", "http"])
def test_episodes_run_at_once_and_an_episode_one_call_at_a_time(control_plane, where: str,  # noqa: F811
                                                                request: pytest.FixtureRequest) -> None:
    """In-process and served (stdio, streamable HTTP), a running episode's call is made on the
    event loop (no worker thread: the server starts none, and none is busy, for two episodes'
    calls at once), and a second call of the same episode waits on a thread for the first: two
    episodes' calls overlap, one episode's do not."""
    from idegym_env.integrations._episode import close_shared_clients
    from idegym_env.integrations.mcp import EpisodeServer

    server = EpisodeServer(task=TASK, control_plane_url=control_plane.url)
    http: HttpServer | None = request.getfixturevalue("http_process") if where == "http" else None
    target: Any = {"in-process": server.mcp, "http": http and http.url}.get(where) or StdioServerParameters(
        command=sys.executable, args=serve_argv(control_plane.url)[1:], env={**os.environ})

    async def main() -> None:
        before = _children()
        async with Client(target) as client:
            if where == "in-process":  # the server's worker threads in a call of ours
                def threads() -> int:
                    frames = sys._current_frames()
                    return sum(t.name.startswith("idegym-mcp") and _in_our_code(frames.get(t.ident or 0))
                               for t in threading.enumerate())
            else:  # the server process's threads
                pid, = {http.proc.pid} if http is not None else _children() - before

                def threads() -> int:
                    return len(os.listdir(f"/proc/{pid}/task"))
            one = (await client.call_tool("reset", {"new": True})).structured_content["episode_id"]
            two = (await client.call_tool("reset", {"new": True})).structured_content["episode_id"]
            for episode in (one, two):  # each episode's first call (its connections made)
                await client.call_tool("bash", {"command": "true", "episode_id": episode})

            async def timed(*episodes: str) -> tuple[float, int]:
                """How long the calls took at once, and the most threads counted meanwhile."""
                started, most, pending = anyio.current_time(), threads(), set(range(len(episodes)))

                async def call(index: int) -> None:
                    await client.call_tool("bash", {"command": "sleep 1", "episode_id": episodes[index]})
                    pending.discard(index)

                async with anyio.create_task_group() as tg:
                    for index in pending:
                        tg.start_soon(call, index)
                    while pending:
                        most = max(most, threads())
                        await anyio.sleep(0.01)
                return anyio.current_time() - started, most

            idle = threads()
            apart, most = await timed(one, two)
            assert most == idle, f"{most - idle} threads made or busy for two running episodes' calls"
            together, _ = await timed(one, one)
            assert apart < 1.8, f"two episodes' calls took {apart:.2f} s: they did not run at once"
            assert together >= 2.0, f"one episode's two calls took {together:.2f} s: they overlapped"
            echoed = await client.call_tool("bash", {"command": "echo $((6 * 7))", "episode_id": two})
            assert echoed.content[0].text.startswith("42\n")

    try:
        anyio.run(main)
    finally:
        server.close()
        close_shared_clients()


def test_malformed_calls_are_tool_errors_with_our_message() -> None:
    from idegym_env.integrations.mcp import EpisodeServer

    server = EpisodeServer(task=TASK)  # no call here reaches an episode: no sandbox, no control plane

    async def main() -> None:
        async with Client(server.mcp) as client:
            missing = await client.call_tool("bash", {})
            assert missing.is_error and missing.content[0].text == (
                "Error executing tool bash: invalid arguments (command: Field required); expected "
                "bash(command: string, timeout?: number, episode_id?: string)")
            wrong = await client.call_tool("edit_file", {"path": "a.py", "start_line": "one", "end_line": 1,
                                                         "new_content": ""})
            assert wrong.is_error and "start_line: Input should be a valid integer" in wrong.content[0].text
            unknown = await client.call_tool("rm_rf", {})
            assert unknown.is_error and unknown.content[0].text == "Unknown tool: rm_rf"
            stale = await client.call_tool("bash", {"command": "ls", "episode_id": "gone"})
            assert stale.is_error and "unknown episode 'gone'" in stale.content[0].text

    anyio.run(main)
    assert server.session_count == 0


CALLS = [  # (tool, the arguments a client sends)
    ("bash", {"command": "ls"}),
    ("bash", {"command": "ls", "timeout": "4"}),  # lax: a quoted number is a number
    ("bash", {"command": "ls", "timeout": "null", "episode_id": "e1"}),  # JSON null quoted
    ("bash", {"command": "ls", "timeout": None, "cwd": "/"}),  # names the tool does not take are ignored
    ("read_file", {"path": "a.py", "offset": 2.0, "length": "3"}),
    ("edit_file", {"path": "a.py", "start_line": 2, "end_line": 1, "new_content": "x"}),  # an insertion
    ("run_checks", {}),
    ("submit", {"episode_id": None}),
]


@pytest.mark.parametrize(("name", "arguments"), CALLS)
def test_a_call_is_read_once_as_the_arguments_model_and_the_env_read_it(name: str, arguments: dict) -> None:
    """The call goes to the env as a ``ToolCall`` read in one go: the same call, and the same
    episode, as the arguments' model and then the env's strict reading of its dump gave."""
    from idegym_env.integrations.mcp import TOOLS
    from idegym_env.spaces.parsing import parse_tool_call

    episode_id, call = TOOLS[name].parse(arguments)
    model = TOOLS[name].arguments.model_validate({k: v if v != "null" else None for k, v in arguments.items()})
    dumped = model.model_dump(exclude={"episode_id"}, exclude_none=True)
    assert call == parse_tool_call({"tool": name, "arguments": dumped}, (name,))
    assert episode_id == model.episode_id


def test_a_call_the_env_refuses_goes_to_it_as_the_client_sent_it() -> None:
    """A call the arguments' model takes but the env's model refuses (lines that run backwards)
    reaches the env as arguments, and its message is the env's; one the arguments' model refuses
    raises, for our message."""
    from pydantic import ValidationError

    from idegym_env.integrations.mcp import TOOLS
    from idegym_env.spaces.parsing import parse_tool_call
    from idegym_env.tools import InvalidAction

    episode_id, arguments = TOOLS["edit_file"].parse({"path": "a.py", "start_line": "4", "end_line": 1,
                                                      "new_content": "x", "episode_id": "e1"})
    assert episode_id == "e1" and arguments == {"path": "a.py", "start_line": 4, "end_line": 1, "new_content": "x"}
    with pytest.raises(InvalidAction, match=r"end_line \(1\) is before start_line \(4\)"):
        parse_tool_call({"tool": "edit_file", "arguments": arguments}, ("edit_file",))
    with pytest.raises(ValidationError, match="episode_id"):
        TOOLS["bash"].parse({"command": "ls", "episode_id": 5})


def test_tool_schemas_come_from_the_argument_models() -> None:
    from idegym_env.integrations.mcp import TOOLS, EpisodeResetResult, EpisodeServer, SubmitResult

    async def main() -> dict:
        async with Client(EpisodeServer(task=TASK).mcp) as client:
            return {tool.name: tool for tool in (await client.list_tools()).tools}

    tools = anyio.run(main)
    assert list(tools) == TOOL_NAMES and list(TOOLS) == TOOL_NAMES
    for name, tool in tools.items():
        assert tool.input_schema == TOOLS[name].arguments.model_json_schema()
        assert tool.input_schema["title"] == f"{name}Arguments"
    assert tools["reset"].output_schema == EpisodeResetResult.model_json_schema()
    assert tools["submit"].output_schema == SubmitResult.model_json_schema()
    assert tools["bash"].output_schema["properties"] == {"result": {"title": "Result", "type": "string"}}
    assert "command: The bash script" in tools["bash"].description


def _converse(proc: subprocess.Popen, calls: list[tuple[str, dict]]) -> list[dict]:
    """initialize, then each request in turn over a server's stdin/stdout; returns every answer."""
    assert proc.stdin is not None and proc.stdout is not None
    requests = [("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "test", "version": "0"}}), *calls]
    answers = []
    for number, (method, params) in enumerate(requests, 1):
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": number, "method": method, "params": params}).encode()
                         + b"\n")
        if number == 1:
            proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())
        assert answer["id"] == number, answer
        answers.append(answer)
    return answers


NOISY_SERVER = r'''
import os, subprocess, sys
import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from idegym_env.integrations._mcp_stdio import stdio_streams

async def list_tools(ctx, params):
    return types.ListToolsResult(tools=[types.Tool(name="noisy", input_schema={"type": "object"})])

async def call_tool(ctx, params):
    print("stray print")                                  # buffered: flushed at exit, to stderr
    print("stray print, flushed", flush=True)
    os.write(1, b"stray write to fd 1\n")
    subprocess.run(["sh", "-c", "echo child stdout; cat"], check=True)  # cat reads EOF, not the wire
    return types.CallToolResult(content=[types.TextContent(type="text", text="quiet answer")])

async def main():
    server = Server("noisy", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_streams() as (read, write):
        await server.run(read, write, server.create_initialization_options())

anyio.run(main)
print("after serving", flush=True)                        # fd 1 is the wire again
'''


def test_stray_output_of_the_server_and_its_children_never_reaches_the_wire(tmp_path) -> None:
    with open(tmp_path / "stderr", "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", NOISY_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=stderr)
    try:
        answers = _converse(proc, [("tools/call", {"name": "noisy", "arguments": {}})] * 2)
        assert [a["result"]["content"][0]["text"] for a in answers[1:]] == ["quiet answer"] * 2
        proc.stdin.close()  # the client goes: the server ends
        assert proc.stdout.read() == b"after serving\n"
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    errors = (tmp_path / "stderr").read_text()
    for stray in ("stray print\n", "stray print, flushed", "stray write to fd 1", "child stdout"):
        assert errors.count(stray) == 2, (stray, errors)
