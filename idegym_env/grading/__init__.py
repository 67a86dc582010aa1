"""Grading: one path for every task source, on a tree the agent cannot have prepared.

``grade(sandbox, task, fresh=...)`` — what ``IdeGymEnv`` runs at ``submit`` or truncation:

1. every process the agent started ends (``terminate_processes``);
2. only the task's **editable** files are exported from the agent's sandbox (regular files;
   symlinks, FIFOs, harness configuration such as ``conftest.py`` or ``sitecustomize.py`` are not);
3. ``fresh()`` makes the sandbox new: a RESTART through the control plane (nothing of the agent
   is left: no process, no file in its home, ``/tmp`` or ``/usr/local``) — or, for a sandbox
   connected directly, a project reset;
4. one ``POST /api/grade`` writes the task's starting files (``Task.files``: part of the pristine
   project, from the task) and the editable files over the pristine project, installs the
   task's grading-only files, and runs the stages (see ``sandbox_server/grading/grade.py``).

Harbor tasks (``grade_in_place``) skip 2–3: their verifier judges the container as the agent left it.
An infrastructure failure (sandbox lost, control plane gone) is reported as such in
``CheckResults.infrastructure_error`` — never as a wrong answer.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandbox_server import routes
from sandbox_server.grading.models import ExportedFile, ExportRequest, ExportResponse, GradeRequest, GradeStage

from ..client import Sandbox, ServiceError
from ..rewards import CheckResults
from ..tasks import Task, TestScript

PAYLOAD_TOO_LARGE = 413


@dataclass
class Graded:
    """What grading found: the sandbox's answers per stage and the errors, typed (``results``: for
    the reward and for ``info``), and the editable entries left out of grading."""

    results: CheckResults
    skipped: list[str] = field(default_factory=list)  # editable entries not graded, and why


def _entries(files: dict[str, bytes]) -> list[ExportedFile]:
    return [ExportedFile(path=rel, content_base64=base64.b64encode(data).decode("ascii"))
            for rel, data in sorted(files.items())]


def grade_request(task: Task, exported: ExportResponse | None) -> GradeRequest:
    """The ``/api/grade`` call for ``task``: the task's starting files (``Task.files``, from the
    task, not from the agent's sandbox), the agent's exported files over them, then the task's
    grading files. Graded in place (``exported`` None), the starting files are the agent's already."""
    by_path: dict[str, ExportedFile] = {}
    if exported is not None:
        deleted = set(exported.deleted)
        by_path.update((f.path, f) for f in _entries({rel: text.encode() for rel, text in task.files.items()
                                                      if rel not in deleted}))
        by_path.update((f.path, f) for f in exported.files)
    by_path.update((f.path, f) for f in _entries(task.grading.project))
    files = [by_path[rel] for rel in sorted(by_path)]
    stages = []
    for name, script in task.stages():
        extra: dict[str, Any] = {}
        if isinstance(script, TestScript):  # the tests stage
            extra = {"report_glob": script.report_glob if script.harness == "in-process" else None,
                     "expected": list(script.expected) if script.expected is not None else None,
                     "reward_file": script.reward_file}
        stages.append(GradeStage(name=name, script=script.script, timeout=script.timeout, user=script.user,
                                 env=dict(script.env), keep_processes=script.keep_processes, **extra))
    return GradeRequest(files=files, delete=list(exported.deleted) if exported is not None else [],
                        hidden=_entries(task.grading.hidden), stages=stages)


def grade(sandbox: Sandbox, task: Task, *, fresh: Callable[[], Any], steps: int = 0,
          submitted: bool = False) -> Graded:
    """Grade the episode that ran in ``sandbox`` (see the module docstring)."""
    stage = "ending the agent's processes"
    exported: ExportResponse | None = None
    try:
        sandbox.terminate_processes()
        if not task.grade_in_place:
            stage = "exporting the editable files"
            exported = sandbox.call(routes.EXPORT_FILES, ExportRequest(
                editable=list(task.editable) if task.editable else None, protected=list(task.protected_paths),
                starting=sorted(task.files)))
            stage = "making the sandbox fresh for grading"
            fresh()
        stage = "running the checks"
        answer = sandbox.call(routes.GRADE, grade_request(task, exported))
    except ServiceError as exc:
        message = getattr(exc, "message", str(exc))
        if getattr(exc, "status", None) == PAYLOAD_TOO_LARGE:  # the agent flooded its tree: a failure
            errors = [f"not graded: {message}"]
            return Graded(task.check_results({}, steps=steps, submitted=submitted, errors=errors))
        problem = f"grading failed while {stage}: {message}"
        return Graded(task.check_results({}, steps=steps, submitted=submitted, errors=[problem],
                                         infrastructure_error=problem))
    results = task.check_results({"setup": answer.setup, "compilation": answer.compilation, "tests": answer.tests},
                                 steps=steps, submitted=submitted, errors=list(answer.errors))
    skipped = [f"{s.path}: {s.reason}" for s in exported.skipped] if exported is not None else []
    return Graded(results, skipped)


__all__ = ["grade", "grade_request", "Graded"]
