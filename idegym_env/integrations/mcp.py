"""MCP: ``idegym mcp serve`` — an IdeGym episode's tools over the Model Context Protocol
(official ``mcp`` SDK; ``pip install 'idegym[mcp]'``).

::

    idegym mcp serve --task python-roman-numerals                      # stdio (one episode)
    idegym mcp serve --task python-roman-numerals --transport streamable-http --port 8765

Tools: ``reset(task?)`` starts an episode and returns its instruction; then every tool of
:data:`idegym_env.tools.TOOLS`, by its name, with its description and its arguments (and
``episode_id``): ``bash``, ``read_file``, ``write_file``, ``edit_file``, ``patch_file``,
``list_files`` act in the sandbox; ``run_checks`` runs the task's tests without grading;
``submit`` grades the episode and returns ``{"reward", "task_id", "summary", "checks"}``. With
``--task`` a tool called before any ``reset`` starts an episode of that task.

Episodes: each connection has episodes of its own — over stdio the one client, over streamable
HTTP each MCP session (``mcp-session-id``, made by the ``initialize`` handshake; the sessionless
2026-07-28 protocol is refused so that clients fall back to it, see :mod:`._mcp_http`). A call
acts on the episode named by its ``episode_id`` argument (one of its connection's), else on the
connection's own; ``reset(new=true)`` starts another with an id of its own, each in a sandbox of
its own. ``--max-episodes-per-session`` and ``--max-episodes`` bound how many exist at once.

Credentials (streamable HTTP): the token of :mod:`.mcp_token` on every request, unless
``--auth none``.

Errors: a malformed call or one the episode refuses (no episode, episode ended, a missing file, a
patch that does not apply) is a tool error (``isError: true``) carrying our message, the MCP
convention for failures the model should read. An infrastructure failure (the sandbox died, the
control plane is unreachable, grading could not run) is a JSON-RPC error (code -32603) to the
*client program*, never a reward: the episode is over and unscored.

Cleanup: an episode's sandbox is handed back when it is graded, when ``reset`` replaces it, when
its connection ends (an HTTP session's ``DELETE``, stdio's end of input), when it has had no call
for ``--session-idle-timeout`` seconds (the SDK ends an HTTP session without a request in flight
for as long), and when the server exits.

Serving: the SDK's lowlevel ``Server``, with one pydantic model per tool's arguments, made from
the tool's own (it gives the tool's input schema and validates a call, laxly: the env then reads
it strictly) and the answers ``MCPServer`` gave before (text; for
``reset`` and ``submit`` also structured content under an output schema). Stdio goes through
:mod:`._mcp_stdio` (the SDK's ``stdio_server`` on asyncio pipes instead of worker threads).
Served (stdio, streamable HTTP, on uvloop) and in-process (the SDK's ``Client(server.mcp)`` on an
asyncio loop), a tool call of a running episode is made on the serving event loop
(``ToolCallEpisode.call_async``: the env's step as a plan, its sandbox call over the async
client's connections, made for each run of the server in the SDK's lifespan); ``reset``,
``submit``, grading and handing a sandbox back, which the synchronous client makes, run on a
worker thread. Over stdio such a call starts as soon as the SDK's own checks pass for it, before
the SDK's dispatch reaches the handler, which then awaits it (:mod:`._mcp_early` says when). Calls
on different episodes run at once, an episode's one at a time. ``python -m benchmarks
integrations`` says what a call costs over the same call made with the client directly, and where
that goes.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import mcp_types as types
import pydantic_core
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from control_plane.auth import TokenFileError
from sandbox_server.http import run_loop

from .. import tools
from ..client._async import AsyncSessions
from ..settings import chosen_control_plane
from ..tasks import BUNDLED_DIR, Task, load_task
from ._episode import InfrastructureError, ToolCallEpisode, ToolCallError, ToolCallOutcome, close_shared_clients
from ._mcp_early import EarlyStarts
from ._mcp_http import SESSION_HEADER, guard
from .mcp_cli import (
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_EPISODES,
    DEFAULT_MAX_EPISODES_PER_SESSION,
    add_serve_arguments,
)
from .mcp_token import TOKEN_USER, ensure_mcp_token

log = logging.getLogger(__name__)

INTERNAL_ERROR = -32603
LOCAL = "local"  # the connection of stdio's one client (and of an in-process one)
#: Threads that run the episodes' (synchronous) calls: one per call in flight, made as needed.
MAX_WORKERS = 64
#: Calls started early whose handler has not come yet (a request cancelled before the SDK
#: dispatched it never comes): past this many, no call starts early.
MAX_EARLY = 64


# -- the tools' arguments and results ----------------------------------------------------------------


EpisodeId = Annotated[str | None, Field(description="The episode to act on (an episode_id reset returned on this "
                                                    "connection); omit it for this connection's own episode.")]


class _Arguments(BaseModel):
    """A tool's arguments; names it does not take are ignored."""

    model_config = ConfigDict(extra="ignore")


