"""TRL: :class:`IdeGymTRLEnv` for ``GRPOTrainer(environment_factory=...)`` (``pip install 'idegym[trl]'``).

::

    from trl import GRPOConfig, GRPOTrainer
    from idegym_env.integrations.trl import IdeGymTRLEnv, task_dataset

    trainer = GRPOTrainer(
        model="Qwen/Qwen3-0.6B",
        train_dataset=task_dataset(["python-roman-numerals", "python-lru-cache"]),
        environment_factory=IdeGymTRLEnv.factory(max_steps=20),   # or IdeGymTRLEnv (defaults)
        args=GRPOConfig(max_tool_calling_iterations=20),
    )
    trainer.train()

How TRL uses it (``trl/trainer/grpo_trainer.py``, 1.16): it builds one instance per rollout with
the no-argument factory and reuses instances across batches; every public method except
``reset`` and ``get_reward`` is a tool whose JSON schema TRL derives from the signature and the
docstring's ``Args:``; ``reset(**row)`` is called with the dataset row before generation and its
return value is appended to the last user message; after generation ``get_reward()`` is called
once per rollout.

* ``reset`` starts an episode of the row's ``task`` (a bundled task id or a task directory) and
  returns its instruction.
* The tools are every tool of :data:`~idegym_env.tools.TOOLS` but ``submit`` (``get_reward``
  grades): ``bash``, ``read_file``, ``write_file``, ``edit_file``, ``patch_file``, ``list_files``
  and ``run_checks`` (the task's own tests, no grading); each method is made from its tool's
  definition (signature, description, the descriptions of its arguments). A malformed call raises
  ``ValueError`` with our message, which TRL hands to the model as ``{"error": ...}``.
* ``get_reward`` grades the episode (the env's submit) and hands the sandbox back. It returns
  ``None`` when the episode could not be graded (sandbox died, control plane unreachable):
  TRL treats such a rollout as unscorable (advantage 0, out of the group baseline) instead of a
  fake 0. :attr:`IdeGymTRLEnv.infra_error` says why.

Sandboxes come from the control plane at ``control_plane_url`` or the embedded one, one client
per process; an episode's sandbox is handed back when ``get_reward`` ends it, when the next
``reset`` starts another, and at interpreter exit.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..tools import TOOLS, ToolCall
from ..tools.schemas import arguments_schema
from ._episode import InfrastructureError, ToolCallEpisode, ToolCallError

DEFAULT_PROMPT = ("You are working in a sandbox on a coding task, described below. Use the tools to inspect and "
                  "change the project; run_checks runs its tests. Stop calling tools when you are done.")


class IdeGymTRLEnv:
    """One rollout's IdeGym episode for TRL; see the module docstring. Construct with no arguments
    (defaults: embedded control plane) or through :meth:`factory`."""

    def __init__(self, *, control_plane_url: str | None = None, default_task: str | None = None,
                 **env_kwargs: Any) -> None:
        self._episode = ToolCallEpisode(control_plane_url=control_plane_url, **env_kwargs)
        self._default_task = default_task

    @classmethod
    def factory(cls, *, control_plane_url: str | None = None, default_task: str | None = None,
                **env_kwargs: Any) -> Callable[[], IdeGymTRLEnv]:
        """A no-argument factory for ``environment_factory`` with these settings (``env_kwargs`` go
        to ``IdeGymEnv``: ``max_steps``, ``bash_timeout``, ``reward_fn``...)."""
        return functools.partial(cls, control_plane_url=control_plane_url, default_task=default_task, **env_kwargs)

    # -- TRL's protocol ------------------------------------------------------------------------------

    def reset(self, **row: Any) -> str:
        """Start an episode of the row's ``task`` and return its instruction (TRL appends it to the prompt)."""
        task = row.get("task", self._default_task)
        if task is None:
            raise ValueError("the dataset row names no task: add a 'task' column (a bundled task id or a task "
                             f"directory), or give default_task to the factory; the row has {sorted(row)}")
        try:
            return self._episode.start(task)
        except ToolCallError as exc:
            raise ValueError(str(exc)) from None

    def get_reward(self) -> float | None:
        """The episode's reward (graded now if it was not), or ``None`` if it could not be graded."""
        try:
            return self._episode.grade()
        finally:
            self._episode.end()

    @property
    def infra_error(self) -> str | None:
        """Why the last episode could not be graded, if it could not."""
        return self._episode.infra_error

    @property
    def episode(self) -> ToolCallEpisode:
        return self._episode

    # -- tools: every other public method, made from the registry below the class ---------------------

    # -- helpers --------------------------------------------------------------------------------------

    def _call(self, tool: str, **arguments: Any) -> str:
        try:
            outcome = self._episode.call(tool, {k: v for k, v in arguments.items() if v is not None} or None)
        except ToolCallError as exc:
            raise ValueError(str(exc)) from None  # TRL: {"error": message} for the model
        except InfrastructureError as exc:
            raise RuntimeError(f"infrastructure failure (not scored): {exc}") from None
        if outcome.error is not None:
            raise ValueError(outcome.text)  # the tool failed (a missing file...): TRL counts a failure
        return outcome.text


_PYTHON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool}


def _tool_method(tool: type[ToolCall]) -> Callable[..., str]:
    """``tool`` as a method TRL reads: its arguments as parameters (optional ones default to None,
    which leaves them to the tool), its description and its arguments' in the docstring."""
    schema = arguments_schema(tool.name)
    required = set(schema.get("required", []))
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for name, prop in schema["properties"].items():
        kind = _PYTHON_TYPES[prop["type"]]
        parameters.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            annotation=kind if name in required else kind | None,
                                            default=inspect.Parameter.empty if name in required else None))
    signature = inspect.Signature(parameters, return_annotation=str)

    def method(self: IdeGymTRLEnv, *args: Any, **kwargs: Any) -> str:
        bound = signature.bind(self, *args, **kwargs)
        return self._call(tool.name, **{k: v for k, v in bound.arguments.items() if k != "self"})

    method.__name__ = tool.name
    method.__qualname__ = f"{IdeGymTRLEnv.__name__}.{tool.name}"
    method.__signature__ = signature  # type: ignore[attr-defined]
    method.__annotations__ = {p.name: p.annotation for p in parameters[1:]} | {"return": str}
    args = [f"    {name}: {' '.join(prop.get('description', name).split())}"
            for name, prop in schema["properties"].items()]
    method.__doc__ = tool.description + ("\n\nArgs:\n" + "\n".join(args) if args else "")
    return method


def _add_tools(cls: type[IdeGymTRLEnv]) -> None:
    for tool in TOOLS.values():
        if not tool.ends_episode:  # get_reward grades
            setattr(cls, tool.name, _tool_method(tool))


_add_tools(IdeGymTRLEnv)


def task_dataset(tasks: Iterable[str], *, repeat: int = 1, prompt: str = DEFAULT_PROMPT) -> Any:
    """A ``datasets.Dataset`` with one row per task (``repeat`` times): a conversational ``prompt``
    and the ``task`` that ``reset`` starts. The instruction itself comes from ``reset``."""
    from datasets import Dataset

    ids: Sequence[str] = [str(t) for t in tasks for _ in range(repeat)]
    if not ids:
        raise ValueError("task_dataset needs at least one task")
    content = f"{prompt}\n\n"
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": content}] for _ in ids], "task": list(ids)})


__all__ = ["IdeGymTRLEnv", "task_dataset", "DEFAULT_PROMPT"]
