"""Run a SWE-style instance's tests on this machine, without a sandbox: the proof in a plain
virtual environment that an instance is what it claims (gold patch → every listed test passes;
untouched → every FAIL_TO_PASS test fails), and the engine of ``data/swe/author.py``.

The tests run as the grader would run them — the exported ``base_commit`` tree, the test files of
the grading (``test_patch`` applied), the instance's test command — with ``python3`` on ``PATH``
being the given interpreter (a venv with pytest), in the pinned check environment.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox_server.junit import canonical_test_id  # the grader's spelling of a test id

from .repos import apply_patch

if TYPE_CHECKING:
    from ..task import Task

PINNED_ENV = {"PYTHONSAFEPATH": "1", "PYTHONHASHSEED": "0", "TZ": "UTC", "LANG": "C.UTF-8",
              "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"}
def read_junit(path: Path) -> dict[str, str]:
    """``{canonical id: passed|failed|error|skipped}`` of a JUnit report (a test seen twice keeps
    its worst outcome)."""
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    out: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        classname, name = case.get("classname") or "", case.get("name") or ""
        ident = canonical_test_id(f"{classname}.{name}" if classname else name)
        if case.find("error") is not None:
            outcome = "error"
        elif case.find("failure") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        if rank[outcome] >= rank.get(out.get(ident, "passed"), 0):
            out[ident] = outcome
    return out


def run_tests(project: Path, script: str, *, python: str, env: Mapping[str, str] | None = None,
              timeout: float = 900) -> tuple[dict[str, str], str]:
    """Run a test stage ``script`` in ``project`` with ``python`` as ``python3``; the report's
    outcomes by canonical id and the output's tail."""
    with tempfile.TemporaryDirectory(prefix="swe-run-") as tmp:
        bindir = Path(tmp) / "bin"
        bindir.mkdir()
        wrapper = bindir / "python3"  # a script, not a symlink: a venv's python finds its venv by its path
        wrapper.write_text(f'#!/bin/sh\nexec "{python}" "$@"\n')
        wrapper.chmod(0o755)
        report_dir = Path(tmp) / "report"
        report_dir.mkdir()
        home = Path(tmp) / "home"
        home.mkdir()
        run_env = {"PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "TMPDIR": tmp,
                   "IDEGYM_REPORT_DIR": str(report_dir), **PINNED_ENV, **(env or {})}
        proc = subprocess.run(["bash", "-c", script], cwd=project, env=run_env, capture_output=True, text=True,
                              timeout=timeout)
        output = (proc.stdout + proc.stderr)[-3000:]
        outcomes: dict[str, str] = {}
        for report in sorted(report_dir.glob("*.xml")):
            outcomes.update(read_junit(report))
        return outcomes, output


def prove(project: Path, grading_files: Mapping[str, bytes], script: str, expected_f2p: list[str],
          expected_p2p: list[str], *, python: str, env: Mapping[str, str] | None = None,
          patch: str | None = None) -> dict[str, str]:
    """Outcomes of the listed tests on a copy of ``project`` with the grading files written over
    it (and ``patch`` applied first when given); a listed test not in the report is ``missing``."""
    with tempfile.TemporaryDirectory(prefix="swe-prove-") as tmp:
        work = Path(tmp) / "tree"
        shutil.copytree(project, work, symlinks=True)
        if patch:
            apply_patch(work, patch)
        for rel, data in grading_files.items():
            target = work / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        outcomes, _ = run_tests(work, script, python=python, env=env)
    return {t: outcomes.get(canonical_test_id(t), "missing") for t in expected_f2p + expected_p2p}


def venv_python() -> str | None:
    """An interpreter with pytest for local proofs: ``$IDEGYM_SWE_PYTHON`` or this one."""
    import sys

    from ...settings import ClientSettings

    candidate = ClientSettings.from_env().swe_python or sys.executable
    return candidate if shutil.which(candidate) or Path(candidate).exists() else None




def run_task_locally(task: Task, *, oracle: bool, python: str | None = None) -> tuple[float, dict[str, str]]:
    """A SWE task's reward on this machine (1.0 iff every listed test passes) and the listed
    tests' outcomes, after its oracle (the gold patch's ``git apply``) or untouched."""
    assert task.project is not None and task.test is not None
    python = python or venv_python()
    if python is None:
        raise RuntimeError("no interpreter with pytest for a local run (set IDEGYM_SWE_PYTHON)")
    with tempfile.TemporaryDirectory(prefix="swe-task-") as tmp:
        work = Path(tmp) / "tree"
        shutil.copytree(task.project, work, symlinks=True)
        if oracle:
            for call in task.solution:
                proc = subprocess.run(["bash", "-c", call.arguments.command], cwd=work,  # type: ignore[attr-defined]
                                      capture_output=True, text=True, timeout=300)
                if proc.returncode != 0:
                    raise RuntimeError(f"the oracle failed: {proc.stderr[-1000:]}")
        for rel, data in task.grading.project.items():
            target = work / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        outcomes, _ = run_tests(work, task.test.script, python=python, env=task.test.env)
    listed = {t: outcomes.get(canonical_test_id(t), "missing") for t in task.test.expected or ()}
    return (1.0 if listed and all(o == "passed" for o in listed.values()) else 0.0), listed


__all__ = ["canonical_test_id", "read_junit", "run_tests", "prove", "run_task_locally", "venv_python", "PINNED_ENV"]