class ResetArguments(_Arguments):
    model_config = ConfigDict(title="resetArguments")

    task: str | None = Field(None, description="A task id; omit it for the server's default task.")
    new: bool = Field(False, description="Start an additional episode with an id of its own (to run several at "
                                         "once; pass its episode_id to act on it) instead of replacing this "
                                         "connection's episode.")


def _arguments(tool: type[tools.ToolCall]) -> type[_Arguments]:
    """The MCP arguments of ``tool``: its own fields (descriptions, bounds) and ``episode_id``."""
    fields: dict[str, Any] = {name: (field.annotation, copy.copy(field))
                              for name, field in tool.arguments_model().model_fields.items()}
    return create_model(f"{tool.name}Arguments", __base__=_Arguments, **fields, episode_id=(EpisodeId, None))


class EpisodeResetResult(BaseModel):
    """What ``reset`` returns: the episode's id and the task's instruction."""

    model_config = ConfigDict(title="ResetResult")  # the schema's name MCP clients already see

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


@dataclass(frozen=True)
class _Tool:
    """One tool: its arguments' model (which gives its input schema and validates a call) and its
    result: a model (structured content, and the same JSON as text) or text, which goes out as
    ``{"result": text}`` too: the wire the SDK's ``MCPServer`` gave before, kept for its clients."""

    name: str
    summary: str
    arguments: type[_Arguments]
    result: type[BaseModel] | None = None
    call: type[tools.ToolCall] | None = None  # the env's model of the call (None: reset)

    def definition(self) -> types.Tool:
        fields = self.arguments.model_fields
        description = self.summary
        if fields:
            description += "\n\nArgs:\n" + "\n".join(f"    {name}: {field.description}"
                                                   for name, field in fields.items())
        output = self.result.model_json_schema() if self.result is not None else {
            "properties": {"result": {"title": "Result", "type": "string"}}, "required": ["result"],
            "title": f"{self.name}Output", "type": "object"}
        return types.Tool(name=self.name, description=description, input_schema=self.arguments.model_json_schema(),
                          output_schema=output)

    def parse(self, arguments: dict[str, Any]) -> tuple[str | None, Any]:
        """The episode the call names (its ``episode_id``) and what the episode gets: for ``reset``
        its arguments' model; else the env's ``ToolCall``, validated laxly (``"4"`` is 4) in one go,
        or, when that fails and :attr:`arguments` takes the call, those arguments as a dict, which
        the env refuses with its own message (a range of lines that runs backwards, say). Raises
        ``ValidationError`` when :attr:`arguments` refuses the call. As the SDK's ``MCPServer`` did
        for clients that quote everything, a string that is JSON ``null``, an object or an array is
        read as such for an argument that takes no string."""
        fields, takes_str = _FIELDS[self.name], _TAKES_STR[self.name]
        for key, value in arguments.items():
            if isinstance(value, str) and key in fields and key not in takes_str:
                try:
                    parsed = json.loads(value)
                except (ValueError, RecursionError):
                    continue
                if not isinstance(parsed, str | int | float):
                    arguments = {**arguments, key: parsed}
        if self.call is not None:
            episode_id = arguments.get("episode_id")
            if episode_id is None or isinstance(episode_id, str):
                # What the arguments' model and then the env's strict reading of its dump accept,
                # read once (the two checks, and dumping the model in between, cost each call).
                try:
                    return episode_id, self.call.model_validate({"tool": self.name, "arguments": {
                        key: value for key, value in arguments.items()
                        if value is not None and key != "episode_id" and key in fields}}, strict=False)
                except ValidationError:
                    pass
        model = self.arguments.model_validate(arguments)
        if self.call is None:
            return None, model
        values = model.model_dump(exclude_none=True)
        return values.pop("episode_id", None), values or None

    def refusal(self, exc: ValidationError) -> str:
        """Why the arguments were refused and what the tool takes, in a line for the model."""
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                             for e in exc.errors(include_url=False))
        return f"invalid arguments ({problems}); expected {_SIGNATURES[self.name]}"

    def signature(self) -> str:
        """``bash(command: string, timeout?: number, episode_id?: string)``"""
        schema = self.arguments.model_json_schema()
        parts = []
        for name, prop in schema["properties"].items():
            kinds = [prop["type"]] if "type" in prop else [a.get("type") for a in prop.get("anyOf", ())]
            kind = next((k for k in kinds if k and k != "null"), "any")
            parts.append(f"{name}{'' if name in schema.get('required', ()) else '?'}: {kind}")
        return f"{self.name}({', '.join(parts)})"

    def answer(self, value: Any) -> dict[str, Any]:
        """The ``CallToolResult`` of ``value``, in its wire form: the SDK validates a handler's
        result against the protocol's model either way, and a dict spares building the models and
        dumping them again (a few µs of every call)."""
        if isinstance(value, BaseModel):
            return {"content": [{"type": "text", "text": pydantic_core.to_json(value, indent=2).decode()}],
                    "structuredContent": value.model_dump(mode="json"), "isError": False, "resultType": "complete"}
        return {"content": [{"type": "text", "text": value}], "structuredContent": {"result": value}, "isError": False,
                "resultType": "complete"}


