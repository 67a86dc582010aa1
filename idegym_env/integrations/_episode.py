"""``ToolCallEpisode``: one IdeGym episode driven by named tool calls, shared by the TRL, SkyRL and MCP adapters.

It is a thin layer over :class:`~idegym_env.env.IdeGymEnv`: every tool call is one
``env.step`` (so step counting, truncation, observation limits and grading are the env's), and
``submit`` is the env's ``submit`` action. What it adds is what the frameworks need and the
Gymnasium API does not say:

* every tool of :data:`~idegym_env.tools.TOOLS` by its name, also ``run_checks``, which the
  action space leaves out: the task's own tests as a bash call, without grading (for tasks whose
  tests exist only at grading it says so, without a step);
* three outcomes kept apart: a result (also a failed command), a malformed call
  (:class:`ToolCallError`, our message) and an infrastructure failure
  (:class:`InfrastructureError`: the sandbox died, the control plane is unreachable, grading
  could not run) — never a reward of 0, so trainers can mask the sample;
* the sandbox is handed back (FINISHED, reusable by the next episode of the task) as soon as the
  episode ends, when it fails, and at interpreter exit.

Sandboxes come from one :class:`~idegym_env.client.IdeGymClient` per control-plane URL and
process (:func:`shared_client`); with no URL and no ``$IDEGYM_URL`` that is the embedded control
plane, started on first use and stopped at exit.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, SupportsFloat

from .. import embedded
from ..client import IdeGymClient
from ..client._async import AsyncSessions
from ..env import IdeGymEnv
from ..errors import InfrastructureError, ServiceError, ToolCallError
from ..settings import chosen_control_plane
from ..spaces.parsing import parse_tool_call
from ..tasks import Task
from ..tools import TOOLS, InvalidAction, ToolCall
from ..tools.schemas import tool_guide as _tool_guide

log = logging.getLogger(__name__)

#: The tools every tool-call adapter exposes: all of them (TRL leaves out ``submit``, as its
#: ``get_reward`` grades).
TOOL_NAMES: tuple[str, ...] = tuple(TOOLS)


@dataclass
class ToolCallOutcome:
    """What one tool call gave: the observation text, the step's reward, whether the episode
    ended, and the env's ``info`` for the step."""

    text: str
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def error(self) -> str | None:
        """The tool's own failure (e.g. a missing file), which is a result the agent sees."""
        return self.info.get("error")


# -- one client per control plane and process ---------------------------------------------------


_clients: dict[str | None, IdeGymClient] = {}
_clients_lock = threading.Lock()


def shared_client(control_plane_url: str | None = None) -> IdeGymClient:
    """The process's registered client for ``control_plane_url`` (``None``: ``$IDEGYM_URL``, else
    the embedded control plane, started now if needed). Closed, with every sandbox it still holds,
    at exit."""
    control_plane_url = chosen_control_plane(control_plane_url)
    with _clients_lock:
        client = _clients.get(control_plane_url)
        if client is None:
            url = control_plane_url
            if url is None:
                url = embedded.acquire().url
            try:
                client = IdeGymClient(url, name="idegym-integrations")
                client.register()
            except BaseException:
                if control_plane_url is None:
                    embedded.release()
                raise
            if not _clients:
                atexit.register(close_shared_clients)
            _clients[control_plane_url] = client
        return client


def close_shared_clients() -> None:
    """Stop every shared client's sandboxes and the embedded control plane (runs at exit)."""
    with _clients_lock:
        clients = list(_clients.items())
        _clients.clear()
    for url, client in clients:
        try:
            client.close(stop=True)
        except ServiceError as exc:
            log.warning("closing the IdeGym client of %s: %s", url or "the embedded control plane", exc)
        finally:
            if url is None:
                embedded.release()


# -- the episode --------------------------------------------------------------------------------


def _end_env(env: IdeGymEnv) -> None:
    try:
        env.close()
    except Exception as exc:  # noqa: BLE001 - gone sandbox, control plane down, or a client closed at exit
        log.debug("releasing the sandbox: %s", exc)


