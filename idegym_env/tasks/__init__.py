"""Tasks as data: a project, an instruction for the agent, setup/compile/test checks, a reward
and a known solution. See ``README.md`` in this directory for the on-disk layout."""

from .loader import BUNDLED_DIR, TaskSet, bundled_tasks, load_task
from .task import CheckScript, GradingFiles, Task, TaskEnvironment, TaskError, TaskResources, TestScript

__all__ = [
    "Task",
    "TaskError",
    "TaskSet",
    "CheckScript",
    "TestScript",
    "GradingFiles",
    "TaskEnvironment",
    "TaskResources",
    "load_task",
    "bundled_tasks",
    "BUNDLED_DIR",
]
