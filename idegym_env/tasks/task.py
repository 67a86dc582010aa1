"""``Task``: a coding task as data — project, instruction, checks, reward, solution.

The on-disk layout is described in ``README.md`` next to this file.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from ..errors import IdeGymError
from ..rewards import CheckResults, RewardFunction, RewardSpec, build_reward
from ..spaces import ToolCallSpace
from ..tools import TOOL_NAMES, AnyToolCall, WriteFileCall, canonical
from .services import Service

TASK_FILE = "task.yaml"
PROJECT_DIR = "project"
SOLUTION_DIR = "solution"
GRADING_DIR = "grading"
# Caches that running a project leaves behind; they are not part of a task's content.
IGNORED_NAMES = {"__pycache__", ".pytest_cache", ".mypy_cache", ".DS_Store"}
IGNORED_SUFFIXES = (".pyc", ".pyo")
TASK_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")


class TaskError(IdeGymError, ValueError):
    """A task that cannot be found or loaded; the message names the file and the problem."""


class CheckScript(BaseModel):
    """A bash script run in the project directory; success means exit code 0 within ``timeout``.

    ``user`` is who runs it at grading: ``appuser`` (the tool user) or ``root`` (the grader's
    identity, for a harness that runs the code under test as the tool user itself — the judge);
    ``env`` is added to the pinned check environment. Every process a check leaves running ends
    when it ends, unless ``keep_processes`` (setup and compile only: a service the next checks
    use, e.g. a database the tests query); those end before the tests' report is read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    script: str = Field(min_length=1)
    timeout: float = Field(120.0, gt=0, le=24 * 3600)
    user: Literal["appuser", "root"] = "appuser"
    env: dict[str, str] = Field(default_factory=dict)
    keep_processes: bool = False

    @field_validator("script")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the script is empty")
        return value


class TestScript(CheckScript):
    """The test check. Its results come from JUnit XML reports written to ``$IDEGYM_REPORT_DIR``
    (and, for harnesses that write into the project, fresh files matching ``report_glob``), or from
    a ``reward_file`` (Harbor's verifiers). ``harness: judge`` runs the script as root with the
    judge (``$IDEGYM_JUDGE``: the code under test in processes of its own, the verdict out of its
    reach); ``in-process`` runs it as the tool user. ``expected`` lists the exact test ids the
    report must hold (pytest, unittest or JUnit spelling): a missing one counts as failed, an
    unknown one voids the grade."""

    __test__ = False  # not a pytest class
    harness: Literal["in-process", "judge"] = "in-process"
    report_glob: str | None = Field("test-*.xml", min_length=1)
    expected: tuple[str, ...] | None = None
    reward_file: str | None = None

    @model_validator(mode="after")
    def _judge_runs_as_root(self) -> TestScript:
        if self.keep_processes:
            raise ValueError("keep_processes is for setup and compile checks: the test check's processes end "
                             "before its report is read")
        if self.harness == "judge" and self.user != "root":
            object.__setattr__(self, "user", "root")
        return self


class TaskEnvironment(BaseModel):
    """An image built from a Dockerfile (``dockerfile``: its text; ``context``: the build context,
    relative to the task directory); ``env``: variables its sandboxes' tools get; ``workdir``:
    where the project is (default: the image's final WORKDIR). ``entrypoint``: the image's
    ENTRYPOINT, started in the background in every fresh sandbox as Harbor's docker environment
    starts it; ``services``: sandboxes started beside the task's own, in its network namespace,
    at every reset (Harbor's docker-compose environments: :mod:`.services`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dockerfile: str = Field(min_length=1)
    context: Path | None = None
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = Field(None, pattern=r"^/")
    entrypoint: tuple[str, ...] | None = None
    services: tuple[Service, ...] = ()


class TaskResources(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0)
    storage_mb: int | None = Field(None, gt=0)


class GradingFiles(BaseModel):
    """Files that exist only at grading: ``project`` files are written over the graded tree (tests
    the agent never saw, a SWE instance's ``test_patch`` applied), ``hidden`` ones go to
    ``$IDEGYM_HIDDEN``, which only root can read (tests of the judge tier). On disk: the task
    directory's ``grading/project/`` and ``grading/hidden/``."""

    model_config = ConfigDict(extra="forbid")

    project: dict[str, bytes] = Field(default_factory=dict)
    hidden: dict[str, bytes] = Field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.project or self.hidden)