class ToolCallEpisode:
    """One episode at a time of IdeGym tasks, as named tool calls (see the module docstring).

    ``control_plane_url`` (default: the embedded control plane) says where sandboxes come from;
    ``allowed_tasks`` restricts what :meth:`start` accepts to these bundled task ids (for servers
    whose callers are not trusted with paths); ``env_kwargs`` go to ``IdeGymEnv`` (``max_steps``,
    ``bash_timeout``, ``reward_fn``, ``max_observation_chars``...).
    """

    def __init__(self, *, control_plane_url: str | None = None, allowed_tasks: tuple[str, ...] | None = None,
                 **env_kwargs: Any) -> None:
        for key in ("client", "sandbox", "control_plane_url", "reuse"):
            if key in env_kwargs:
                raise TypeError(f"{key!r} is chosen by the episode; leave it out of the env's arguments")
        self.control_plane_url = control_plane_url
        self.allowed_tasks = allowed_tasks
        self.env_kwargs = env_kwargs
        self.env: IdeGymEnv | None = None
        self.instruction: str | None = None
        self.reward: float | None = None
        self.infra_error: str | None = None
        self.done = False
        self.last_info: dict[str, Any] = {}
        self._finalizer: weakref.finalize | None = None
        self._sessions: AsyncSessions | None = None  # call_async's own, when its caller brings none

    # -- life cycle -------------------------------------------------------------------------------

    @property
    def task(self) -> Task | None:
        return self.env.task if self.env is not None else None

    @property
    def active(self) -> bool:
        """An episode is running: tools can be called."""
        return self.env is not None and not self.done

    def start(self, task: Task | str | Path) -> str:
        """End the current episode (if any) and start one of ``task``; returns its instruction.

        Raises :class:`ToolCallError` for a task that does not exist or is not allowed, and
        :class:`InfrastructureError` when no sandbox could be had."""
        resolved = self._resolve(task)  # first: a task that cannot be had leaves the current episode alone
        self.end()
        self.reward, self.infra_error, self.done, self.last_info = None, None, False, {}
        try:
            env = IdeGymEnv(resolved, client=shared_client(self.control_plane_url), **self.env_kwargs)
        except (ServiceError, RuntimeError) as exc:
            raise self._failed(f"could not prepare task {resolved.id!r}: {exc}") from exc
        self.env = env
        self._finalizer = weakref.finalize(self, _end_env, env)  # also at exit, before the client closes
        try:
            self.instruction, info = env.reset()
        except (ServiceError, RuntimeError) as exc:
            raise self._failed(f"could not get a sandbox for task {resolved.id!r}: {exc}") from exc
        self.last_info = info
        return self.instruction

    def end(self) -> None:
        """Hand the sandbox back (FINISHED: reusable by the next episode of the task)."""
        env, self.env = self.env, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if env is not None:
            _end_env(env)
        sessions, self._sessions = self._sessions, None
        if sessions is not None:
            sessions.close()

    # -- tools --------------------------------------------------------------------------------------

    def call(self, tool: str, arguments: dict[str, Any] | ToolCall | None = None) -> ToolCallOutcome:
        """Run one tool (a name of :data:`TOOL_NAMES`) with its arguments.

        A command that fails is a result; a malformed call raises :class:`ToolCallError`; a dead
        sandbox or unreachable control plane raises :class:`InfrastructureError` and ends the
        episode without a reward."""
        action = self._action(tool, arguments)
        if isinstance(action, ToolCallOutcome):
            return action
        return self._step(action)

    async def call_async(self, tool: str, arguments: dict[str, Any] | ToolCall | None = None,
                         sessions: AsyncSessions | None = None) -> ToolCallOutcome:
        """:meth:`call` on the running event loop (``IdeGymEnv.step_async`` over ``sessions``, by
        default the episode's own for that loop, closed at :meth:`end`): the same outcomes and
        errors. What ends the episode (grading, handing the sandbox back) runs on a worker thread."""
        action = self._action(tool, arguments)
        if isinstance(action, ToolCallOutcome):
            return action
        return await self._step_async(action, sessions)

    async def act_async(self, reply: Any, sessions: AsyncSessions | None = None) -> ToolCallOutcome:
        """A model's reply (JSON text, optionally fenced, or a dict: the shapes ``parse_tool_call``
        reads) as one :meth:`call_async`. One that is no valid call of :data:`TOOL_NAMES` is still a
        step, the env's invalid action (counted against ``max_steps``): :class:`ToolCallError`
        with the env's message, as for any invalid call."""
        self._require_active()
        try:
            call = parse_tool_call(reply, TOOL_NAMES)
        except InvalidAction:
            return await self._step_async(reply, sessions)
        return await self.call_async(call.tool, call, sessions)

    async def _step_async(self, action: Any, sessions: AsyncSessions | None) -> ToolCallOutcome:
        env = self._require_active()
        if sessions is None:
            sessions = self._sessions = AsyncSessions.on_running_loop(self._sessions)
        try:
            result = await env.step_async(action, sessions)
        except ServiceError as exc:
            return await asyncio.to_thread(self._stepped, None, exc)
        text, reward, terminated, truncated, info = result
        if terminated or truncated or _infra_failure(info) is not None:  # the sandbox is handed back
            return await asyncio.to_thread(self._stepped, result, None)
        return self._stepped(result, None)

    def _action(self, tool: str, arguments: dict[str, Any] | ToolCall | None
                ) -> dict[str, Any] | ToolCall | ToolCallOutcome:
        """The env's action for a call, or the outcome of one that answers itself. ``arguments``
        may be the call already validated (MCP's), which the env takes as it is."""
        env = self._require_active()
        kind = TOOLS.get(tool)
        if kind is None:
            raise ToolCallError(f"unknown tool {tool!r}; the tools are {', '.join(TOOL_NAMES)}")
        action: dict[str, Any] | ToolCall
        if isinstance(arguments, ToolCall) and arguments.tool == tool:
            action = arguments
        elif arguments is not None and not isinstance(arguments, dict):
            raise ToolCallError(f"the arguments of {tool} must be an object, got {type(arguments).__name__}")
        else:
            action = {"tool": tool}
            if arguments:
                action["arguments"] = {k: v for k, v in arguments.items() if v is not None}
        if kind.in_space:
            return action  # the env reads the call (an invalid one is a step too)
        try:  # a tool the action space leaves out (run_checks): the call stands for another, or answers itself
            step = parse_tool_call(action, (tool,)).in_task(env.task)
        except InvalidAction as exc:
            raise ToolCallError(str(exc)) from None
        if isinstance(step, str):
            return ToolCallOutcome(text=step, info={"tool": tool})
        return step.to_action()

    def submit(self) -> ToolCallOutcome:
        """Grade the episode (the task's checks) and end it; the reward is in the outcome."""
        return self.call("submit")

    def grade(self) -> float | None:
        """The episode's reward, grading it now if it has not been (a trainer's end of rollout).

        ``None`` when the episode could not be graded (:attr:`infra_error` says why)."""
        if self.env is None and self.reward is None and self.infra_error is None:
            raise ToolCallError("no episode to grade: start one first")
        if self.reward is None and self.infra_error is None:
            try:
                self.submit()
            except InfrastructureError:
                pass
        return self.reward

    # -- helpers ------------------------------------------------------------------------------------

    def _step(self, action: dict[str, Any] | ToolCall) -> ToolCallOutcome:
        env = self._require_active()
        try:
            result = env.step(action)
        except ServiceError as exc:
            return self._stepped(None, exc)
        return self._stepped(result, None)

    def _stepped(self, result: tuple[str, SupportsFloat, bool, bool, dict[str, Any]] | None,
                 error: ServiceError | None) -> ToolCallOutcome:
        """A step's outcome (``error``: the step failed for the control plane or the sandbox)."""
        if result is None:
            raise self._failed(f"the control plane or the sandbox failed: {error}") from error
        text, reward, terminated, truncated, info = result
        self.last_info = info
        done = bool(terminated or truncated)
        infra = _infra_failure(info)
        if infra is not None:
            raise self._failed(infra)
        if done:
            self.done = True
            self.reward = float(reward)
            self.end()
        elif info.get("invalid_action"):
            raise ToolCallError(text)
        return ToolCallOutcome(text=text, reward=float(reward), done=done, info=info)

    def _failed(self, message: str) -> InfrastructureError:
        """End the episode on an infrastructure failure; returns the error to raise."""
        self.infra_error = message
        self.done = True
        self.reward = None
        log.warning("IdeGym episode failed (infrastructure, not scored): %s", message)
        self.end()
        return InfrastructureError(message)

    def _require_active(self) -> IdeGymEnv:
        if self.env is None or self.done:
            if self.infra_error is not None:
                raise ToolCallError(f"the episode ended on an infrastructure failure ({self.infra_error}); "
                                    "start another")
            if self.done:
                raise ToolCallError("the episode has ended (it was graded); start another")
            raise ToolCallError("no episode is running: start one first")
        return self.env

    def _resolve(self, task: Task | str | Path) -> Task:
        from ..tasks import BUNDLED_DIR, TaskError, load_task

        if isinstance(task, Task):
            return task
        if not isinstance(task, (str, Path)) or not str(task):
            raise ToolCallError(f"a task is named by a task id or directory, not {task!r}")
        if self.allowed_tasks is not None:
            if str(task) not in self.allowed_tasks:
                raise ToolCallError(f"task {str(task)!r} is not served here; tasks: {', '.join(self.allowed_tasks)}")
            return load_task(BUNDLED_DIR / str(task))  # by id, never a path of that spelling
        try:
            return load_task(task)
        except TaskError as exc:
            raise ToolCallError(str(exc)) from None


def _infra_failure(info: dict[str, Any]) -> str | None:
    """Why a step failed for reasons that are not the agent's, or None (one place for the rule).

    Grading errors (a missing test, an unreadable report) are the agent's and scored as the env
    scores them; only a lost sandbox or grading that could not run at all is infrastructure."""
    if info.get("sandbox_lost"):
        return str(info.get("error") or "the sandbox is gone")
    if info.get("infrastructure_error"):
        return f"grading could not run: {info['infrastructure_error']}"
    return None


def tool_guide() -> str:
    """The adapters' tools as a list, for prompts of text-only frameworks."""
    return _tool_guide(TOOL_NAMES)


__all__ = ["ToolCallEpisode", "ToolCallOutcome", "InfrastructureError", "ToolCallError", "TOOL_NAMES", "shared_client",
           "close_shared_clients", "tool_guide"]
