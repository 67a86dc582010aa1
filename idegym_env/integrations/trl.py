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
* The tools are ``bash``, ``read_file``, ``write_file``, ``edit_file``, ``patch_file`` and
  ``run_checks`` (the task's own tests, no grading). A malformed call raises ``ValueError`` with
  our message, which TRL hands to the model as ``{"error": ...}``.
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
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ._episode import Episode, InfrastructureError, ToolCallError

DEFAULT_PROMPT = ("You are working in a sandbox on a coding task, described below. Use the tools to inspect and "
                  "change the project; run_checks runs its tests. Stop calling tools when you are done.")


class IdeGymTRLEnv:
    """One rollout's IdeGym episode for TRL; see the module docstring. Construct with no arguments
    (defaults: embedded control plane) or through :meth:`factory`."""

    def __init__(self, *, control_plane_url: str | None = None, default_task: str | None = None,
                 **env_kwargs: Any) -> None:
        self._episode = Episode(control_plane_url=control_plane_url, **env_kwargs)
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
    def episode(self) -> Episode:
        return self._episode

    # -- tools (every public method below is a tool for TRL) ---------------------------------------

    def bash(self, command: str, timeout: float | None = None) -> str:
        """Run a bash script in the project directory and return its output and exit code.

        Args:
            command: The bash script to run, e.g. `ls` or `python3 -m pytest -q`.
            timeout: Seconds before the command is killed (default: the environment's limit).
        """
        return self._call("bash", command=command, timeout=timeout)

    def read_file(self, path: str, offset: int | None = None, length: int | None = None) -> str:
        """Read a text file of the project.

        Args:
            path: The file's path, relative to the project directory.
            offset: Byte offset to start reading at (default 0).
            length: Maximum number of bytes to read (default: the environment's limit).
        """
        return self._call("read_file", path=path, offset=offset, length=length)

    def write_file(self, path: str, content: str) -> str:
        """Create a file, or overwrite it, with the given content; missing directories are created.

        Args:
            path: The file's path, relative to the project directory.
            content: The complete new content of the file.
        """
        return self._call("write_file", path=path, content=content)

    def edit_file(self, path: str, start_line: int, end_line: int, new_content: str) -> str:
        """Replace lines start_line..end_line (inclusive, counting from 1) of a file with new text.

        Args:
            path: The file's path, relative to the project directory.
            start_line: First line to replace, counting from 1.
            end_line: Last line to replace; start_line - 1 inserts before start_line without replacing.
            new_content: The text that replaces the lines; empty deletes them.
        """
        return self._call("edit_file", path=path, start_line=start_line, end_line=end_line, new_content=new_content)

    def patch_file(self, path: str, patch: str) -> str:
        """Apply a diff-match-patch patch (the text of patch_toText) to a file; fails if a hunk does not apply.

        Args:
            path: The file's path, relative to the project directory.
            patch: The patch text: hunks like '@@ -12,7 +12,7 @@' with lines starting ' ', '-' or '+'.
        """
        return self._call("patch_file", path=path, patch=patch)

    def run_checks(self) -> str:
        """Run the task's tests and return their output (this does not end the episode)."""
        return self._call("run_checks")

    # -- helpers --------------------------------------------------------------------------------------

    def _call(self, tool: str, **arguments: Any) -> str:
        try:
            outcome = self._episode.call(tool, {k: v for k, v in arguments.items() if v is not None} or None)
        except ToolCallError as exc:
            raise ValueError(str(exc)) from None  # TRL: {"error": message} for the model
        except InfrastructureError as exc:
            raise RuntimeError(f"infrastructure failure (not scored): {exc}") from None
        if outcome.error is not None and tool != "bash":
            raise ValueError(outcome.text)
        return outcome.text


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
