"""MCP: ``idegym mcp serve`` — an IdeGym episode's tools over the Model Context Protocol
(official ``mcp`` SDK; ``pip install 'idegym[mcp]'``).

::

    idegym mcp serve --task python-roman-numerals                      # stdio (one episode)
    idegym mcp serve --task python-roman-numerals --transport streamable-http --port 8765

Tools: ``reset(task?)`` starts an episode and returns its instruction; ``bash``,
``read_file``, ``write_file``, ``edit_file``, ``patch_file`` act in the sandbox;
``run_checks`` runs the task's tests without grading; ``submit`` grades the episode and returns
``{"reward", "task_id", "summary", "checks"}``. With ``--task`` a tool called before any
``reset`` starts an episode of that task.

Episodes: a call acts on the episode named by its ``episode_id`` argument, else on its
connection's episode: over stdio the one client's; over streamable HTTP the MCP session's
(``mcp-session-id``, legacy protocol versions) or, for the stateless 2026-07-28 protocol, the
server's default episode. ``reset(new=true)`` starts an additional episode with an id of its own,
so a client without sessions can run several at once; each episode has a sandbox of its own.

Errors: a malformed call or one the episode refuses (no episode, episode ended, a missing file, a
patch that does not apply) is a tool error (``isError: true``) carrying our message, the MCP
convention for failures the model should read. An infrastructure failure (the sandbox died, the
control plane is unreachable, grading could not run) is a JSON-RPC error (code -32603) to the
*client program*, never a reward: the episode is over and unscored.

Cleanup: an episode's sandbox is handed back when it is graded, when ``reset`` replaces it, when
its HTTP session ends (``DELETE``), when it has had no call for ``--session-idle-timeout``
seconds, and when the server exits.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, Field

from ..tasks import BUNDLED_DIR, Task, load_task
from ._episode import Episode, InfrastructureError, Outcome, ToolCallError, close_shared_clients
from .mcp_cli import DEFAULT_IDLE_TIMEOUT, add_serve_arguments

log = logging.getLogger(__name__)

INTERNAL_ERROR = -32603
DEFAULT_EPISODE = "default"
SESSION_HEADER = "mcp-session-id"



class ResetResult(BaseModel):
    """What ``reset`` returns: the episode's id and the task's instruction."""

    episode_id: str = Field(description="Pass it as episode_id to act on this episode from a client without sessions.")
    task_id: str
    instruction: str


class SubmitResult(BaseModel):
    """What ``submit`` returns: the episode's reward and how it was graded."""

    reward: float = Field(description="The task's reward for the episode (1.0 = every check passed).")
    task_id: str
    episode_id: str
    summary: str = Field(description="The checks in a few lines of text.")
    checks: dict[str, Any] = Field(default_factory=dict, description="Each stage's result as the sandbox reported it.")


class _Session:
    def __init__(self, episode: Episode) -> None:
        self.episode = episode
        self.lock = threading.Lock()  # one call at a time per episode
        self.used = time.monotonic()


