"""``IdeGymOpenEnv``: an IdeGym episode as an OpenEnv ``Environment``.

One instance serves one OpenEnv session (one WebSocket connection) and wraps one
:class:`~idegym_env.env.IdeGymEnv`, created on the first ``reset`` — constructing the
environment is free, because OpenEnv also builds a throw-away instance for every HTTP
``/metadata``, ``/state``, ``/reset`` and ``/step`` call.

Where the sandbox comes from
    * control-plane mode (``control_plane_url``): each session's ``IdeGymEnv`` gets a sandbox of
      its own from the control plane, so sessions run side by side (``SUPPORTS_CONCURRENT_SESSIONS``).
      Between the episodes of one session the sandbox is made fresh with ``reuse`` (RESTART by
      default); ``close`` hands it back (FINISHED, reusable).
    * in-sandbox mode (``inner``): the server runs inside an ``openenv`` sandbox and the episode
      acts on that very sandbox, through a private sandbox server (:mod:`.inner`). There is one
      sandbox, hence one session at a time; every ``reset`` restores the project and ends the
      processes tools started.

Mapping to OpenEnv
    ``reset(seed, episode_id, task)`` returns the instruction; ``step(IdeAction)`` runs one tool
    call. ``done`` is ``terminated or truncated`` and ``reward`` is the step's reward (the task's
    reward on the grading step, ``-invalid_action_penalty`` for an invalid action, else 0). All of
    ``IdeGymEnv``'s ``info`` is in :class:`~.models.IdeObservation`'s fields, never in
    ``metadata`` (which OpenEnv does not send).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, SupportsFloat

from ._compat import import_openenv

import_openenv()

from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import EnvironmentMetadata  # noqa: E402

from .. import __version__  # noqa: E402
from ..client import Sandbox  # noqa: E402
from ..client._async import AsyncSessions  # noqa: E402
from ..env import IdeGymEnv  # noqa: E402
from ..integrations._episode import InfrastructureError, _infra_failure  # noqa: E402
from ..tasks import BUNDLED_DIR, Task, load_task  # noqa: E402
from .inner import InnerSandbox  # noqa: E402
from .models import IdeAction, IdeObservation, IdeState  # noqa: E402

RESET_ARGUMENTS = ("seed", "episode_id", "task", "options")


class IdeGymOpenEnv(Environment[IdeAction, IdeObservation, IdeState]):
    """One OpenEnv session of IdeGym episodes (see the module docstring).

    ``task`` is the default task (an id of a bundled task, or a task directory); a ``reset`` may
    name another one among ``allowed_tasks`` (ids of bundled tasks; default: all of them) — never
    an arbitrary path sent by a client. Exactly one of ``control_plane_url`` and ``inner``
    says where sandboxes come from. The other keyword arguments go to ``IdeGymEnv``.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True  # control-plane mode: a sandbox per session

    def __init__(
        self,
        task: Task | str | Path,
        *,
        control_plane_url: str | None = None,
        inner: InnerSandbox | None = None,
        allowed_tasks: tuple[str, ...] | None = None,
        reuse: str = "RESTART",
        max_steps: int | None = None,
        max_observation_chars: int = 16_384,
        invalid_action_penalty: float = 0.0,
        bash_timeout: float = 120.0,
    ) -> None:
        super().__init__()
        if (control_plane_url is None) == (inner is None):
            raise ValueError("give exactly one of control_plane_url (a sandbox per session from a control "
                             "plane) and inner (the sandbox this server runs in)")
        self.default_task = task if isinstance(task, Task) else load_task(task)
        self.control_plane_url = control_plane_url
        self.inner = inner
        self.allowed_tasks = allowed_tasks
        self._env_kwargs: dict[str, Any] = dict(
            max_steps=max_steps, max_observation_chars=max_observation_chars,
            invalid_action_penalty=invalid_action_penalty, bash_timeout=bash_timeout)
        if inner is None:
            self._env_kwargs["reuse"] = reuse
        self._env: IdeGymEnv | None = None
        self._leased = False
        self._direct: Sandbox | None = None  # in-sandbox mode: this session's connection to the sandbox server
        self._done = False
        self._sessions: AsyncSessions | None = None  # step_async's connections, on the server's loop
        self._state = IdeState(task_id=self.default_task.id, mode=self.mode)

    @property
    def mode(self) -> str:
        return "in-sandbox" if self.inner is not None else "control-plane"

    # -- OpenEnv API --------------------------------------------------------------------------

    def reset(self, seed: int | None = None, episode_id: str | None = None, task: str | None = None,
              options: dict[str, Any] | None = None, **kwargs: Any) -> IdeObservation:
        """Start an episode. ``task`` (or ``options["task"]``) picks another allowed task."""
        if kwargs:
            raise ValueError(f"unknown reset arguments {sorted(kwargs)}; reset takes {', '.join(RESET_ARGUMENTS)}")
        if task is None and options:
            unknown = set(options) - {"task"}
            if unknown:
                raise ValueError(f"unknown reset options {sorted(unknown)}; the only option is 'task'")
            task = options.get("task")
        wanted = self._resolve_task(task)
        if self._env is not None and self._env.task.id != wanted.id:
            self._close_env()
        if self._env is None:
            self._env = self._make_env(wanted)
        text, info = self._env.reset(seed=seed)
        self._done = False
        episode = episode_id or uuid.uuid4().hex
        env = self._env
        self._state = IdeState(episode_id=episode, step_count=0, task_id=env.task.id,
                               server_id=info.get("server_id"), max_steps=env.max_steps, mode=self.mode)
        return IdeObservation(
            text=text, task_id=env.task.id, episode_id=episode, step=0, max_steps=env.max_steps,
            server_id=info.get("server_id"), sandbox=info.get("sandbox"), seconds=info.get("reset_seconds"),
            tools=env.tool_calls.tool_schemas("openai"), done=False, reward=None,
        )

    def step(self, action: IdeAction, timeout_s: float | None = None, **kwargs: Any) -> IdeObservation:
        """Run one tool call. (``timeout_s`` is not used: a bash call has its own ``timeout``.)"""
        prepared = self._stepping(action)
        if isinstance(prepared, IdeObservation):
            return prepared
        env, call = prepared
        return self._observed(env, env.step(call))

    async def step_async(self, action: IdeAction, timeout_s: float | None = None, **kwargs: Any) -> IdeObservation:
        """:meth:`step` on the server's event loop (openenv-core awaits it there instead of
        handing ``step`` to a worker thread): the tool's call is made on the loop, over
        connections of this session's own; grading on a worker thread (``IdeGymEnv.step_async``)."""
        prepared = self._stepping(action)
        if isinstance(prepared, IdeObservation):
            return prepared
        env, call = prepared
        self._sessions = AsyncSessions.on_running_loop(self._sessions)
        return self._observed(env, await env.step_async(call, self._sessions))

    def _stepping(self, action: IdeAction) -> tuple[IdeGymEnv, dict[str, Any]] | IdeObservation:
        """The env and the action to step it with, or the observation of a step that cannot be made."""
        env = self._env
        if env is None or (env.sandbox is None and not self._done):
            return IdeObservation(
                text="no episode: call reset first (OpenEnv's HTTP /step runs on a fresh environment every time; "
                     "an episode needs the WebSocket /ws)",
                error="no episode: call reset first", task_id=self._state.task_id or "", done=False, reward=0.0)
        if self._done:
            ended = "the episode has ended: call reset to start another"
            return IdeObservation(
                text=ended, error=ended,
                task_id=env.task.id, episode_id=self._state.episode_id, step=self._state.step_count,
                max_steps=env.max_steps, done=True, reward=0.0)
        call: dict[str, Any] = {"tool": action.tool}
        if action.arguments is not None:
            call["arguments"] = action.arguments
        return env, call

    def _observed(self, env: IdeGymEnv, result: tuple[str, SupportsFloat, bool, bool, dict[str, Any]]
                  ) -> IdeObservation:
        text, reward, terminated, truncated, info = result
        self._done = bool(terminated or truncated)
        failure = _infra_failure(info)
        if failure is not None:  # no reward to give: OpenEnv's error frame (the client raises), not a 0
            self._state = self._state.model_copy(update={"step_count": info.get("step", self._state.step_count + 1),
                                                         "done": True, "reward": None})
            self._done = True
            raise InfrastructureError(f"{failure}: this episode has no reward; reset to start another")
        self._state = self._state.model_copy(update={"step_count": info.get("step", self._state.step_count + 1),
                                                     "done": self._done, "reward": float(reward)})
        return IdeObservation(
            text=text, task_id=env.task.id, episode_id=self._state.episode_id, step=info.get("step", 0),
            max_steps=env.max_steps, tool=info.get("tool"), exit_code=info.get("exit_code"),
            timed_out=bool(info.get("timed_out", False)), error=info.get("error"),
            invalid_action=bool(info.get("invalid_action", False)), submitted=bool(info.get("submitted", False)),
            truncated=bool(truncated), checks=info.get("checks") or {},
            reward_components=info.get("reward_components") or {}, grading_errors=info.get("grading_errors") or [],
            seconds=info.get("seconds"), server_id=self._state.server_id,
            done=self._done, reward=float(reward),
        )

    @property
    def state(self) -> IdeState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        task = self.default_task
        where = ("works on the sandbox it runs in" if self.inner is not None
                 else "gives each session a sandbox of its own from a control plane")
        return EnvironmentMetadata(
            name="IdeGym",
            description=f"IdeGym coding task {task.id!r} ({task.title}): act with tool calls (bash, file tools, "
                        f"submit) in a disposable sandbox; 'submit' runs the task's checks and gives the reward. "
                        f"This server {where}.",
            readme_content=task.instruction,
            version=__version__,
            author="IdeGym",
        )

    def close(self) -> None:
        if self._sessions is not None:
            self._sessions.close()
            self._sessions = None
        self._close_env()

    # -- helpers ----------------------------------------------------------------------------------

    def _resolve_task(self, task: str | None) -> Task:
        if task is None or task == self.default_task.id:
            return self.default_task
        if not isinstance(task, str):
            raise ValueError(f"task must be a task id, not {type(task).__name__}")
        if self.inner is not None:
            raise ValueError(f"this server runs inside the sandbox of task {self.default_task.id!r}; "
                             f"it cannot serve {task!r}")
        allowed = self.allowed_tasks
        if allowed is None:
            allowed = tuple(sorted(p.parent.name for p in BUNDLED_DIR.glob("*/task.yaml")))
        if task not in allowed:
            served = dict.fromkeys([self.default_task.id, *allowed])
            raise ValueError(f"task {task!r} is not served here; tasks: {', '.join(served)}")
        return load_task(BUNDLED_DIR / task)  # by id: never a path of that spelling in our cwd

    def _make_env(self, task: Task) -> IdeGymEnv:
        if self.inner is None:
            return IdeGymEnv(task, control_plane_url=self.control_plane_url, **self._env_kwargs)
        if not self.inner.lease.acquire(blocking=False):
            raise RuntimeError("the sandbox is in use by another session (a server inside its sandbox serves "
                               "one session at a time)")
        self._leased = True
        try:
            self._direct = self.inner.connect()
            return IdeGymEnv(task, sandbox=self._direct, **self._env_kwargs)
        except BaseException:
            self._release()
            raise

    def _close_env(self) -> None:
        env, self._env = self._env, None
        try:
            if env is not None:
                env.close()
        finally:
            self._release()

    def _release(self) -> None:
        if self._direct is not None:
            self._direct.close()
            self._direct = None
        if self._leased:
            self._leased = False
            assert self.inner is not None
            self.inner.lease.release()

__all__ = ["IdeGymOpenEnv", "RESET_ARGUMENTS"]
