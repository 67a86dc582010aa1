"""``run_checks``: the task's own tests, without grading (the episode goes on).

For the trainers' adapters (MCP, TRL, SkyRL, verl), whose agents are graded only at the end and
are not told the test command; the Gymnasium action space leaves it out (its agents run the tests
with ``bash``). It is a ``bash`` call of the task's test stage, held to the env's limits like any
other; a task whose tests exist only at grading (HumanEval, SWE, Harbor) gets an answer saying
so, without a step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from .base import NoArguments, ToolCall
from .bash import MAX_TIMEOUT, BashCall

if TYPE_CHECKING:
    from ..tasks import Task

HIDDEN_TESTS = ("This task's tests are hidden: they are installed only when you submit, so run_checks cannot run "
                "them. Try your code yourself with bash; submit() grades it.")


class RunChecksCall(ToolCall):
    tool: Literal["run_checks"] = "run_checks"
    arguments: NoArguments = NoArguments()
    description: ClassVar[str] = "Run the task's tests and return their output (this does not end the episode)."
    example: ClassVar[dict[str, Any]] = {}
    in_space: ClassVar[bool] = False

    def in_task(self, task: Task) -> ToolCall | str:
        if task.grading:  # the tests exist only at grading
            return HIDDEN_TESTS
        stage = task.test or task.compilation or task.setup
        assert stage is not None  # a task has at least one check
        return BashCall.model_validate({"tool": "bash", "arguments": {
            "command": stage.script, "timeout": min(stage.timeout, MAX_TIMEOUT)}})