class EpisodeServer:
    """The MCP server object and the episodes of its sessions."""

    def __init__(self, *, task: Task | str | Path | None = None, control_plane_url: str | None = None,
                 allowed_tasks: tuple[str, ...] | None = None, idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                 **env_kwargs: Any) -> None:
        self.default_task: Task | None = None if task is None else (task if isinstance(task, Task)
                                                                      else load_task(task))
        if allowed_tasks is None:
            allowed_tasks = tuple(sorted(p.parent.name for p in BUNDLED_DIR.glob("*/task.yaml")))
        self.allowed_tasks = allowed_tasks
        self.control_plane_url = control_plane_url
        self.idle_timeout = idle_timeout
        self.env_kwargs = env_kwargs
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        self.mcp = MCPServer("idegym", instructions=_INSTRUCTIONS, log_level="WARNING")
        self._add_tools()

    # -- sessions -------------------------------------------------------------------------------------

    def _session(self, ctx: Context, episode_id: str | None = None, *, new: bool = False) -> tuple[str, _Session]:
        """The episode a call acts on: ``episode_id`` when given; else the transport's session
        (legacy streamable-HTTP sessions) or the server's default episode (stdio, or a stateless
        HTTP client that names none); ``new`` makes a fresh one with an id of its own."""
        if new:
            key = uuid.uuid4().hex
        elif episode_id is not None:
            key = episode_id
            with self._lock:
                if key not in self._sessions and key != DEFAULT_EPISODE:
                    raise ToolError(f"unknown episode {episode_id!r}: it ended or never existed; call reset "
                                    "(new=true) to start one")
        else:
            headers = ctx.headers
            key = (headers.get(SESSION_HEADER) if headers else None) or DEFAULT_EPISODE
        with self._lock:
            session = self._sessions.get(key)
            if session is None:
                episode = Episode(control_plane_url=self.control_plane_url, allowed_tasks=self.allowed_tasks,
                                  **self.env_kwargs)
                session = self._sessions[key] = _Session(episode)
            session.used = time.monotonic()
            return key, session

    def end_session(self, key: str) -> None:
        """Hand back the episode of a session that ended."""
        with self._lock:
            session = self._sessions.pop(key, None)
        if session is not None:
            with session.lock:
                session.episode.end()

    def end_idle(self) -> None:
        now = time.monotonic()
        with self._lock:
            idle = [k for k, s in self._sessions.items() if now - s.used > self.idle_timeout]
        for key in idle:
            log.info("MCP session %s idle for %.0f s: its episode is ended", key[:16], self.idle_timeout)
            self.end_session(key)

    def close(self) -> None:
        with self._lock:
            keys = list(self._sessions)
        for key in keys:
            self.end_session(key)

    @property
    def session_count(self) -> int:
        with self._lock:
            return len(self._sessions)

    # -- calling the episode --------------------------------------------------------------------------

    async def _run(self, ctx: Context, fn: Any, episode_id: str | None = None, *, new: bool = False) -> Any:
        key, session = self._session(ctx, episode_id, new=new)

        def call() -> Any:
            with session.lock:
                episode = session.episode
                if episode.env is None and not episode.done and self.default_task is not None \
                        and not isinstance(fn, _Start):
                    episode.start(self.default_task)
                return fn(key, episode)

        try:
            return await anyio.to_thread.run_sync(call)
        except ToolCallError as exc:
            raise ToolError(str(exc)) from None
        except InfrastructureError as exc:
            raise MCPError(INTERNAL_ERROR, f"IdeGym infrastructure failure (the episode is not scored): {exc}",
                           {"infrastructure_error": str(exc)}) from None

    async def _tool(self, ctx: Context, name: str, arguments: dict[str, Any] | None,
                    episode_id: str | None) -> str:
        outcome: Outcome = await self._run(ctx, lambda _key, e: e.call(name, arguments), episode_id)
        if outcome.error is not None and name != "bash":
            raise ToolError(outcome.text)
        return outcome.text

    def _start(self, episode: Episode, task: str | None) -> str:
        if task is None or (self.default_task is not None and task == self.default_task.id):
            if self.default_task is None:
                raise ToolCallError(f"name a task: this server has no default task; tasks: "
                                    f"{', '.join(self.allowed_tasks)}")
            return episode.start(self.default_task)
        return episode.start(task)

    # -- the tools --------------------------------------------------------------------------------------

    def _add_tools(self) -> None:
        server = self

        @self.mcp.tool()
        async def reset(ctx: Context, task: str | None = None, new: bool = False) -> ResetResult:
            """Start an episode (ending the one it replaces) and return its id and the task's instruction.

            Args:
                task: A task id; omit it for the server's default task.
                new: Start an additional episode with an id of its own (for clients without sessions that
                    run several episodes at once) instead of replacing this connection's episode.
            """
            def start(key: str, episode: Episode) -> ResetResult:
                instruction = server._start(episode, task)
                assert episode.task is not None
                return ResetResult(episode_id=key, task_id=episode.task.id, instruction=instruction)

            return await server._run(ctx, _Start(start), new=new)

        @self.mcp.tool()
        async def bash(ctx: Context, command: str, timeout: float | None = None, episode_id: str | None = None) -> str:
            """Run a bash script in the project directory; returns its output and exit code.

            Args:
                command: The bash script, e.g. `ls` or `python3 -m pytest -q`.
                timeout: Seconds before it is killed (default: the environment's limit).
                episode_id: The episode to act on (reset's episode_id); omit it for this connection's episode.
            """
            return await server._tool(ctx, "bash", {"command": command, "timeout": timeout}, episode_id)

        @self.mcp.tool()
        async def read_file(ctx: Context, path: str, offset: int | None = None, length: int | None = None,
                            episode_id: str | None = None) -> str:
            """Read a text file of the project.

            Args:
                path: The file's path, relative to the project directory.
                offset: Byte offset to start at (default 0).
                length: Maximum number of bytes (default: the environment's limit).
                episode_id: The episode to act on (reset's episode_id); omit it for this connection's episode.
            """
            return await server._tool(ctx, "read_file", {"path": path, "offset": offset, "length": length},
                                      episode_id)

        @self.mcp.tool()
        async def write_file(ctx: Context, path: str, content: str, episode_id: str | None = None) -> str:
            """Create or overwrite a file with this content (missing directories are created).

            Args:
                path: The file's path, relative to the project directory.
                content: The complete new content.
                episode_id: The episode to act on (reset's episode_id); omit it for this connection's episode.
            """
            return await server._tool(ctx, "write_file", {"path": path, "content": content}, episode_id)

        @self.mcp.tool()
        async def edit_file(ctx: Context, path: str, start_line: int, end_line: int, new_content: str,
                            episode_id: str | None = None) -> str:
            """Replace lines start_line..end_line (inclusive, from 1) of a file; end_line = start_line - 1 inserts.

            Args:
                path: The file's path, relative to the project directory.
                start_line: First line to replace.
                end_line: Last line to replace.
                new_content: The replacement text; empty deletes the lines.
                episode_id: The episode to act on (reset's episode_id); omit it for this connection's episode.
            """
            return await server._tool(ctx, "edit_file", {"path": path, "start_line": start_line,
                                                         "end_line": end_line, "new_content": new_content},
                                      episode_id)

        @self.mcp.tool()
        async def patch_file(ctx: Context, path: str, patch: str, episode_id: str | None = None) -> str:
            """Apply diff-match-patch patch text (patch_toText) to a file; fails if a hunk does not apply.

            Args:
                path: The file's path, relative to the project directory.
                patch: The patch text.
                episode_id: The episode to act on (reset's episode_id); omit it for this connection's episode.
            """
            return await server._tool(ctx, "patch_file", {"path": path, "patch": patch}, episode_id)

        @self.mcp.tool()
        async def run_checks(ctx: Context, episode_id: str | None = None) -> str:
            """Run the task's tests and return their output (does not end the episode).

            Args:
                episode_id: The episode to act on (reset's episode_id); omit it for this connection's episode.
            """
            return await server._tool(ctx, "run_checks", None, episode_id)

        @self.mcp.tool()
        async def submit(ctx: Context, episode_id: str | None = None) -> SubmitResult:
            """Grade the episode with the task's checks and end it; returns the reward.

            Args:
                episode_id: The episode to act on (reset's episode_id); omit it for this connection's episode.
            """
            def grade(key: str, episode: Episode) -> SubmitResult:
                task_id = episode.task.id if episode.task is not None else ""
                outcome = episode.submit()
                return SubmitResult(reward=outcome.reward, task_id=task_id, episode_id=key, summary=outcome.text,
                                    checks=outcome.info.get("checks") or {})

            return await server._run(ctx, grade, episode_id)

    # -- serving ---------------------------------------------------------------------------------------

    def serve_stdio(self) -> None:
        try:
            self.mcp.run("stdio")
        finally:
            self.close()

    def http_app(self, *, path: str = "/mcp", host: str = "127.0.0.1") -> Any:
        """The streamable-HTTP ASGI app; a session's ``DELETE`` also ends its episode."""
        app = self.mcp.streamable_http_app(streamable_http_path=path, session_idle_timeout=self.idle_timeout,
                                           host=host)
        server = self

        async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
            key = None
            if scope.get("type") == "http" and scope.get("method") == "DELETE":
                key = dict(scope.get("headers") or []).get(SESSION_HEADER.encode())
            if not key:
                return await app(scope, receive, send)

            async def send_after_ending(message: dict[str, Any]) -> None:
                # The episode ends before the client hears that its session did, so a client that
                # counts sandboxes right after its DELETE sees this one handed back.
                if message.get("type") == "http.response.start" and message.get("status", 500) < 300:
                    await anyio.to_thread.run_sync(server.end_session, key.decode())
                await send(message)

            await app(scope, receive, send_after_ending)

        return wrapped

    def serve_http(self, host: str, port: int, path: str = "/mcp", ready: Any = None) -> None:
        import uvicorn

        config = uvicorn.Config(self.http_app(path=path, host=host), host=host, port=port, log_level="warning",
                                lifespan="on")
        userver = uvicorn.Server(config)

        async def main() -> None:
            async def reaper() -> None:
                while True:
                    await asyncio.sleep(min(60.0, self.idle_timeout / 4))
                    await anyio.to_thread.run_sync(self.end_idle)

            task = asyncio.ensure_future(reaper())
            serving = asyncio.ensure_future(userver.serve())
            while not userver.started and not serving.done():
                await asyncio.sleep(0.02)
            if userver.started and ready is not None:
                sockets = [s for srv in userver.servers for s in srv.sockets]
                ready(sockets[0].getsockname()[1] if sockets else port)
            try:
                await serving
            finally:
                task.cancel()

        try:
            asyncio.run(main())
        finally:
            self.close()


