"""``POST /api/grade``: install the graded tree, run the check stages, read their results.

Called on a fresh sandbox of the task's image (``idegym_env.grading``), so no process and no
file of the agent is there but the editable files it sends. Per stage:

* every tool of the stage starts in fresh child cgroups of the tools' (``Supervisor.stage``), and
  every process the stage leaves (``setsid`` daemons included: the server is the sandbox's
  subreaper) is ended before the next stage starts and before any report is read: its
  descendants get SIGTERM and the stage's grace, then its groups are frozen, killed and removed
  (a setup or compile stage with ``keep_processes`` leaves its services to the next stages: they
  end before the tests' report is read);
* the environment is pinned (``judge.subject_process.PINNED_ENV``), ``HOME`` and ``TMPDIR`` are fresh,
  and every Python the stage starts imports the standard library and the image's packages from
  where they are installed, never from the project (``python_env.py``);
* reports are read from ``$IDEGYM_REPORT_DIR``, a directory made for the stage — only root can
  write it when the stage runs as root (the judge tier, whose code under test runs as the tool
  user), — without following symlinks; a reward file's directory is emptied before the stage;
* test ids are compared with ``expected``: a missing test counts as failed, an unknown one makes
  the grade an error, no test at all is ``no_tests``, never a pass.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..judge.subject_process import PINNED_ENV
from ..junit import canonical_test_id, find_reports, fresh_reports, parse_cases
from ..models import CheckResult, Status, TestScores
from ..process import ProcessResult
from ..users import UserSpec
from .models import ExportedFile, GradedTests, GradeRequest, GradeResponse, GradeStage, TestCase
from .python_env import guarded

if TYPE_CHECKING:
    from ..app import SandboxState

MAX_REWARD_FILE = 1 << 20
STAGE_OUTPUT = 1 << 20


def _failure_output(result: ProcessResult, what: str, timeout: float) -> str:
    text = f"stdout:\n{result.stdout.text(True)}\n\nstderr:\n{result.stderr.text(True)}"
    if result.timed_out:
        return f"{what} timed out after {timeout:g} seconds (processes killed).\n{text}"
    return text


def _private_dir(prefix: str, owner: UserSpec | None, mode: int) -> str:
    path = tempfile.mkdtemp(prefix=prefix)
    os.chmod(path, mode)
    if owner is not None and os.geteuid() == 0:
        os.chown(path, owner.uid, owner.gid)
    return path


def _write_hidden(directory: str, files: list[ExportedFile]) -> None:
    for entry in files:
        target = os.path.join(directory, entry.path)
        os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o700 if entry.executable else 0o600)
        try:
            os.write(fd, base64.b64decode(entry.content_base64, validate=True))
        finally:
            os.close(fd)


def _fresh_reward_dir(reward_file: str, owner: UserSpec) -> None:
    """The reward file's directory, emptied and owned by the stage's user; no symlink on its way
    (an agent grading in place may have planted one, or the reward itself)."""
    directory = Path(reward_file).parent
    built = Path("/")
    for part in directory.parts[1:]:
        built = built / part
        if built.is_symlink() or (built.exists() and not built.is_dir()):
            built.unlink()
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, mode=0o755)
    if os.geteuid() == 0:
        os.chown(directory, owner.uid, owner.gid)


def _read_reward(reward_file: str) -> tuple[float | None, str]:
    """(reward, problem): reward.txt holds a number; reward.json an object with ``reward``. When
    the file named is missing, its sibling of the other kind is read (Harbor writes either)."""
    if not os.path.lexists(reward_file):
        stem, ext = os.path.splitext(reward_file)
        sibling = stem + {".txt": ".json", ".json": ".txt"}.get(ext, ext)
        if os.path.lexists(sibling):
            reward_file = sibling
    try:
        fd = os.open(reward_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return None, f"the verifier wrote no reward file {reward_file} ({exc.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_REWARD_FILE:
            return None, f"{reward_file} is not a regular file of at most {MAX_REWARD_FILE} bytes"
        text = os.read(fd, MAX_REWARD_FILE).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)
    try:
        if reward_file.endswith(".json"):
            doc = json.loads(text)
            value = float(doc["reward"] if isinstance(doc, dict) else doc)
        else:
            value = float(text)
    except (ValueError, KeyError, TypeError):
        return None, f"{reward_file} does not hold a reward (a number, or JSON with 'reward'): {text[:200]!r}"
    if not math.isfinite(value):
        return None, f"{reward_file} holds {value}, not a finite number"
    return value, ""


class Grading:
    """One ``POST /api/grade``: its directories live as long as the call."""

    def __init__(self, state: SandboxState, req: GradeRequest) -> None:
        self.state = state
        self.req = req
        self.root_user = UserSpec.lookup("0") if os.geteuid() == 0 else state.user
        self.dirs: list[str] = []
        self.hidden: str | None = None
        self.response = GradeResponse()

    def _dir(self, prefix: str, owner: UserSpec | None, mode: int) -> str:
        path = _private_dir(prefix, owner, mode)
        self.dirs.append(path)
        return path

    async def run(self) -> GradeResponse:
        state, loop = self.state, asyncio.get_running_loop()
        try:
            self.response.killed_processes += await state.supervisor.kill_descendants(2.0)
            await loop.run_in_executor(None, self._install)
            for stage in self.req.stages:
                ok = await self._stage(stage)
                if not ok and stage.name != "tests":
                    break  # the pipeline: a failed setup or compilation fails what follows
        finally:
            self.response.killed_processes += await state.supervisor.kill_descendants(2.0)
            for path in self.dirs:
                await loop.run_in_executor(None, shutil.rmtree, path, True)
        return self.response

    def _install(self) -> None:
        files = self.state.files
        for rel in self.req.delete:
            path = files.resolve(rel, "delete")
            with files.as_user():
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif os.path.lexists(path):
                    path.unlink()
        for entry in self.req.files:
            files.upload(entry.path, entry.content_base64, 0, True)
            if entry.executable:
                with files.as_user():
                    path = files.resolve(entry.path)
                    path.chmod(path.stat().st_mode | 0o111)
        if self.req.hidden:
            self.hidden = self._dir("idegym-hidden-", None, 0o700)
            _write_hidden(self.hidden, self.req.hidden)

    def _stage_group(self, stage: GradeStage) -> contextlib.AbstractAsyncContextManager[None]:
        """The stage's own cgroups (emptied at its end, whatever left the server's process tree);
        without delegated tool cgroups (no root, no cgroup v1) only the descendant kill remains.
        A stage that keeps its processes (a service for the next stages) runs in the tools' groups."""
        supervisor = self.state.supervisor
        if supervisor.tool_cgroups is None or stage.keep_processes:
            return contextlib.nullcontext()
        return supervisor.stage(stage.name)

    def _stage_env(self, stage: GradeStage, user: UserSpec, home: str, report_dir: str) -> dict[str, str]:
        env = dict(self.state.base_env)
        env.update({k: v for k, v in PINNED_ENV.items() if k != "PATH"})
        env.update(HOME=home, TMPDIR=home, USER=user.name, LOGNAME=user.name, IDEGYM_REPORT_DIR=report_dir)
        if self.hidden is not None:
            env["IDEGYM_HIDDEN"] = self.hidden
        if user.uid == 0 and self.state.user.uid != 0:
            env["IDEGYM_SUBJECT_USER"] = str(self.state.user.uid)  # the judge runs the code under test so
        env.update(stage.env)
        project = self.state.project
        return guarded(env, self.state.config.project, project.pristine if project is not None else None)

    async def _stage(self, stage: GradeStage) -> bool:
        state, loop = self.state, asyncio.get_running_loop()
        user = self.root_user if stage.user == "root" else state.user
        home = self._dir("idegym-check-", user, 0o700)
        if user.uid == 0:
            report_dir = self._dir("idegym-report-", None, 0o700)
        else:  # an in-process harness writes its own report: the tool user must reach it
            report_dir = os.path.join(self._dir("idegym-report-", None, 0o711), "r")
            os.mkdir(report_dir, 0o700)
            if os.geteuid() == 0:
                os.chown(report_dir, user.uid, user.gid)
        if stage.reward_file:
            await loop.run_in_executor(None, _fresh_reward_dir, stage.reward_file, user)
        before = {}
        if stage.report_glob:
            before = await loop.run_in_executor(None, find_reports, state.config.project, stage.report_glob)
        result: ProcessResult | None = None
        try:
            async with self._stage_group(stage):
                result = await state.supervisor.run(
                    [state.bash, "-c", stage.script], cwd=str(state.config.project),
                    env=self._stage_env(stage, user, home, report_dir), user=user,
                    timeout=min(stage.timeout, state.config.max_timeout), grace=stage.graceful_termination_timeout,
                    max_output=STAGE_OUTPUT, via_spawner=False)
                # Nothing of the stage may run on while its results are read, or into the next stage
                # (but what a stage keeps on purpose): its descendants get SIGTERM and the grace, then
                # the stage's groups are emptied.
                if not stage.keep_processes:
                    self.response.killed_processes += await state.supervisor.kill_descendants(
                        stage.graceful_termination_timeout)
        except RuntimeError as exc:
            if result is None:
                raise
            self.response.errors.append(str(exc))  # a process of the stage survived its group's emptying
        ok = result.exit_code == 0 and not result.timed_out
        if stage.name != "tests":
            check = CheckResult(status=Status.SUCCESS if ok else Status.FAILURE,
                                output="" if ok else _failure_output(result, f"{stage.name} check", stage.timeout),
                                exit_code=result.exit_code, timed_out=result.timed_out)
            setattr(self.response, stage.name, check)
            return ok
        tests = await loop.run_in_executor(None, self._read_tests, stage, result, report_dir, before)
        self.response.tests = tests
        return tests.verdict == "passed"

    def _read_tests(self, stage: GradeStage, result: ProcessResult, report_dir: str,
                    before: dict) -> GradedTests:
        project = self.state.config.project
        notes: list[str] = []
        reports = sorted(p for p in Path(report_dir).rglob("*.xml") if not p.is_symlink())
        if stage.report_glob:
            reports += fresh_reports(before, find_reports(project, stage.report_glob))
        cases: dict[str, TestCase] = {}
        used = []
        for path in reports:
            # A report in the project is read with the tool user's identity, like the project.
            identity = self.state.files.as_user() if path.is_relative_to(project) else contextlib.nullcontext()
            try:
                with identity:
                    found = parse_cases(path)
            except (ValueError, OSError) as exc:
                notes.append(f"ignored report {path.name}: {exc}")
                continue
            used.append(str(path.relative_to(project)) if path.is_relative_to(project) else path.name)
            for case in found:
                if case.name in cases:
                    self.response.errors.append(f"test {case.name} is reported twice")
                cases[case.name] = TestCase(name=case.name, outcome=case.outcome, message=case.message)
        if stage.expected is not None:
            expected = [canonical_test_id(t) for t in stage.expected]
            for name in expected:
                if name not in cases:
                    cases[name] = TestCase(name=name, outcome="missing",
                                           message="expected, but not reported: it did not run, did not collect "
                                                   "or was renamed")
            unknown = sorted(set(cases) - set(expected))
            if unknown:
                self.response.errors.append(
                    f"the report names {len(unknown)} test(s) the suite does not have: {', '.join(unknown[:10])}")
        ordered = sorted(cases.values(), key=lambda c: c.name)
        passed = sum(c.outcome == "passed" for c in ordered)
        skipped = sum(c.outcome == "skipped" for c in ordered)
        scores = TestScores(total=len(ordered), passed=passed, skipped=skipped, failed=len(ordered) - passed - skipped)
        reward = None
        if stage.reward_file:
            reward, problem = _read_reward(stage.reward_file)
            if problem:
                self.response.errors.append(problem)
        if self.response.errors:
            verdict = "error"
        elif stage.reward_file:
            verdict = "passed" if reward is not None and reward >= 1.0 else "failed"
        elif not ordered:
            verdict = "no_tests"
            notes.append("no test ran: the suite did not collect, or the script wrote no report")
        else:
            verdict = "passed" if scores.failed == 0 and passed > 0 else "failed"
        output = "" if verdict == "passed" else _failure_output(result, "test script", stage.timeout)
        if notes:
            output = (output + "\n" if output else "") + "\n".join(notes)
        return GradedTests(status=Status.SUCCESS if verdict == "passed" else Status.FAILURE, verdict=verdict,
                           scores=scores, cases=ordered, reward=reward, output=output, exit_code=result.exit_code,
                           timed_out=result.timed_out, reports=used)


async def grade(state: SandboxState, req: GradeRequest) -> GradeResponse:
    assert state.reset_lock is not None
    async with state.reset_lock:
        return await Grading(state, req).run()