TOOLS = {tool.name: tool for tool in (
    _Tool("reset", "Start an episode (ending the one it replaces) and return its id and the task's instruction.",
          ResetArguments, EpisodeResetResult),
    *(_Tool(tool.name, tool.description, _arguments(tool), SubmitResult if tool.ends_episode else None, tool)
      for tool in tools.TOOLS.values()),
)}
_SIGNATURES = {name: tool.signature() for name, tool in TOOLS.items()}
_FIELDS = {name: frozenset(tool.arguments.model_fields) for name, tool in TOOLS.items()}
_TAKES_STR = {name: {key for key, field in tool.arguments.model_fields.items()
                     if field.annotation is str or str in getattr(field.annotation, "__args__", ())}
              for name, tool in TOOLS.items()}


def _tool_error(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": True, "resultType": "complete"}


def _tracing() -> bool:
    """Whether OpenTelemetry is set up in this process (a tracer provider, or OTEL_* settings)."""
    try:
        from opentelemetry import trace
    except ImportError:
        return False
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider) or \
        any(name.startswith("OTEL_") for name in os.environ)


# -- the server -------------------------------------------------------------------------------------


class _Slot:
    """One episode of the server, and the connection it belongs to."""

    def __init__(self, episode: ToolCallEpisode, owner: str) -> None:
        self.episode = episode
        self.owner = owner  # an HTTP session's id, or LOCAL
        self.lock = threading.Lock()  # one call at a time per episode
        self.used = time.monotonic()


@dataclass(frozen=True)
class _Early:
    """A call started before the SDK called its handler (:mod:`._mcp_early`): the handler awaits it."""

    task: asyncio.Task[ToolCallOutcome]
    key: str
    slot: _Slot


