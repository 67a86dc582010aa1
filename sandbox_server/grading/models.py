"""Wire shapes of grading (beyond ``specs/``): exporting the agent's editable files, and grading.

``POST /api/project/export`` answers the files of the project the task lets the agent change;
``POST /api/grade`` installs files into the (fresh) project, runs the check stages and answers
their results. Both are used by ``idegym_env.grading``; see ``docs/security.md`` §3.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..models import CheckResult, TestReport

MAX_EXPORT_FILES = 20_000
MAX_EXPORT_BYTES = 256 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def relative_path(value: str) -> str:
    """A project-relative POSIX path that stays in the project."""
    path = PurePosixPath(value)
    if not value or "\x00" in value or path.is_absolute() or ".." in path.parts or path.as_posix() in ("", "."):
        raise ValueError(f"{value!r} must be a relative path inside the project (no '..', not absolute)")
    return path.as_posix()


class ExportedFile(_Strict):
    path: str
    content_base64: str
    executable: bool = False

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        return relative_path(value)


class ExportRequest(_Strict):
    """Which files of the project to send back: those matching ``editable`` (globs, ``**``
    allowed) or, without globs, every file that the pristine project (with the task's
    ``starting`` files) has outside ``protected``.
    Names that configure a harness rather than hold code under test are never exported."""

    editable: list[str] | None = None
    protected: list[str] = Field(default_factory=list)
    starting: list[str] = Field(default_factory=list, description="files the task writes into the project at "
                                                                  "reset: they count as files of the pristine project")
    max_files: int = Field(MAX_EXPORT_FILES, ge=1, le=MAX_EXPORT_FILES)
    max_bytes: int = Field(MAX_EXPORT_BYTES, ge=1, le=MAX_EXPORT_BYTES)

    @field_validator("starting")
    @classmethod
    def _relative(cls, value: list[str]) -> list[str]:
        return [relative_path(p) for p in value]


class Skipped(_Strict):
    path: str
    reason: str


class ExportResponse(_Strict):
    files: list[ExportedFile] = Field(default_factory=list)
    deleted: list[str] = Field(default_factory=list,
                               description="editable files of the pristine project the agent removed")
    skipped: list[Skipped] = Field(default_factory=list,
                                   description="matching entries that were not exported, and why")
    total_bytes: int = 0


StageName = Literal["setup", "compilation", "tests"]


class GradeStage(_Strict):
    name: StageName
    script: str = Field(min_length=1)
    timeout: float = Field(600.0, gt=0, le=24 * 3600)
    graceful_termination_timeout: float = Field(2.0, ge=0, le=60)
    user: Literal["appuser", "root"] = Field(
        "appuser", description="root: the grader identity (judge tier: the code under test runs as the tool "
                               "user in subject processes); appuser: the tool user (in-process harnesses)")
    env: dict[str, str] = Field(default_factory=dict)
    keep_processes: bool = Field(False, description="setup, compilation: what the stage leaves running goes on into "
                                                    "the next stages (a service they use), ended before the tests' "
                                                    "report is read; otherwise it is ended with the stage")
    report_glob: str | None = Field(None, description="tests: JUnit reports the script writes in the project "
                                                      "(only fresh ones count), besides those in $IDEGYM_REPORT_DIR")
    expected: list[str] | None = Field(None, description="tests: the exact test ids the report must hold")
    reward_file: str | None = Field(None, description="tests: a file the script writes its reward to "
                                                      "(Harbor: /logs/verifier/reward.txt or reward.json)")

    @field_validator("reward_file")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None:
            path = PurePosixPath(value)
            if not path.is_absolute() or ".." in path.parts or len(path.parts) < 3:
                raise ValueError("reward_file must be an absolute path at least two directories deep, without '..'")
        return value


class GradeRequest(_Strict):
    files: list[ExportedFile] = Field(default_factory=list, description="written into the project first")
    delete: list[str] = Field(default_factory=list, description="removed from the project first")
    hidden: list[ExportedFile] = Field(default_factory=list,
                                    description="written into $IDEGYM_HIDDEN, a directory only root can read")
    stages: list[GradeStage] = Field(min_length=1, max_length=3)

    @field_validator("delete")
    @classmethod
    def _relative(cls, value: list[str]) -> list[str]:
        return [relative_path(p) for p in value]

    @model_validator(mode="after")
    def _order(self) -> GradeRequest:
        order = ["setup", "compilation", "tests"]
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names) or names != sorted(names, key=order.index):
            raise ValueError(f"stages must be distinct and in the order setup, compilation, tests, got {names}")
        for stage in self.stages:
            if stage.name != "tests" and (stage.expected or stage.report_glob or stage.reward_file):
                raise ValueError(f"stage {stage.name}: expected, report_glob and reward_file belong to the tests stage")
            if stage.name == "tests" and stage.keep_processes:
                raise ValueError("stage tests: keep_processes belongs to setup and compilation (the tests' processes "
                                 "end before the report is read)")
        return self


class TestCase(_Strict):
    __test__ = False
    name: str
    outcome: Literal["passed", "failed", "error", "skipped", "missing"]
    message: str = ""


Verdict = Literal["passed", "failed", "no_tests", "error"]


class GradedTests(TestReport):
    """The tests stage: outcomes per test, and a verdict that follows the tests, not the exit code
    (``status`` is success iff the verdict is ``passed``)."""

    __test__ = False
    verdict: Verdict
    cases: list[TestCase] = Field(default_factory=list)
    reward: float | None = Field(None, description="from the reward file, when the stage has one")


class GradeResponse(_Strict):
    setup: CheckResult | None = None
    compilation: CheckResult | None = None
    tests: GradedTests | None = None
    errors: list[str] = Field(default_factory=list, description="why the grade cannot stand (a missing or "
                                                                "unexpected test, an unreadable report): a failure")
    killed_processes: int = 0