class _Start:
    """Marks the reset tool's call, which must not auto-start the default task first."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, key: str, episode: Episode) -> Any:
        return self.fn(key, episode)


_INSTRUCTIONS = ("An IdeGym coding task in a disposable sandbox. Call reset to start (or restart) an episode and "
                 "read the instruction; act with bash and the file tools; run_checks runs the tests; submit grades "
                 "your work and returns the reward.")


# -- the command line --------------------------------------------------------------------------------


def run_serve(args: argparse.Namespace) -> int:
    import os
    import signal

    # SIGTERM unwinds like Ctrl-C, so the episodes' sandboxes are handed back before exit (uvicorn
    # re-raises the signal it caught once it has shut down; this handler is what it then calls).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    url = args.control_plane_url or os.environ.get("IDEGYM_URL") or None
    server = EpisodeServer(task=args.task, control_plane_url=url,
                           allowed_tasks=tuple(args.allowed_tasks) if args.allowed_tasks else None,
                           idle_timeout=args.session_idle_timeout, max_steps=args.max_steps,
                           bash_timeout=args.bash_timeout)
    try:
        if args.transport == "stdio":
            server.serve_stdio()
        else:
            def ready(port: int) -> None:
                print(f"idegym MCP server on http://{args.host}:{port}{args.path}", file=sys.stderr, flush=True)

            server.serve_http(args.host, args.port, args.path, ready=ready)
    finally:
        close_shared_clients()
    return 0


__all__ = ["EpisodeServer", "ResetResult", "SubmitResult", "add_serve_arguments", "run_serve"]
