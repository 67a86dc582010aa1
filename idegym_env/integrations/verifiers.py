"""verifiers: a native taskset of IdeGym tasks (``pip install 'idegym[verifiers]'``), run with
``vf-eval`` or prime-rl as ``--env.taskset.id idegym-verifiers``.

verifiers v1 loads a taskset by its id from any installed package: the module ``verifiers.v1.tasksets.<id>``
else the top-level module ``<id>`` (``-`` read as ``_``), which exports one ``Taskset`` subclass
and one ``Env`` subclass in ``__all__``. A dotted id cannot name this module (verifiers looks for
``verifiers.v1.tasksets.<id>`` first, and importing that fails on its missing parent), hence the
alias package :mod:`idegym_verifiers`, which re-exports this module.

* :class:`IdeGymTasksetConfig` (``[env.taskset]``): ``tasks`` (task specs as ``idegym eval`` takes
  them: ``bundled``, bundled ids, task directories, ``humaneval``, ``humaneval/HumanEval/0``,
  ``swe:<file>``, ``harbor:<dir>``), ``control_plane_url`` (default ``$IDEGYM_URL``, else an
  embedded control plane), ``max_steps``, ``bash_timeout``, ``max_observation_chars``,
  ``invalid_action_penalty``.
* :class:`IdeGymTaskset` yields one verifiers task per IdeGym task: its instruction is the prompt,
  the tools and the reply format the system prompt. Which task a rollout plays comes from this
  configuration, never from the model.
* :class:`IdeGymVerifiersEnv` plays the user, as verifiers' OpenEnv taskset does: the task's prompt
  opens the exchange, each model reply is one IdeGym action (``{"tool": ..., "arguments": ...}``
  as JSON, optionally fenced), stepped in this process on the event loop
  (:meth:`~._episode.ToolCallEpisode.act_async`: ``IdeGymEnv.step_async``, no thread hop), and
  its observation is the next user turn. A reply that is no valid call is a step whose
  observation says why. The exchange ends at ``submit`` or the env's ``max_steps``; one that
  verifiers ends first (its turn or token limits) is graded as it stands. The task's grading is
  the trace's reward ``idegym_reward``.
* An infrastructure failure (the sandbox died, the control plane is unreachable, grading could not
  run) raises :class:`~._episode.InfrastructureError` inside the rollout: verifiers records a
  failed rollout without that reward, never a 0. The sandbox is handed back when ``run()``
  ends, whatever ends it (also cancellation).

Replies are text rather than verifiers' tool calls: a v1 tool is an MCP server (``Toolset``) that
the harness's program calls, a process and a round trip per call between the model and the
sandbox; a text reply is stepped by the env itself, which is what makes this route cheaper than
OpenEnv's (benchmarks/integrations.py). The policy is an adversary: the taskset runs in the
trainer's process and only the task's instruction and the observations reach the model; its
checks stay with the env, which grades on ``submit``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.harnesses.null import NullHarnessConfig
from verifiers.v1.runtimes import SubprocessConfig

from ..tasks import Task
from ._episode import InfrastructureError, ToolCallEpisode, ToolCallError, tool_guide

#: How replies are read, said to the model before the tools.
REPLY_FORMAT = ('Act with exactly one tool call per reply, as JSON and nothing else: '
                '{"tool": "<name>", "arguments": {...}}. The next message is its result. '
                'Call submit when the task is done: it runs the task\'s checks and ends the episode.')


class IdeGymTasksetConfig(vf.TasksetConfig):
    tasks: list[str] = ["bundled"]
    """IdeGym tasks, each a spec as ``idegym eval --tasks`` reads it (``bundled``, a bundled id, a
    task directory, a source or one of its tasks)."""
    control_plane_url: str | None = None
    """Where sandboxes come from: default ``$IDEGYM_URL``, else an embedded control plane."""
    max_steps: int | None = None
    """Actions per episode (default: the task's own budget); the last one ends it, graded."""
    bash_timeout: float | None = None
    """Cap on one bash call's seconds (default: IdeGymEnv's)."""
    max_observation_chars: int | None = None
    """Cap on one observation's length (default: IdeGymEnv's)."""
    invalid_action_penalty: float = 0.0
    """Subtracted from the reward for each reply that is no valid tool call."""

    def env_kwargs(self) -> dict[str, Any]:
        """The ``IdeGymEnv`` arguments this configuration sets."""
        chosen = {"max_steps": self.max_steps, "bash_timeout": self.bash_timeout,
                  "max_observation_chars": self.max_observation_chars}
        return {key: value for key, value in chosen.items() if value is not None} | {
            "invalid_action_penalty": self.invalid_action_penalty}


class IdeGymTaskData(vf.TaskData):
    """A task's wire data: its IdeGym id (``id``), instruction (``prompt``) and the reply format
    (``system_prompt``); none of its checks."""


class IdeGymTask(vf.Task[IdeGymTaskData]):
    pass


class IdeGymTaskset(vf.Taskset[IdeGymTask, IdeGymTasksetConfig]):
    def __init__(self, config: IdeGymTasksetConfig) -> None:
        super().__init__(config)
        self._tasks: dict[str, Task] | None = None

    def idegym_task(self, task_id: str) -> Task:
        """The IdeGym task of a verifiers task's ``data.id``."""
        tasks = self._resolved()
        if task_id not in tasks:
            raise ToolCallError(f"task {task_id!r} is not in this taskset ({', '.join(tasks)})")
        return tasks[task_id]

    def load(self) -> Iterator[IdeGymTask]:
        system = f"{REPLY_FORMAT}\n\n{tool_guide()}"
        for task in self._resolved().values():
            data = IdeGymTaskData(id=task.id, name=task.title, prompt=task.instruction, system_prompt=system)
            yield IdeGymTask(data, self.config.task)

    def _resolved(self) -> dict[str, Task]:
        if self._tasks is None:
            from ..eval.manifest import resolve_tasks

            self._tasks = {task.id: task for task in resolve_tasks(list(self.config.tasks))}
        return self._tasks


class IdeGymVerifiersEnvConfig(vf.EnvConfig):
    # The model's reply is the action: a plain chat (the null harness), run as a local process.
    player: vf.AgentConfig = vf.AgentConfig(harness=NullHarnessConfig(id="null"), runtime=SubprocessConfig())


class IdeGymVerifiersEnv(vf.Env[IdeGymVerifiersEnvConfig]):
    taskset: IdeGymTaskset

    async def run(self, task: IdeGymTask, agents: vf.Agents) -> None:
        assert task.data.id is not None
        config = self.taskset.config
        episode = ToolCallEpisode(control_plane_url=config.control_plane_url, **config.env_kwargs())
        idegym_task = self.taskset.idegym_task(task.data.id)
        # On a worker thread, and waited for even when the rollout is cancelled: a sandbox it got
        # after the cancellation is handed back below, not left to exit.
        starting = asyncio.ensure_future(asyncio.to_thread(episode.start, idegym_task))
        try:
            async with agents.player.interaction(task) as interaction:
                await asyncio.shield(starting)
                segment = await interaction.turn()
                while not segment.terminated:
                    observation, done = await self.act(episode, segment.last_reply)
                    if done:
                        break
                    segment = await interaction.turn(observation)
                if episode.reward is None and episode.infra_error is None:  # verifiers ended it first
                    await asyncio.to_thread(episode.grade)
                if episode.infra_error is not None:
                    raise InfrastructureError(f"{episode.infra_error}: this episode has no reward")
        finally:
            with contextlib.suppress(BaseException):
                await asyncio.wait([starting])
                starting.exception()  # retrieved: it was raised above, or the rollout failed before
            await asyncio.shield(asyncio.to_thread(episode.end))
        assert episode.reward is not None
        interaction.trace.record_reward("idegym_reward", episode.reward)

    @staticmethod
    async def act(episode: ToolCallEpisode, reply: str) -> tuple[str, bool]:
        """One model reply as one action of ``episode``: the observation for the next user turn,
        and whether the episode ended. All that :meth:`run` does per action (the benchmark times
        it). Raises :class:`InfrastructureError` when the sandbox or the control plane failed."""
        try:
            outcome = await episode.act_async(reply)
        except InfrastructureError:
            raise
        except ToolCallError as exc:  # no valid call: a step all the same, its observation says why
            return str(exc), episode.done
        return outcome.text, outcome.done


__all__ = ["IdeGymTasksetConfig", "IdeGymTaskData", "IdeGymTask", "IdeGymTaskset", "IdeGymVerifiersEnvConfig",
           "IdeGymVerifiersEnv"]