def _relative(raw: str, what: str) -> str:
    path = PurePosixPath(raw)
    if not raw or path.is_absolute() or ".." in path.parts or str(path) in ("", "."):
        raise ValueError(f"{what} {raw!r} must be relative to the project and inside it")
    return path.as_posix()


def _read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in iter_files(root)
            if p.is_file() and not p.is_symlink()}


def _ignored(name: str) -> bool:
    return name in IGNORED_NAMES or name.endswith(IGNORED_SUFFIXES)


def iter_files(root: Path) -> Iterator[Path]:
    """Files and symlinks under ``root`` (sorted by POSIX path), without caches."""
    entries: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not _ignored(d))
        here = Path(dirpath)
        for d in dirnames:
            if (here / d).is_symlink():
                entries.append(here / d)  # os.walk does not descend into it; hash the link
        entries.extend(here / f for f in filenames if not _ignored(f))
    yield from sorted(entries, key=lambda p: p.relative_to(root).as_posix())


def hash_files(root: Path, prefix: str = "", digest: Any = None) -> Any:
    """sha256 over every file under ``root``: relative path, kind, size and bytes (symlinks: target).

    The executable bit is included because scripts depend on it; mtimes and owners are not.
    """
    digest = hashlib.sha256() if digest is None else digest
    for path in iter_files(root):
        rel = prefix + path.relative_to(root).as_posix()
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            data, kind = os.readlink(path).encode(), b"L"
        else:
            data, kind = path.read_bytes(), (b"X" if st.st_mode & stat.S_IXUSR else b"F")
        digest.update(rel.encode() + b"\0" + kind + str(len(data)).encode() + b"\0" + data)
    return digest


