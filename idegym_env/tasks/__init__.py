"""Tasks as data: a project, an instruction for the agent, setup/compile/test checks, a reward
and a known solution. See ``README.md`` in this directory for the on-disk layout."""

from .loader import BUNDLED_DIR, TaskSet, bundled_tasks, load_task
from .task import CheckScript, Task, TaskError, TestScript

__all__ = [
    "Task",
    "TaskError",
    "TaskSet",
    "CheckScript",
    "TestScript",
    "load_task",
    "bundled_tasks",
    "BUNDLED_DIR",
]
