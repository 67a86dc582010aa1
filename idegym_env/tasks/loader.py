"""Finding tasks: ``load_task``, the bundled tasks and ``TaskSet`` (a directory of tasks)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .task import TASK_FILE, Task, TaskError, hash_files

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"


class TaskSet:
    """The tasks in the immediate subdirectories of ``root`` that hold a ``task.yaml``.

    Tasks are ordered by id; ``content_hash`` is a sha256 over every file of every task (path,
    kind, bytes), so two evaluations with the same hash ran on the same tasks.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise TaskError(f"{self.root}: not a directory of tasks")
        tasks = [Task.from_dir(d) for d in sorted(self.root.iterdir()) if (d / TASK_FILE).is_file()]
        self._tasks: dict[str, Task] = {}
        for task in sorted(tasks, key=lambda t: t.id):
            if task.id in self._tasks:
                raise TaskError(f"{self.root}: two tasks have the id {task.id!r}")
            self._tasks[task.id] = task
        self._hash: str | None = None

    @classmethod
    def bundled(cls) -> TaskSet:
        """The tasks shipped inside the package."""
        return cls(BUNDLED_DIR)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._tasks)

    @property
    def tasks(self) -> tuple[Task, ...]:
        return tuple(self._tasks.values())

    @property
    def content_hash(self) -> str:
        """sha256 (hex) over the files of all tasks in the set, computed once."""
        if self._hash is None:
            digest = hashlib.sha256()
            for task in self._tasks.values():
                assert task.root is not None
                hash_files(task.root, f"{task.id}/", digest)
            self._hash = digest.hexdigest()
        return self._hash

    def sample(self, rng: np.random.Generator) -> Task:
        """A task drawn uniformly with ``rng`` (e.g. an env's ``np_random``), so a seed fixes the draw."""
        if not self._tasks:
            raise TaskError(f"{self.root}: the task set is empty")
        return self.tasks[int(rng.integers(len(self._tasks)))]

    def __getitem__(self, task_id: str) -> Task:
        try:
            return self._tasks[task_id]
        except KeyError:
            raise KeyError(f"no task {task_id!r} in {self.root}; tasks: {', '.join(self._tasks)}") from None

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._tasks

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)

    def __repr__(self) -> str:
        return f"TaskSet({str(self.root)!r}, {len(self)} tasks)"


def bundled_tasks() -> list[Task]:
    """The tasks shipped inside the package, ordered by id."""
    return list(TaskSet.bundled())


def load_task(path_or_name: Path | str) -> Task:
    """A task from a task directory, its ``task.yaml``, the id of a bundled task, or a task of a
    source (``humaneval/HumanEval/0``, ``swe/<instance_id>``, ``harbor:<dir>#<task>``; see
    :mod:`idegym_env.tasks.sources`).

    A path that exists wins over a bundled id of the same spelling. Raises :class:`TaskError`
    when neither matches, listing the bundled ids.
    """
    path = Path(path_or_name)
    if path.exists():
        return Task.from_dir(path.parent if path.is_file() else path)
    name = str(path_or_name)
    if (BUNDLED_DIR / name / TASK_FILE).is_file() and "/" not in name:
        return Task.from_dir(BUNDLED_DIR / name)
    from .sources import is_source_spec, load_source_task

    if is_source_spec(name):  # humaneval/HumanEval/0, swe/<instance>, harbor:<dir>#<task>
        return load_source_task(name)
    ids = sorted(f.parent.name for f in BUNDLED_DIR.glob(f"*/{TASK_FILE}"))
    raise TaskError(f"no task directory at {str(path_or_name)!r} and no bundled task of that name; "
                    f"bundled tasks: {', '.join(ids) or 'none'}")


__all__ = ["TaskSet", "bundled_tasks", "load_task", "BUNDLED_DIR"]