class Task(BaseModel):
    """A task: what the agent must do, where, and how success is measured.

    The project is a directory (``project``, relative to the task directory) or a prebuilt image
    (``image``) that contains it. Checks run in the project directory in the order setup →
    compilation → test; every check is optional, but a task needs at least one. ``reward`` names
    a reward function (:mod:`idegym_env.rewards`). ``solution`` is a list of tool calls that solves
    the task from the pristine project; ``actions`` is a short list of candidate tool calls for a
    discrete-action policy, at least one of which solves the task (``submit`` is not listed).
    The ``solution/`` directory's files are appended to ``solution`` as ``write_file`` calls.
    ``protected_paths`` are files or directories (relative to the project) that the checks rely
    on, typically the tests; ``editable`` are globs of what the agent may change (default: every
    file of the pristine project outside ``protected_paths``). Grading (``idegym_env.grading``)
    runs the checks on the pristine project plus only the agent's editable files, in a fresh
    sandbox, with ``grading`` files installed only then; ``grade_in_place`` grades the agent's
    own sandbox instead (Harbor's semantics: the task is the whole container's state);
    ``verifier_environment`` grades in a sandbox of that image instead, given only the agent's
    ``artifacts`` (absolute paths; Harbor's separate verifier: ``idegym_env.grading.separate``).
    ``files`` (project-relative path → text) are the task's own starting files, written into the
    sandbox's project at every reset over the image's project, so that many tasks can share one
    image (HumanEval's problems share the built-in image); grading counts them as part of the
    pristine project, written from the task, never from the agent's sandbox.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    id: str
    title: str = Field(min_length=1)
    language: str = Field(min_length=1)
    instruction: str = Field(min_length=1)
    image: str | None = None
    project: Path | None = None
    setup: CheckScript | None = None
    compilation: CheckScript | None = Field(None, validation_alias=AliasChoices("compilation", "compile"))
    test: TestScript | None = None
    reward: RewardSpec = Field(default_factory=lambda: RewardSpec(name="test_pass_fraction"))
    max_steps: int = Field(30, ge=1)
    expected_tests: int | None = Field(None, ge=1)
    tools: tuple[str, ...] | None = None
    protected_paths: tuple[str, ...] = ()
    editable: tuple[str, ...] | None = None
    grade_in_place: bool = False
    environment: TaskEnvironment | None = None
    verifier_environment: TaskEnvironment | None = None
    artifacts: tuple[str, ...] = ()
    resources: TaskResources | None = None
    network: bool = False
    run_as_root: bool = False
    agent_timeout: float | None = Field(None, gt=0)
    files: dict[str, str] = Field(default_factory=dict)
    actions: list[AnyToolCall] = Field(default_factory=list)
    solution: list[AnyToolCall] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)

    _root: Path | None = PrivateAttr(None)
    _grading: GradingFiles = PrivateAttr(default_factory=GradingFiles)

    # -- validation ---------------------------------------------------------------------------------

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not TASK_ID.match(value):
            raise ValueError(f"task id {value!r} must be lower-case letters, digits, '.', '_' or '-'")
        return value

    @field_validator("language")
    @classmethod
    def _language(cls, value: str) -> str:
        return value.lower()

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None:
            value = tuple(canonical(t) for t in value)  # an older name (create_file) is the tool's
            unknown = [t for t in value if t not in TOOL_NAMES]
            if unknown or not value:
                raise ValueError(f"tools must be a non-empty subset of {list(TOOL_NAMES)}, got {list(value)}")
        return value

    @field_validator("protected_paths")
    @classmethod
    def _protected(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_relative(raw, "protected path") for raw in value)

    @field_validator("editable")
    @classmethod
    def _editable(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and not value:
            raise ValueError("editable must name at least one glob (leave it out for every existing file)")
        return None if value is None else tuple(_relative(raw, "editable glob") for raw in value)

    @field_validator("artifacts")
    @classmethod
    def _artifacts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for raw in value:
            if not raw.startswith("/") or ".." in PurePosixPath(raw).parts or raw.rstrip("/") == "":
                raise ValueError(f"artifact {raw!r} must be an absolute path below / without '..'")
        return value

    @field_validator("files")
    @classmethod
    def _files(cls, value: dict[str, str]) -> dict[str, str]:
        return {_relative(raw, "starting file"): content for raw, content in value.items()}

    @model_validator(mode="after")
    def _consistent(self) -> Task:
        if self.setup is None and self.compilation is None and self.test is None:
            raise ValueError(f"task {self.id!r} has no check: give at least one of setup, compile, test")
        if self.project is None and self.image is None and self.environment is None:
            raise ValueError(f"task {self.id!r} has neither a project directory nor an image nor an environment")
        tools = set(self.tools or TOOL_NAMES)
        for kind, calls in (("solution", self.solution), ("actions", self.actions)):
            for call in calls:
                if call.tool not in tools:
                    raise ValueError(f"task {self.id!r}: {kind} uses tool {call.tool!r}, which the task does "
                                     f"not enable ({sorted(tools)})")
        return self

    # -- loading ------------------------------------------------------------------------------------

    @classmethod
    def from_dir(cls, directory: Path | str) -> Task:
        """Load ``<directory>/task.yaml``; relative paths in it are relative to ``directory``."""
        root = Path(directory).resolve()
        file = root / TASK_FILE
        if not file.is_file():
            raise TaskError(f"{root}: no {TASK_FILE} (a task directory holds {TASK_FILE}, {PROJECT_DIR}/ and "
                            f"optionally {SOLUTION_DIR}/)")
        try:
            data = yaml.safe_load(file.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise TaskError(f"{file}: not valid YAML: {exc}") from exc
        if not isinstance(data, Mapping):
            raise TaskError(f"{file}: expected a mapping of task fields, got {type(data).__name__}")
        data = dict(data)
        if "project" not in data and (root / PROJECT_DIR).is_dir():
            data["project"] = PROJECT_DIR
        try:
            task = cls.model_validate(data)
        except ValidationError as exc:
            raise TaskError(f"{file}: invalid task: {exc}") from exc
        task._attach(root)
        if task.id != root.name:
            raise TaskError(f"{file}: id {task.id!r} differs from the directory name {root.name!r}")
        return task

    def _attach(self, root: Path) -> None:
        self._root = root
        if self.project is not None:
            self.project = (root / self.project).resolve()
            if not self.project.is_dir():
                raise TaskError(f"{root / TASK_FILE}: project directory {self.project} does not exist")
        grading = root / GRADING_DIR
        self._grading = GradingFiles(
            project=_read_tree(grading / "project") if (grading / "project").is_dir() else {},
            hidden=_read_tree(grading / "hidden") if (grading / "hidden").is_dir() else {})
        solution_dir = root / SOLUTION_DIR
        if solution_dir.is_dir():
            for path in iter_files(solution_dir):
                rel = path.relative_to(solution_dir).as_posix()
                try:
                    content = path.read_text(encoding="utf-8")
                except UnicodeDecodeError as exc:
                    raise TaskError(f"{path}: solution files must be UTF-8 text") from exc
                self.solution.append(WriteFileCall.model_validate(
                    {"tool": "write_file", "arguments": {"path": rel, "content": content}}))

    @property
    def root(self) -> Path | None:
        """The task directory, when the task was loaded from one."""
        return self._root

    # -- what an environment needs ------------------------------------------------------------------

    @property
    def report_glob(self) -> str | None:
        return self.test.report_glob if self.test is not None else None

    def reward_function(self) -> RewardFunction:
        return build_reward(self.reward)

    def action_space(self, **kwargs: Any) -> ToolCallSpace:
        """A :class:`ToolCallSpace` with the task's tools (all tools when the task names none)."""
        return ToolCallSpace(self.tools, **kwargs)

    @property
    def grading(self) -> GradingFiles:
        """Files installed only at grading (see :class:`GradingFiles`)."""
        return self._grading

    def with_grading(self, grading: GradingFiles) -> Task:
        """This task with ``grading`` files (task sources build them in code)."""
        self._grading = grading
        return self

    def stages(self) -> list[tuple[str, CheckScript]]:
        """The checks in pipeline order: ``(stage name, script)``."""
        named = (("setup", self.setup), ("compilation", self.compilation), ("tests", self.test))
        return [(name, script) for name, script in named if script is not None]

    def check_results(
        self, responses: Mapping[str, Any], *, steps: int = 0, submitted: bool = False,
        errors: list[str] | None = None, infrastructure_error: str | None = None,
    ) -> CheckResults:
        """:class:`CheckResults` from the stage results by name (a stage not run is absent)."""
        unknown = set(responses) - {"setup", "compilation", "tests"}
        if unknown:
            raise ValueError(f"unknown check stages {sorted(unknown)}; stages are setup, compilation, tests")
        return CheckResults.from_responses(
            setup=responses.get("setup"), compilation=responses.get("compilation"),
            tests=responses.get("tests"), expected_tests=self.expected_tests, steps=steps,
            max_steps=self.max_steps, submitted=submitted, errors=list(errors or []),
            infrastructure_error=infrastructure_error,
        )

    def copy_project(self, destination: Path | str) -> Path:
        """Copy the pristine project to ``destination`` (which must not exist) and return it."""
        project = self._require_project("copy_project")
        dest = Path(destination)
        shutil.copytree(project, dest, symlinks=True,
                        ignore=lambda _dir, names: [n for n in names if _ignored(n)])
        return dest

    def content_hash(self) -> str:
        """sha256 (hex) over the task's content: the task directory's files, or — for a task built
        in code — its fields, the files of its project and of its environment's build context, and
        its grading files. Where those lie on disk and ``metadata`` (descriptive: where a task
        came from) do not count, so a set's hashes are the same in every checkout."""
        if self._root is not None:
            return hash_files(self._root).hexdigest()
        exclude: dict[str, Any] = {"project": True, "metadata": True}
        if self.environment is not None:
            exclude["environment"] = {"context"}
        digest = hashlib.sha256(self.model_dump_json(exclude=exclude).encode())
        if self.project is not None:
            hash_files(self.project, "project/", digest)
        if self.environment is not None and self.environment.context is not None:
            hash_files(Path(self.environment.context), "context/", digest)
        for kind, files in (("project", self._grading.project), ("hidden", self._grading.hidden)):
            for rel in sorted(files):
                digest.update(f"grading/{kind}/{rel}\0{len(files[rel])}\0".encode() + files[rel])
        return digest.hexdigest()

    def _require_project(self, what: str) -> Path:
        if self.project is None:
            raise TaskError(
                f"task {self.id!r} has no project directory (image {self.image!r}); {what} needs one")
        return self.project

    def __repr__(self) -> str:
        return f"Task(id={self.id!r}, language={self.language!r}, title={self.title!r})"


__all__ = ["Task", "TaskError", "CheckScript", "TestScript", "GradingFiles", "TaskEnvironment", "TaskResources",
           "hash_files", "iter_files",
           "TASK_FILE", "PROJECT_DIR", "SOLUTION_DIR"]
