"""``IdeGymEnv`` — ``gym.make("IdeGym-v0", task=...)``: one coding task per episode, in a sandbox.

Episode
    ``reset()`` gets a sandbox for the task (the env's constructor builds the task's image when
    the control plane does not have it: a Dockerfile ``environment`` with buildah, a project over
    an image), writes the task's starting ``files`` into its project and returns the task's
    instruction. Between episodes the env keeps its sandbox and makes it fresh with the ``reuse``
    strategy: ``"RESTART"`` (default; nothing of the previous episode survives), ``"RESET"`` (project restored and
    tool processes ended; the rest of the filesystem stays) or ``"NONE"`` (a new server). The
    first ``reset()`` takes over a FINISHED server of the same task when one is free. A task with
    ``environment.services`` (a Harbor compose environment) gets its services and its sandbox
    started afresh, together, at every ``reset()`` and stopped together (``tasks/services.py``);
    an image ``environment.entrypoint`` is started in every fresh sandbox; a
    ``verifier_environment`` is graded in a sandbox of its own (``grading/separate.py``).

    ``step(action)`` runs one tool call and returns its result as text. An action is a tool
    call dict ``{"tool": ..., "arguments": {...}}`` (see ``spaces.ToolCallSpace``) or the JSON /
    tool-call shape an LLM emits. A malformed action does not crash the episode: the
    observation explains what is wrong and the reward is ``-invalid_action_penalty``.

    ``{"tool": "submit"}`` runs the task's checks (protected files restored first, leftover
    processes ended) and terminates with the task's reward. Running out of ``max_steps``
    truncates — and the checks run then too, so the last reward is meaningful.

    Once an episode has ended (``terminated`` or ``truncated``), ``step`` raises
    :class:`EpisodeEnded` until ``reset()`` starts the next one: it never runs a tool or grades
    (and pays) again. ``reset(options={"task": ...})`` switches to another task (an id, a path or
    a ``Task``; its action space must be the same); any other option is an error.

    ``close()`` finishes the sandbox (reusable by the next env of the same task) and returns at
    once; the embedded control plane stays up for a grace period (``$IDEGYM_EMBEDDED_GRACE``, 60 s
    by default) so that the next ``gym.make`` finds it, and ends at interpreter exit at the latest.

    ``fork(n)`` returns ``n`` envs that continue the running episode, each in a sandbox forked
    from this one's (the whole filesystem as it is, fresh processes): tree search, best-of-n.

A sandbox of your own
    ``IdeGymEnv(task, sandbox=Sandbox.connect(unix_socket=...))`` works on a sandbox server you
    connected to directly, with no control plane: no image is built and no server is started.
    Such a sandbox can only be RESET, so every ``reset()`` restores the project byte for byte
    and ends every process a tool started (``reuse`` must be left out or be ``"RESET"``);
    ``close()`` leaves the sandbox to whoever connected it. The OpenEnv server uses this when it
    runs inside its own sandbox (``idegym openenv serve --in-sandbox``).

A bash call runs at most ``bash_timeout`` seconds (also its timeout when it names none), and no
longer than the task's ``agent_timeout`` has left: an action that asks for more is held to that,
and its observation (and ``info["timeout_capped"]``) says so.

``info`` carries the structured details: ``tool``, ``exit_code``, ``timed_out``, ``error``, and
after grading ``checks`` and ``reward_components``. A step's info leaves its wall time out, so two
runs give identical infos (Gymnasium's ``check_env`` demands it): the time is
``env.last_step_seconds``, and ``info_timing=True`` puts it in the info as ``seconds`` too.
``reset()``'s info always has ``reset_seconds`` (reset infos are not compared).
``render_mode="ansi"`` renders the transcript.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsFloat

import gymnasium as gym

from sandbox_server.grading.models import GradedTests
from sandbox_server.models import Status, TestReport
from sandbox_server.output import omitted_marker

from . import embedded, grading
from .client import APIError, BadRequest, Conflict, IdeGymClient, NotFound, Sandbox, SandboxGone, Unauthorized
from .client._plans import run_tool
from .client._protocol import Blocking, Plan
from .errors import IdeGymError
from .rewards import CheckResults, RewardFunction, reward_components
from .spaces import InvalidAction, ToolCallSpace, UnicodeText
from .tasks import Task, environment, load_task
from .tasks import services as task_services
from .tools import ToolCall

if TYPE_CHECKING:
    from .client._async import AsyncSessions
    from .env_fork import ClientShare

DEFAULT_TASK = "python-roman-numerals"
_SERVER_CUT = re.compile(re.escape(omitted_marker(0)).replace("0", r"(\d+)"))  # the sandbox server's cut
ENV_CLIENT_NAME = "idegym-env"
RESET_OPTIONS = ("task",)
DEFAULT_BASH_TIMEOUT = 120.0
MIN_CALL_SECONDS = 1.0  # a call's timeout when the episode's wall time is (almost) spent


class EpisodeEnded(IdeGymError, gym.error.ResetNeeded, RuntimeError):
    """``step()`` after the episode ended: call ``reset()`` first."""


def resolve_task(task: Task | str | Path | None) -> Task:
    if isinstance(task, Task):
        return task
    if task is None:
        task = DEFAULT_TASK
    return load_task(task)


def task_image_tag(task: Task) -> str:
    """The tag of the image an episode of ``task`` runs in, when the env builds it."""
    if task.environment is not None:
        return environment.image_entries(task)[-1]["tag"]
    return f"idegym-task/{task.id}:{task.content_hash()[:12]}"


class IdeGymEnv(gym.Env[str, Any]):  # an action: a tool call in any shape an LLM writes it
    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        task: Task | str | Path | None = None,
        *,
        control_plane_url: str | None = None,
        reward_fn: RewardFunction | None = None,
        reuse: str | None = None,
        max_steps: int | None = None,
        max_observation_chars: int = 16_384,
        invalid_action_penalty: float = 0.0,
        bash_timeout: float = DEFAULT_BASH_TIMEOUT,
        render_mode: str | None = None,
        info_timing: bool = False,
        client: IdeGymClient | None = None,
        sandbox: Sandbox | None = None,
    ) -> None:
        self.task = resolve_task(task)
        if sandbox is not None:
            if client is not None or control_plane_url is not None:
                raise ValueError("pass a directly connected sandbox or a control plane (url or client), not both")
            if reuse is not None and reuse.upper() != "RESET":
                raise ValueError(f"a directly connected sandbox can only be RESET between episodes, not {reuse!r}")
            reuse = "RESET"
        reuse = "RESTART" if reuse is None else reuse
        if reuse.upper() not in ("RESTART", "RESET", "NONE"):
            raise ValueError(f"reuse must be RESTART, RESET or NONE, not {reuse!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None")
        self.reuse = reuse.upper()
        self._chosen_reward_fn, self._chosen_max_steps = reward_fn, max_steps  # kept by a task switch
        self.reward_fn = reward_fn or self.task.reward_function()
        self.max_steps = max_steps or self.task.max_steps
        self.invalid_action_penalty = invalid_action_penalty
        self.bash_timeout = bash_timeout
        self.render_mode = render_mode
        self.info_timing = info_timing
        self.last_step_seconds = 0.0
        # tool calls; an agent harness's env (agents/env.py) takes text
        self.action_space: ToolCallSpace | UnicodeText = self.task.action_space()
        self.observation_space: UnicodeText = UnicodeText(max_length=max_observation_chars)
        self._embedded = False
        self._direct = sandbox  # a sandbox connected by the caller: no control plane at all
        self._owns_client = client is None and sandbox is None
        self._client_share: ClientShare | None = None  # a client shared with forks (env_fork.py)
        self.client: IdeGymClient | None = None  # None: a directly connected sandbox
        self.image: str | None = None
        if sandbox is None:
            if client is None:
                url = control_plane_url
                if url is None:
                    url = embedded.acquire().url
                    self._embedded = True
                client = IdeGymClient(url, name=ENV_CLIENT_NAME)
                client.register()
            self.client = client
            self.image = self._ensure_image(client)
        self.sandbox: Sandbox | None = None
        self._services: dict[str, Sandbox] = {}  # the task's services beside its sandbox, by name
        self._steps = 0
        self._ended = False  # the episode ended: step() needs a reset() first
        self._episode_started = time.monotonic()
        self._transcript: list[str] = []
        self._closed = False

    # -- set-up -----------------------------------------------------------------------------------

    def _ensure_image(self, client: IdeGymClient) -> str:
        """The task's image, built through the control plane when it is not there yet (a content
        hash tags it, so a second env of the same task, or of a task with the same Dockerfile and
        context, finds it in the store without building)."""
        if self.task.environment is not None:
            tag = ""
            for entry in environment.image_entries(self.task):  # the Dockerfile's image, then the project on it
                client.build_images(json.dumps({"images": [entry]}), timeout=3600)
                tag = entry["tag"]
            return tag
        if self.task.image:
            return self.task.image
        assert self.task.project is not None
        tag = task_image_tag(self.task)
        image: dict[str, Any] = {"tag": tag, "project": {"path": str(self.task.project.resolve())}}
        if self.task.network:
            image["network"] = True  # on the local backend the network is the image's to allow
        doc = {"images": [image]}
        client.build_images(json.dumps(doc), timeout=600)
        return tag

    def _start_fields(self) -> dict[str, Any]:
        """What the task asks of its sandbox: root tools (Harbor images), resource limits."""
        fields: dict[str, Any] = {"run_as_root": self.task.run_as_root}
        limits = self.task.resources
        if limits is not None:
            quantities = {k: v for k, v in (("cpu", None if limits.cpus is None else f"{limits.cpus:g}"),
                                            ("memory", None if limits.memory_mb is None else f"{limits.memory_mb}Mi"),
                                            ("ephemeral_storage",
                                             None if limits.storage_mb is None else f"{limits.storage_mb}Mi"))
                          if v is not None}
            if quantities:
                fields["resources"] = {"limits": quantities}
        return fields

    @property
    def tool_calls(self) -> ToolCallSpace:
        """The action space, whose actions are tool calls."""
        if not isinstance(self.action_space, ToolCallSpace):
            raise TypeError(f"the actions of {type(self).__name__} are not tool calls")
        return self.action_space

    def _control_plane(self) -> tuple[IdeGymClient, str]:
        """The client and image sandboxes are started with (not for a directly connected sandbox)."""
        if self.client is None or self.image is None:
            raise RuntimeError("this env runs on a sandbox connected directly: there is no control plane")
        return self.client, self.image

    def _acquire(self) -> tuple[Sandbox, dict[str, Any]]:
        """A fresh sandbox for a new episode, and how it was obtained."""
        started = time.perf_counter()
        how: str
        if self._direct is not None:
            self.sandbox = self._direct
            self.sandbox.reset()
            how = "reset"
        elif self.task.environment is not None and self.task.environment.services:
            self._stop_group()  # the services and the sandbox in their network: all fresh, every episode
            self.sandbox = self._start_group()
            how = "started"
        elif self.sandbox is None:
            # A server handed back by another env (of this client) is restarted, never reset: RESET
            # keeps what lies outside the project, which only this env's own episodes may share.
            reuse = "NONE" if self.reuse == "NONE" else "RESTART"
            client, image = self._control_plane()
            self.sandbox = client.start(image, server_name=_server_name(self.task), reuse=reuse, **self._start_fields())
            how = "reused" if self.sandbox.info and self.sandbox.info.reused else "started"
        elif self.reuse == "RESTART":
            self.sandbox.restart()
            how = "restarted"
        elif self.reuse == "RESET":
            self.sandbox.reset()
            how = "reset"
        else:
            old, self.sandbox = self.sandbox, None
            old.stop()
            client, image = self._control_plane()
            self.sandbox = client.start(image, server_name=_server_name(self.task), reuse="NONE",
                                        **self._start_fields())
            how = "started"
        for path, content in sorted(self.task.files.items()):  # the task's starting files, over the image's project
            self.sandbox.write_file(path, content)
        entrypoint = self.task.environment.entrypoint if self.task.environment is not None else None
        if entrypoint:  # the image's ENTRYPOINT, started as Harbor's docker environment starts it
            started_entrypoint = self.sandbox.bash(task_services.entrypoint_command(entrypoint), timeout=60)
            if started_entrypoint.exit_code != 0:
                raise RuntimeError(f"the image's ENTRYPOINT ({' '.join(entrypoint)[:120]}) did not start: "
                                   f"{(started_entrypoint.stderr or started_entrypoint.stdout)[-500:]}")
        info: dict[str, Any] = {"sandbox": how, "server_id": self.sandbox.server_id,
                                "reset_seconds": time.perf_counter() - started}
        return self.sandbox, info

    def _start_group(self) -> Sandbox:
        """Drive :func:`~idegym_env.tasks.services.bring_up` (as the Harbor provider does): each
        service a sandbox of this env's client, the task's own sandbox among them."""
        client, image = self._control_plane()
        assert self.task.environment is not None
        services = {service.name: service for service in self.task.environment.services}
        plan = task_services.bring_up(services)
        started: dict[str, Sandbox] = {}
        answer: Any = None
        try:
            while True:
                try:
                    step = plan.send(answer)
                except StopIteration:
                    return started[task_services.MAIN]
                if isinstance(step, task_services.Start):
                    name = step.service.name
                    joined: dict[str, Any] = {"network_of": step.network_of} if step.network_of is not None else {}
                    if name == task_services.MAIN:
                        self.sandbox = started[name] = client.start(image, server_name=_server_name(self.task),
                                                                    reuse="NONE", **self._start_fields(), **joined)
                    else:
                        entry = environment.service_entry(step.service, network=self.task.network)
                        client.build_images(json.dumps({"images": [entry]}), timeout=3600)
                        self._services[name] = started[name] = client.start(
                            str(entry["tag"]), server_name=_server_name(self.task, name), reuse="NONE",
                            run_as_root=True, **joined)
                    answer = int(started[name].server_id or 0)
                elif isinstance(step, task_services.Run):
                    result = started[step.service].bash(step.command, timeout=60, user=step.user)
                    answer = (result.exit_code, result.stderr or result.stdout)
                else:
                    time.sleep(step.seconds)
        except BaseException:
            self._stop_group()
            raise

    def _stop_group(self) -> None:
        """Stop the task's services and the sandbox in their network (it is of no use without them)."""
        group = [*self._services.values(), *([self.sandbox] if self.sandbox is not None else [])]
        self._services, self.sandbox = {}, None
        for sandbox in group:
            try:
                sandbox.stop()
            except APIError:
                pass  # already gone

    def _switch_task(self, task: Task | str | Path) -> None:
        """``reset(options={"task": ...})``: the next episodes play ``task`` (its image, reward and
        step budget, unless the env was given its own); the current sandbox is handed back."""
        new = resolve_task(task)
        if new.id == self.task.id and new.content_hash() == self.task.content_hash():
            return
        if self._direct is not None:
            raise ValueError("this env runs on a sandbox connected directly, which holds one task's project: "
                             f"it cannot switch to task {new.id!r}")
        space = new.action_space()
        if space != self.action_space:
            raise ValueError(f"task {new.id!r} has another action space ({space}) than {self.task.id!r} "
                             f"({self.action_space}): make a new env for it")
        old = self.task
        self.task = new
        try:
            image = self._ensure_image(self._control_plane()[0])
        except BaseException:
            self.task = old
            raise
        if self._services:
            self._stop_group()
        if self.sandbox is not None:
            sandbox, self.sandbox = self.sandbox, None
            try:
                sandbox.finish()  # reusable by an env of the old task
            except APIError:
                pass
        self.image = image
        self.reward_fn = self._chosen_reward_fn or new.reward_function()
        self.max_steps = self._chosen_max_steps or new.max_steps

    # -- the Env API --------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        if self._closed:
            raise RuntimeError("the environment is closed")
        options = dict(options or {})
        unknown = sorted(set(options) - set(RESET_OPTIONS))
        if unknown:
            raise ValueError(f"unknown reset option(s) {unknown}: IdeGymEnv.reset takes "
                             "options={'task': <task id, task directory or Task>}")
        if options.get("task") is not None:
            self._switch_task(options["task"])
        try:
            _, info = self._acquire()
        except SandboxGone:
            self.sandbox = None  # it died between episodes: get another one
            _, info = self._acquire()
        self._steps = 0
        self._ended = False
        self._episode_started = time.monotonic()
        observation = self.observation_space.fit(self.task.instruction)
        self._transcript = [f"# task {self.task.id}\n{self.task.instruction}"]
        info.update(task_id=self.task.id, max_steps=self.max_steps)
        return observation, info

    def step(self, action: Any) -> tuple[str, SupportsFloat, bool, bool, dict]:
        sandbox = self._steppable()
        return sandbox.run_plan(self._step_plan(action))

    async def step_async(self, action: Any, sessions: AsyncSessions) -> tuple[str, SupportsFloat, bool, bool, dict]:
        """``step`` on the running event loop: its sandbox call made there, over ``sessions``'
        connections to where the sandbox is (no thread hop); grading, which the client makes
        synchronously, on a worker thread. The same step, counted and answered the same way."""
        sandbox = self._steppable()
        return await sessions.run(sandbox, self._step_plan(action))

    def _steppable(self) -> Sandbox:
        if self._ended:
            raise EpisodeEnded("the episode has ended (terminated or truncated): call reset() to start the next "
                               "one")
        if self.sandbox is None:
            raise RuntimeError("call reset() before step()")
        return self.sandbox

    def _step_plan(self, action: Any) -> Plan[tuple[str, SupportsFloat, bool, bool, dict]]:
        """One step as a plan (``client/_protocol.py``): its one sandbox call is yielded, so that
        either client drives it; grading is yielded as ``Blocking`` work."""
        self._steps += 1
        info: dict[str, Any] = {"step": self._steps}
        started = time.perf_counter()
        try:
            call = self.tool_calls.parse(action)
        except InvalidAction as exc:
            info.update(invalid_action=True, error=exc.reason)
            self._log(f"$ <invalid action> {str(action)[:200]}", str(exc))
            return (yield from self._after(str(exc), -self.invalid_action_penalty if self.invalid_action_penalty
                                           else 0.0, info, started))
        info["tool"] = call.tool
        if call.ends_episode:
            return (yield Blocking(lambda: self._finish(info, started, submitted=True)))
        try:
            text = yield from self._run_tool(call, info)
        except SandboxGone as exc:
            info.update(error=f"the sandbox is gone: {exc.message}", sandbox_lost=True)
            self._log(self._describe(call), info["error"])
            self.sandbox = None
            self._ended = True
            self._timed(info, started)
            return self.observation_space.fit(info["error"]), 0.0, False, True, info
        self._log(self._describe(call), text)
        return (yield from self._after(text, 0.0, info, started))

    def _after(self, observation: str, reward: float, info: dict, started: float
               ) -> Plan[tuple[str, SupportsFloat, bool, bool, dict]]:
        """The step's result; ``observation`` is the step's whole text (fitted here, once)."""
        if self._steps >= self.max_steps:
            info["truncated_by"] = "max_steps"
            return (yield Blocking(lambda: self._finish(info, started, submitted=False, observation=observation)))
        timeout = self.task.agent_timeout
        if timeout is not None and time.monotonic() - self._episode_started >= timeout:
            info["truncated_by"] = "agent_timeout"  # Harbor's [agent] timeout_sec: wall time of the episode
            return (yield Blocking(lambda: self._finish(info, started, submitted=False, observation=observation)))
        self._timed(info, started)
        return self._fit(observation), reward, False, False, info

    def _fit(self, text: str) -> str:
        """``text`` as an observation. A cut's marker counts what the sandbox server had already
        cut from a command's output (its markers say bytes; counted as characters here)."""
        earlier = [(m.start(), m.end(), int(m.group(1))) for m in _SERVER_CUT.finditer(text)]
        return self.observation_space.fit(text, cut_before=earlier)

    def _timed(self, info: dict[str, Any], started: float) -> None:
        self.last_step_seconds = time.perf_counter() - started
        if self.info_timing:
            info["seconds"] = self.last_step_seconds

    # gymnasium types render() with a type variable no subclass can name (RenderFrame)
    def render(self) -> str | None:  # type: ignore[override]
        if self.render_mode == "ansi":
            return "\n\n".join(self._transcript) + "\n"
        return None

    def fork(self, n: int = 1) -> list[IdeGymEnv]:
        """``n`` envs continuing this episode (same task, step count, transcript), each in a sandbox
        forked from this one's (the whole filesystem, fresh processes); see ``env_fork.py``."""
        from .env_fork import fork_env

        return fork_env(self, n)

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        try:
            if self._services:
                self._stop_group()
            if self.sandbox is not None and self._direct is None:
                try:
                    self.sandbox.finish()
                except APIError:
                    pass  # already gone: nothing to hand back
            if self._owns_client and self.client is not None:
                self.client.close(stop=True)
            elif self._client_share is not None:  # shared with forks (env_fork.py)
                self._client_share.release()
        finally:
            self.sandbox = None
            if self._embedded:
                embedded.release()
                self._embedded = False

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    # -- tools and grading -----------------------------------------------------------------------

    def bash_limit(self) -> float:
        """The most a bash call may run now: ``bash_timeout``, and no longer than the task's
        ``agent_timeout`` (the episode's wall time) has left."""
        limit = self.bash_timeout
        if self.task.agent_timeout is not None:
            left = self.task.agent_timeout - (time.monotonic() - self._episode_started)
            limit = min(limit, max(left, MIN_CALL_SECONDS))
        return limit

    def _run_tool(self, call: ToolCall, info: dict[str, Any]) -> Plan[str]:
        """Carry ``call`` out in the sandbox; its tool makes the observation of the answer."""
        assert self.sandbox is not None
        limit = self.bash_limit()
        try:
            answer = yield from run_tool(self.sandbox.target, call, limit)
        except (BadRequest, NotFound, Conflict, Unauthorized) as exc:
            info["error"] = exc.message
            return f"error: {exc.message}"
        return call.observe(answer, info, limit)

    def _finish(self, info: dict[str, Any], started: float, *, submitted: bool,
                observation: str | None = None) -> tuple[str, SupportsFloat, bool, bool, dict]:
        assert self.sandbox is not None
        sandbox = self.sandbox
        # A fresh sandbox to grade in: a RESTART through the control plane, a project reset for a
        # sandbox connected directly (there the rest of the filesystem stays the agent's).
        fresh = sandbox.reset if self._direct is not None else sandbox.restart
        self._ended = True
        if self.task.verifier_environment is not None:  # Harbor's separate verifier
            from .grading.separate import grade_separately  # (it reaches integrations, which import this module)

            client, _ = self._control_plane()
            graded = grade_separately(client, sandbox, self.task, server_name=_server_name(self.task, "verifier"),
                                      steps=self._steps, submitted=submitted)
        else:
            graded = grading.grade(sandbox, self.task, fresh=fresh, steps=self._steps, submitted=submitted)
        results = graded.results
        reward = float(self.reward_fn(results))
        # info is plain data (JSON, pickled to Ray workers): the stages' answers as their JSON bodies
        info.update(checks={name: body.model_dump(mode="json") for name, body in results.stages().items()},
                    reward_components=reward_components(results), grading_errors=list(results.errors),
                    submitted=submitted)
        if results.tests_verdict is not None:  # passed | failed | no_tests | error, without digging into checks
            info["tests_verdict"] = results.tests_verdict
        if results.infrastructure_error:
            info["infrastructure_error"] = results.infrastructure_error
        if graded.skipped:
            info["not_graded"] = graded.skipped
        self._timed(info, started)
        summary = _format_checks(results, reward)
        self._log("$ submit" if submitted else "$ <out of steps>", summary)
        text = summary if observation is None else f"{observation}\n\n{summary}"
        return self._fit(text), reward, submitted, not submitted, info

    # -- transcript ----------------------------------------------------------------------------------

    def _describe(self, call: ToolCall) -> str:
        return f"$ {call.describe()}"

    def _log(self, command: str, output: str) -> None:
        self._transcript.append(f"{command}\n{output}")