class EpisodeServer:
    """The MCP server (:attr:`mcp`, the SDK's lowlevel ``Server``) and the episodes of its sessions.

    Each connection (an HTTP session; over stdio or in-process, the one client) has episodes of
    its own: the one its calls act on when they name none, and those ``reset(new=true)`` started.
    ``max_episodes_per_session`` and ``max_episodes`` (every connection's) bound how many exist at
    once; a graded episode started by ``reset(new=true)`` no longer counts."""

    def __init__(self, *, task: Task | str | Path | None = None, control_plane_url: str | None = None,
                 allowed_tasks: tuple[str, ...] | None = None, idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                 max_episodes_per_session: int = DEFAULT_MAX_EPISODES_PER_SESSION,
                 max_episodes: int = DEFAULT_MAX_EPISODES, **env_kwargs: Any) -> None:
        if max_episodes_per_session < 1 or max_episodes < 1:
            raise ValueError("max_episodes_per_session and max_episodes must be at least 1")
        self.default_task: Task | None = None if task is None else (task if isinstance(task, Task)
                                                                      else load_task(task))
        self.allowed_tasks = allowed_tasks if allowed_tasks is not None else tuple(
            sorted(p.parent.name for p in BUNDLED_DIR.glob("*/task.yaml")))
        self.control_plane_url = control_plane_url
        self.idle_timeout = idle_timeout
        self.max_episodes_per_session = max_episodes_per_session
        self.max_episodes = max_episodes
        self.env_kwargs = env_kwargs
        self._slots: dict[str, _Slot] = {}  # episode id -> its slot
        self._main: dict[str, str] = {}  # connection -> the episode its calls act on when they name none
        self._lock = threading.Lock()
        # What the synchronous client does (reset, submit, grading; every call in-process) runs on
        # these threads, so that calls on different episodes run at once (one at a time per
        # episode: _Slot.lock).
        self._executor = ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="idegym-mcp")
        # While the SDK serves (stdio, HTTP, an in-process client): the serving loop's connections,
        # for the calls made on it, and how many runs of the server share them (_serving).
        self._sessions: AsyncSessions | None = None
        self._serving = 0
        self._early: dict[Any, _Early] = {}  # a request's id -> its call, started early (stdio)
        self.early_started = 0  # how many calls started early
        self._tools = types.ListToolsResult(tools=[tool.definition() for tool in TOOLS.values()])
        self._input_schemas = {tool.name: tool.input_schema for tool in self._tools.tools}
        self.mcp: Server[Any] = Server(
            "idegym", instructions=_INSTRUCTIONS, get_tool_input_schema=self._input_schemas.get,
            on_list_tools=self._list_tools,
            # Empty, as MCPServer answered them, for clients that list everything without asking.
            on_list_resources=_empty(types.ListResourcesResult(resources=[])),
            on_list_resource_templates=_empty(types.ListResourceTemplatesResult(resource_templates=[])),
            on_list_prompts=_empty(types.ListPromptsResult(prompts=[])), lifespan=self._serving_loop)
        # Registered as a plain request handler: its answers are wire dicts (_Tool.answer).
        self.mcp.add_request_handler("tools/call", types.CallToolRequestParams, self._call_tool)
        if not _tracing():
            # The SDK's OpenTelemetry middleware makes a span per message even with no exporter
            # (~40 µs of a call here); it stays when the process traces.
            self.mcp.middleware = [m for m in self.mcp.middleware if type(m).__name__ != "OpenTelemetryMiddleware"]

    # -- sessions -------------------------------------------------------------------------------------

    @staticmethod
    def _owner(ctx: ServerRequestContext[Any]) -> str:
        """The connection a call comes from: its HTTP session, else the one local client."""
        headers = getattr(ctx.request, "headers", None)
        if headers is None:
            return LOCAL
        session = headers.get(SESSION_HEADER)
        if not session:  # _mcp_http admits no request without the handshake; a session comes with it
            raise ToolCallError("this connection has no MCP session: connect with the initialize handshake")
        return session

    def _slot(self, ctx: ServerRequestContext[Any], episode_id: str | None = None, *,
              new: bool = False) -> tuple[str, _Slot]:
        """The episode a call acts on: ``episode_id`` (one of this connection's) when given, else
        the connection's own; ``new`` makes another one with an id of its own."""
        owner = self._owner(ctx)
        with self._lock:
            if episode_id is not None:
                key = episode_id
                slot = self._slots.get(key)
                if slot is None or slot.owner != owner:
                    raise ToolCallError(f"unknown episode {episode_id!r}: it ended, never existed or is another "
                                        "connection's; call reset (new=true) to start one")
            elif not new and owner in self._main:
                key = self._main[owner]
                slot = self._slots[key]
            else:
                self._admit(owner)
                key = uuid.uuid4().hex
                episode = ToolCallEpisode(control_plane_url=self.control_plane_url, allowed_tasks=self.allowed_tasks,
                                  **self.env_kwargs)
                slot = self._slots[key] = _Slot(episode, owner)
                if not new:
                    self._main[owner] = key
            slot.used = time.monotonic()
            return key, slot

    def _admit(self, owner: str) -> None:
        """Refuse another episode beyond the bounds (under ``_lock``)."""
        mine = sum(slot.owner == owner for slot in self._slots.values())
        if mine >= self.max_episodes_per_session:
            raise ToolCallError(f"this connection already has {mine} episodes, the most one may have "
                                f"(--max-episodes-per-session {self.max_episodes_per_session}): submit one of "
                                "them (or reset one without new) before starting another")
        if len(self._slots) >= self.max_episodes:
            raise ToolCallError(f"this server already runs {len(self._slots)} episodes, the most it runs at once "
                                f"(--max-episodes {self.max_episodes}): try again when one has ended")

    def _settle(self, key: str, slot: _Slot) -> None:
        """After a call: an extra episode (``reset(new=true)``'s) that is no longer running gives
        its place back; the connection's own stays, so that its calls say it has ended."""
        slot.used = time.monotonic()
        if slot.episode.active:  # the common case: nothing to give back, no lock taken
            return
        with self._lock:
            if not slot.episode.active and self._main.get(slot.owner) != key and self._slots.get(key) is slot:
                del self._slots[key]

    def end_session(self, owner: str) -> None:
        """Hand back every episode of a connection that ended."""
        with self._lock:
            slots = [(k, s) for k, s in self._slots.items() if s.owner == owner]
            for key, _ in slots:
                del self._slots[key]
            self._main.pop(owner, None)
        for _, slot in slots:
            with slot.lock:
                slot.episode.end()

    def _end_episode(self, key: str) -> None:
        with self._lock:
            slot = self._slots.pop(key, None)
            if slot is not None and self._main.get(slot.owner) == key:
                del self._main[slot.owner]
        if slot is not None:
            with slot.lock:
                slot.episode.end()

    def end_idle(self) -> None:
        now = time.monotonic()
        with self._lock:
            idle = [k for k, s in self._slots.items() if now - s.used > self.idle_timeout and not s.lock.locked()]
        for key in idle:
            log.info("MCP episode %s idle for %.0f s: it is ended", key[:16], self.idle_timeout)
            self._end_episode(key)

    def close(self) -> None:
        with self._lock:
            keys = list(self._slots)
        for key in keys:
            self._end_episode(key)

    @property
    def session_count(self) -> int:
        """How many episodes the server holds (running, or a connection's own that ended)."""
        with self._lock:
            return len(self._slots)

    @asynccontextmanager
    async def _serving_loop(self, server: Server[Any]) -> AsyncIterator[dict[str, Any]]:
        """The SDK's lifespan of every way of serving (``mcp.run`` over stdio or an in-process
        client's streams, the streamable-HTTP app): the serving loop's connections, so that a
        running episode's calls are made on it. A run on another loop than the one the
        connections are for (another thread's) makes its calls on worker threads."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio (trio): no calls on the loop
            loop = None
        with self._lock:
            if loop is not None and self._sessions is None:
                self._sessions = AsyncSessions(loop)
            shared = self._sessions is not None and self._sessions.loop is loop
            self._serving += shared
        try:
            yield {}
        finally:
            if shared:
                with self._lock:
                    self._serving -= 1
                    sessions = self._sessions if self._serving == 0 else None
                    if sessions is not None:
                        self._sessions = None
                if sessions is not None:
                    sessions.close()

    # -- the handlers ---------------------------------------------------------------------------------

    async def _list_tools(self, ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
        return self._tools

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> dict[str, Any]:
        name = params.name
        early = self._early.pop(coerce_request_id(ctx.request_id), None) \
            if self._early and ctx.request_id is not None else None
        tool = TOOLS.get(name)
        if tool is None:
            return _tool_error(f"Unknown tool: {name}")
        try:
            if early is not None:
                value = await self._claim(early)
            else:
                try:
                    episode_id, action = tool.parse(params.arguments or {})
                except ValidationError as exc:
                    return _tool_error(f"Error executing tool {name}: {tool.refusal(exc)}")
                key, slot = self._slot(ctx, episode_id, new=isinstance(action, ResetArguments) and action.new)
                try:
                    value = await self._in_episode_async(slot, key, name, action)
                finally:
                    self._settle(key, slot)
        except ToolCallError as exc:
            return _tool_error(f"Error executing tool {name}: {exc}")
        except InfrastructureError as exc:
            raise MCPError(INTERNAL_ERROR, f"IdeGym infrastructure failure (the episode is not scored): {exc}",
                           {"infrastructure_error": str(exc)}) from None
        except Exception as exc:  # noqa: BLE001 - a failure of ours: the model reads it, the log keeps the trace
            log.exception("MCP tool %s failed", name)
            return _tool_error(f"Error executing tool {name}: {exc}")
        return tool.answer(value)

    def _wants_early(self, name: str) -> bool:
        """Whether a call of ``name`` could start early: a tool call of an episode's, while this
        loop serves and the connection has an episode (a look, without the lock: ``_start_early``
        makes sure)."""
        tool = TOOLS.get(name)
        return tool is not None and tool.call is not None and not tool.call.ends_episode \
            and self._sessions is not None and bool(self._slots)

    def _start_early(self, request_id: Any, name: str, arguments: dict[str, Any]) -> None:
        """Start a running episode's call before the SDK calls its handler (:mod:`._mcp_early` made
        the SDK's checks): only where the handler would make it on the loop at once, so the same
        call starts, on the same episode, as the handler would start."""
        tool = TOOLS[name]
        sessions = self._sessions
        if sessions is None or len(self._early) >= MAX_EARLY:
            return
        try:
            episode_id, action = tool.parse(arguments)
        except ValidationError:
            return
        with self._lock:
            key = episode_id if episode_id is not None else self._main.get(LOCAL)
            slot = self._slots.get(key) if key is not None else None
        if key is None or slot is None or slot.owner != LOCAL or sessions.loop is not asyncio.get_running_loop():
            return
        if not slot.lock.acquire(blocking=False):
            return
        if not slot.episode.active:
            slot.lock.release()
            return
        slot.used = time.monotonic()
        task = asyncio.ensure_future(slot.episode.call_async(name, action, sessions))
        task.add_done_callback(lambda _: slot.lock.release())
        self._early[request_id] = _Early(task, key, slot)
        self.early_started += 1

    def _cancel_early(self, request_id: Any) -> None:
        """The client cancelled a request: its call, if it started early, is cancelled (its handler may
        never come; if it does, it finds the call cancelled, as its own would be)."""
        early = self._early.get(request_id)
        if early is not None:
            early.task.cancel()

    def _forget_early(self, request_id: Any) -> None:
        """A new request reuses ``request_id``: a call started early under it (cancelled, its handler
        never came) is dropped, so that the new request's handler does not take it for its own."""
        if self._early:
            early = self._early.pop(request_id, None)
            if early is not None:
                early.task.cancel()

    async def _claim(self, early: _Early) -> str:
        """The handler's part of a call started early: its outcome (a cancelled handler cancels it)."""
        try:
            outcome = await early.task
        finally:
            self._settle(early.key, early.slot)
        if outcome.error is not None:  # the tool failed (a missing file...): a tool error
            raise ToolCallError(outcome.text)
        return outcome.text

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on a worker thread: asyncio's executor hand-off, ~15 µs a call cheaper here than
        ``anyio.to_thread`` (which also works under trio; every server here runs on asyncio)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _in_episode_async(self, slot: _Slot, key: str, name: str, action: Any) -> Any:
        """A tool call of a running episode on the serving loop (``ToolCallEpisode.call_async``:
        no thread hop); anything else (reset, submit, the first call of a default task's episode,
        a call while another of the episode's is in flight) on a worker thread."""
        sessions = self._sessions
        if (sessions is None or sessions.loop is not asyncio.get_running_loop() or name == "reset"
                or tools.TOOLS[name].ends_episode or not slot.lock.acquire(blocking=False)):
            return await self._in_thread(self._in_episode, slot, key, name, action)
        try:
            if not slot.episode.active:
                return await self._in_thread(self._in_episode_locked, slot, key, name, action)
            outcome = await slot.episode.call_async(name, action, sessions)
        finally:
            slot.lock.release()
        if outcome.error is not None:  # the tool failed (a missing file...): a tool error
            raise ToolCallError(outcome.text)
        return outcome.text

    def _in_episode(self, slot: _Slot, key: str, name: str, action: Any) -> Any:
        with slot.lock:
            return self._in_episode_locked(slot, key, name, action)

    def _in_episode_locked(self, slot: _Slot, key: str, name: str, action: Any) -> Any:
        episode = slot.episode
        if name == "reset":
            return self._reset(key, episode, action)
        if episode.env is None and not episode.done and self.default_task is not None:
            episode.start(self.default_task)
        if tools.TOOLS[name].ends_episode:
            return self._submit(key, episode)
        outcome: ToolCallOutcome = episode.call(name, action)
        if outcome.error is not None:  # the tool failed (a missing file...): a tool error
            raise ToolCallError(outcome.text)
        return outcome.text

    def _reset(self, key: str, episode: ToolCallEpisode, arguments: ResetArguments) -> EpisodeResetResult:
        task = arguments.task
        if task is None or (self.default_task is not None and task == self.default_task.id):
            if self.default_task is None:
                raise ToolCallError(f"name a task: this server has no default task; tasks: "
                                    f"{', '.join(self.allowed_tasks)}")
            instruction = episode.start(self.default_task)
        else:
            instruction = episode.start(task)
        assert episode.task is not None
        return EpisodeResetResult(episode_id=key, task_id=episode.task.id, instruction=instruction)

    @staticmethod
    def _submit(key: str, episode: ToolCallEpisode) -> SubmitResult:
        task_id = episode.task.id if episode.task is not None else ""
        outcome = episode.submit()
        return SubmitResult(reward=outcome.reward, task_id=task_id, episode_id=key, summary=outcome.text,
                            checks=outcome.info.get("checks") or {})

    # -- serving ---------------------------------------------------------------------------------------

    def serve_stdio(self) -> None:
        """Serve one client over stdin and stdout until it closes them (or SIGTERM, or Ctrl-C)."""
        import signal

        from ._mcp_stdio import stdio_streams

        async def main() -> None:
            loop = asyncio.get_running_loop()
            task = asyncio.current_task()
            assert task is not None
            previous = signal.getsignal(signal.SIGTERM)
            try:  # SIGTERM unwinds the serving, then the episodes are handed back (below)
                loop.add_signal_handler(signal.SIGTERM, task.cancel)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
                previous = None
            try:
                async with stdio_streams() as (read, write):
                    await self.serve_streams(read, write)
            finally:
                if previous is not None:
                    loop.remove_signal_handler(signal.SIGTERM)
                    signal.signal(signal.SIGTERM, previous)

        try:
            run_loop(main())  # uvloop: fewer system calls and wake-ups a call than asyncio's loop
        except asyncio.CancelledError:
            pass
        finally:
            self.close()

    async def serve_streams(self, read: Any, write: Any) -> None:
        """Serve one client over a transport's streams (stdio's), its calls started early where they may
        (:mod:`._mcp_early`); a call started early whose handler never came is cancelled at the end."""
        early = EarlyStarts(self.mcp, wants=self._wants_early, start=self._start_early, cancel=self._cancel_early,
                            forget=self._forget_early)
        read, write = early.wrap(read, write)
        try:
            await self.mcp.run(read, write, self.mcp.create_initialization_options())
        finally:
            left, self._early = list(self._early.values()), {}
            for call in left:
                call.task.cancel()
            if left:
                await asyncio.gather(*(call.task for call in left), return_exceptions=True)

    def http_app(self, *, token: str | None, path: str = "/mcp", host: str = "127.0.0.1",
                 credentials_hint: str = "the server's token") -> Any:
        """The streamable-HTTP ASGI app behind :func:`._mcp_http.guard`: ``token`` is required
        (``None``: no authentication); a session's ``DELETE`` ends its episodes."""
        app = self.mcp.streamable_http_app(streamable_http_path=path, session_idle_timeout=self.idle_timeout,
                                           host=host)

        async def end_session(session: str) -> None:
            await self._in_thread(self.end_session, session)

        return guard(app, token=token, credentials_hint=credentials_hint, end_session=end_session)

    def serve_http(self, host: str, port: int, path: str = "/mcp", ready: Any = None, *, token: str | None,
                   credentials_hint: str = "the server's token") -> None:
        import uvicorn

        app = self.http_app(token=token, path=path, host=host, credentials_hint=credentials_hint)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
        userver = uvicorn.Server(config)

        async def main() -> None:
            async def reaper() -> None:
                while True:
                    await asyncio.sleep(min(60.0, self.idle_timeout / 4))
                    await self._in_thread(self.end_idle)

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
            run_loop(main())  # uvloop: fewer system calls and wake-ups a call than asyncio's loop
        finally:
            self.close()


