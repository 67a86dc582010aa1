"""What no sandbox may hold: distinctive lines of every shipped task's answers.

The answers of a task are its solution (the oracle's tool calls: a bundled task's fix, a
HumanEval canonical solution, a SWE gold patch, a Harbor ``solution/``) and its hidden grading
files (HumanEval's test, a SWE test patch's test files, Harbor's ``tests/``). A needle is one of
their lines, normalized as the scanner reads lines (``answer_scan.line``), long enough to be
distinctive, without a backslash (so that it reads the same JSON-escaped), and found in nothing
a sandbox shows by design: what any task shows the agent (its instruction, starting files,
project, image context), our own code (public; the templates of generated tests are there), the
standard library of the server's interpreter and the built-in image's own layers (in every
sandbox of it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain
from pathlib import Path

from idegym_env.tasks import Task, TaskSet
from idegym_env.tasks.sources import load_source_tasks
from tests.answer_scan import line

MIN_LENGTH = 40


def shipped_tasks() -> list[Task]:
    """Every task shipped with the package: bundled, HumanEval's 164, the SWE set, the Harbor set."""
    return [*TaskSet.bundled(), *load_source_tasks("humaneval"), *load_source_tasks("swe"),
            *load_source_tasks("harbor")]


def _lines(text: str) -> Iterator[str]:
    for raw in text.splitlines():
        yield line(raw.encode(errors="replace")).decode(errors="replace")


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _tree(path: Path | None, pattern: str = "*") -> Iterator[bytes]:
    if path is not None and path.is_dir():
        for file in sorted(path.rglob(pattern)):
            if file.is_file() and not file.is_symlink():
                yield file.read_bytes()


def answers(task: Task) -> Iterator[str]:
    for call in task.solution:
        yield from _strings(call.model_dump(mode="json")["arguments"])
    for files in (task.grading.project, task.grading.hidden):
        for content in files.values():
            yield content.decode(errors="replace")


def shown(task: Task) -> Iterator[bytes]:
    yield task.instruction.encode()
    yield from (text.encode() for text in task.files.values())
    yield from _tree(task.project)
    environment = getattr(task, "environment", None)
    if environment is not None:
        yield (environment.dockerfile or "").encode()
        yield from _tree(environment.context)


def our_code() -> Iterator[bytes]:
    """Our packages' modules: public, and the templates of generated hidden files (a HumanEval
    test's harness, the SWE unittest runner) are there."""
    import control_plane
    import idegym_env
    import sandbox_server

    for package in (idegym_env, control_plane, sandbox_server):
        for file in sorted(Path(package.__file__).parent.rglob("*.py")):
            yield file.read_bytes()


def in_every_sandbox() -> Iterator[bytes]:
    """The server interpreter's standard library and the built-in image's own layers."""
    import sysconfig

    from control_plane.backends.local.builtin_image import builtin_cache_dir, source_key

    yield from _tree(Path(sysconfig.get_paths()["stdlib"]), "*.py")
    yield from _tree(builtin_cache_dir() / source_key() / "image" / "layers")


def needles(tasks: Iterable[Task]) -> set[str]:
    tasks = list(tasks)
    wanted = {n.encode(): n for task in tasks for text in answers(task) for n in _lines(text)
              if len(n) >= MIN_LENGTH and "\\" not in n}
    # What a sandbox shows is ~200 MB (the standard library, the built-in image): its lines are
    # split and normalized as the scanner reads them, in C, and only struck off the answers' lines
    # (a set of every visible line took ~10 s a run, twice a suite).
    left = set(wanted)
    for text in chain(our_code(), in_every_sandbox(), *(shown(task) for task in tasks)):
        left.difference_update(map(line, text.split(b"\n")))
    return {wanted[n] for n in left}
