"""``submit``: the task is done. The env grades the episode (the task's checks) and ends it."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from .base import NoArguments, ToolCall


class SubmitCall(ToolCall):
    tool: Literal["submit"] = "submit"
    arguments: NoArguments = NoArguments()
    description: ClassVar[str] = (
        "Declare the task done: the task's checks run and the episode ends with the reward.")
    example: ClassVar[dict[str, Any]] = {}
    ends_episode: ClassVar[bool] = True

    def label(self) -> str:
        return "submit"