def _empty(result: Any) -> Callable[..., Any]:
    async def handler(ctx: ServerRequestContext[Any], params: Any) -> Any:
        return result

    return handler


_INSTRUCTIONS = ("An IdeGym coding task in a disposable sandbox. Call reset to start (or restart) an episode and "
                 "read the instruction; act with bash and the file tools; run_checks runs the tests; submit grades "
                 "your work and returns the reward.")


# -- the command line --------------------------------------------------------------------------------


def run_serve(args: argparse.Namespace) -> int:
    import signal

    # SIGTERM unwinds like Ctrl-C, so the episodes' sandboxes are handed back before exit (uvicorn
    # re-raises the signal it caught once it has shut down; this handler is what it then calls;
    # over stdio the serving loop handles it itself).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")

    token, credentials = None, "NO AUTHENTICATION (--auth none)"
    if args.transport != "stdio":
        if args.auth == "none":
            log.warning("AUTHENTICATION IS OFF (--auth none): anyone who can connect to %s:%s can start sandboxes "
                        "and run commands in them", args.host, args.port)
        else:
            try:
                path, token = ensure_mcp_token(args.token_dir)
            except (OSError, TokenFileError) as exc:
                print(f"idegym mcp serve: {exc}", file=sys.stderr)
                return 2
            credentials = (f"Authorization: Bearer <the token in {path}>, or HTTP Basic user {TOKEN_USER!r} with "
                           "it as password; `idegym mcp token` prints it")
    url = chosen_control_plane(args.control_plane_url)
    server = EpisodeServer(task=args.task, control_plane_url=url,
                           allowed_tasks=tuple(args.allowed_tasks) if args.allowed_tasks else None,
                           idle_timeout=args.session_idle_timeout, max_steps=args.max_steps,
                           bash_timeout=args.bash_timeout, max_episodes_per_session=args.max_episodes_per_session,
                           max_episodes=args.max_episodes)
    try:
        if args.transport == "stdio":
            server.serve_stdio()
        else:
            def ready(port: int) -> None:
                print(f"idegym MCP server on http://{args.host}:{port}{args.path} ({credentials})", file=sys.stderr,
                      flush=True)

            server.serve_http(args.host, args.port, args.path, ready=ready, token=token, credentials_hint=credentials)
    finally:
        close_shared_clients()
    return 0


__all__ = ["EpisodeServer", "EpisodeResetResult", "SubmitResult", "TOOLS", "add_serve_arguments", "run_serve"]