def _server_name(task: Task, service: str | None = None) -> str:
    prefix = f"task-{service}-" if service else "task-"  # a service's name first: never cut off
    name = "".join(c if c.isalnum() else "-" for c in f"{prefix}{task.id}".lower())
    return name[:63].rstrip("-")


def _format_checks(results: CheckResults, reward: float) -> str:
    lines = ["[checks]"]
    for stage, answer in results.stages().items():
        if isinstance(answer, TestReport):
            s = answer.scores
            verdict = results.tests_verdict
            if verdict == "no_tests":  # not a failed solution: nothing was tested (say why, from the output)
                lines.append(f"tests: no_tests — no test ran: the test script (exit code {answer.exit_code}) "
                             "reported no test; the end of its output:")
            else:
                lines.append(f"tests: {verdict} — {s.passed}/{s.total} passed, "
                             f"{s.failed} failed, {s.skipped} skipped")
                if verdict == "passed" and s.skipped and reward < 1.0:
                    cases = answer.cases if isinstance(answer, GradedTests) else []
                    names = [c.name for c in cases if c.outcome == "skipped"]
                    shown = ", ".join(names[:3]) + (" …" if len(names) > 3 else "")
                    lines.append(f"no test failed, but {s.skipped} skipped test(s) count as not passed in this "
                                 f"task's reward{f' ({shown})' if shown else ''}: a test that skips in the sandbox "
                                 "(a module or tool its image lacks) cannot pass")
            if verdict in ("no_tests", "error") and answer.output:
                lines.append(_tail(answer.output))
        else:
            lines.append(f"{stage}: {answer.status.value}")
            if answer.status != Status.SUCCESS and answer.output:
                lines.append(_tail(answer.output))
    lines += [f"grading error: {e}" for e in results.errors]
    lines.append(f"reward: {reward:.3f}")
    return "\n".join(lines)


def _tail(text: str, limit: int = 1500) -> str:
    text = text.strip()
    return text if len(text) <= limit else "[...]\n" + text[-limit:]

