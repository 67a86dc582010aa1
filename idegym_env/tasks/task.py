"""``Task``: a coding task as data — project, instruction, checks, reward, solution.

The on-disk layout is described in ``README.md`` next to this file.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shlex
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

from sandbox_server.models import (
    BashCommandRequest,
    CompilationRequest,
    SetupRequest,
    TestRequest,
    UploadFileChunkRequest,
)

from ..rewards import CheckResults, RewardFunction, RewardSpec, build_reward
from ..spaces import TOOL_NAMES, AnyToolCall, CreateFileCall, ToolCallSpace

TASK_FILE = "task.yaml"
PROJECT_DIR = "project"
SOLUTION_DIR = "solution"
# Caches that running a project leaves behind; they are not part of a task's content.
IGNORED_NAMES = {"__pycache__", ".pytest_cache", ".mypy_cache", ".DS_Store"}
IGNORED_SUFFIXES = (".pyc", ".pyo")
TASK_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
Stage = Literal["setup", "compilation", "tests"]


class TaskError(ValueError):
    """A task that cannot be found or loaded; the message names the file and the problem."""


class CheckScript(BaseModel):
    """A bash script run in the project directory; success means exit code 0 within ``timeout``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    script: str = Field(min_length=1)
    timeout: float = Field(120.0, gt=0, le=24 * 3600)

    @field_validator("script")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the script is empty")
        return value


class TestScript(CheckScript):
    """The test check: the script must write JUnit XML reports whose file names match ``report_glob``."""

    __test__ = False  # not a pytest class
    report_glob: str = Field("test-*.xml", min_length=1)


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
    The ``solution/`` directory's files are appended to ``solution`` as ``create_file`` calls.
    ``protected_paths`` are files or directories (relative to the project) that the checks rely
    on, typically the tests; the environment restores them (:meth:`restore_requests`) before it
    runs the checks, so an agent cannot pass by editing them.
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
    actions: list[AnyToolCall] = Field(default_factory=list)
    solution: list[AnyToolCall] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)

    _root: Path | None = PrivateAttr(None)

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
            unknown = [t for t in value if t not in TOOL_NAMES]
            if unknown or not value:
                raise ValueError(f"tools must be a non-empty subset of {list(TOOL_NAMES)}, got {list(value)}")
        return value

    @field_validator("protected_paths")
    @classmethod
    def _protected(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for raw in value:
            path = PurePosixPath(raw)
            if not raw or path.is_absolute() or ".." in path.parts or str(path) in ("", "."):
                raise ValueError(f"protected path {raw!r} must be relative to the project and inside it")
            out.append(path.as_posix())
        return tuple(out)

    @model_validator(mode="after")
    def _consistent(self) -> Task:
        if self.setup is None and self.compilation is None and self.test is None:
            raise ValueError(f"task {self.id!r} has no check: give at least one of setup, compile, test")
        if self.project is None and self.image is None:
            raise ValueError(f"task {self.id!r} has neither a project directory nor an image")
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
        solution_dir = root / SOLUTION_DIR
        if solution_dir.is_dir():
            for path in iter_files(solution_dir):
                rel = path.relative_to(solution_dir).as_posix()
                try:
                    content = path.read_text(encoding="utf-8")
                except UnicodeDecodeError as exc:
                    raise TaskError(f"{path}: solution files must be UTF-8 text") from exc
                self.solution.append(CreateFileCall.model_validate(
                    {"tool": "create_file", "arguments": {"path": rel, "content": content}}))

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

    def check_requests(self) -> dict[Stage, SetupRequest | CompilationRequest | TestRequest]:
        """The sandbox-server requests that run the task's checks, by stage in pipeline order; the
        answer to each is field ``stage`` of :class:`CheckResults`."""
        out: dict[Stage, SetupRequest | CompilationRequest | TestRequest] = {}
        if self.setup is not None:
            out["setup"] = SetupRequest(setup_check_script=self.setup.script, timeout=self.setup.timeout)
        if self.compilation is not None:
            out["compilation"] = CompilationRequest(compilation_script=self.compilation.script,
                                                    timeout=self.compilation.timeout)
        if self.test is not None:
            out["tests"] = TestRequest(test_script=self.test.script, timeout=self.test.timeout,
                                       report_glob=self.test.report_glob)
        return out

    def check_results(
        self, responses: Mapping[str, Mapping[str, Any]], *, steps: int = 0, submitted: bool = False,
        errors: list[str] | None = None,
    ) -> CheckResults:
        """:class:`CheckResults` from the response bodies by stage (a stage not run is absent)."""
        unknown = set(responses) - {"setup", "compilation", "tests"}
        if unknown:
            raise ValueError(f"unknown check stages {sorted(unknown)}; stages are setup, compilation, tests")
        return CheckResults.from_responses(
            setup=responses.get("setup"), compilation=responses.get("compilation"),
            tests=responses.get("tests"), expected_tests=self.expected_tests, steps=steps,
            max_steps=self.max_steps, submitted=submitted, errors=list(errors or []),
        )

    def protected_files(self) -> dict[str, bytes]:
        """Pristine content of every file under the protected paths, by project-relative path."""
        if not self.protected_paths:
            return {}
        project = self._require_project("protected_files")
        out: dict[str, bytes] = {}
        for rel in self.protected_paths:
            path = project / rel
            if path.is_dir() and not path.is_symlink():
                for file in iter_files(path):
                    if file.is_file() and not file.is_symlink():
                        out[file.relative_to(project).as_posix()] = file.read_bytes()
            elif path.is_file():
                out[rel] = path.read_bytes()
        return out

    def restore_requests(self) -> list[BashCommandRequest | UploadFileChunkRequest]:
        """Requests that put the protected paths back to their pristine state; run them before the checks.

        First one bash call removes every protected path (a directory goes whole, so files the
        agent added there go too), then each pristine file is uploaded, then executable bits are
        restored. Works on any backend, through the same API the agent uses. Every request must
        answer 200 (and the bash calls exit code 0); otherwise grade the episode with the
        failure in ``CheckResults.errors``, which voids the reward.
        """
        files = self.protected_files()
        if not self.protected_paths:
            return []
        project = self._require_project("restore_requests")
        quoted = " ".join(shlex.quote(p) for p in self.protected_paths)
        # chmod first: an agent may have made its tampering read-only.
        out: list[BashCommandRequest | UploadFileChunkRequest] = [BashCommandRequest(
            command=f"chmod -R u+w -- {quoted} 2>/dev/null; rm -rf -- {quoted}", timeout=60)]
        for rel, data in files.items():
            out.append(UploadFileChunkRequest(file_path=rel, content_base64=base64.b64encode(data).decode("ascii"),
                                              offset=0, truncate=True))
        executable = [rel for rel in files if os.stat(project / rel).st_mode & stat.S_IXUSR]
        if executable:
            out.append(BashCommandRequest(
                command="chmod +x -- " + " ".join(shlex.quote(p) for p in executable), timeout=60))
        return out

    def copy_project(self, destination: Path | str) -> Path:
        """Copy the pristine project to ``destination`` (which must not exist) and return it."""
        project = self._require_project("copy_project")
        dest = Path(destination)
        shutil.copytree(project, dest, symlinks=True,
                        ignore=lambda _dir, names: [n for n in names if _ignored(n)])
        return dest

    def content_hash(self) -> str:
        """sha256 (hex) over the task's files: the task directory, or the project and the task's
        data for a task built in code."""
        if self._root is not None:
            return hash_files(self._root).hexdigest()
        digest = hashlib.sha256(self.model_dump_json(exclude={"project"}).encode())
        if self.project is not None:
            hash_files(self.project, "project/", digest)
        return digest.hexdigest()

    def _require_project(self, what: str) -> Path:
        if self.project is None:
            raise TaskError(
                f"task {self.id!r} has no project directory (image {self.image!r}); {what} needs one")
        return self.project

    def __repr__(self) -> str:
        return f"Task(id={self.id!r}, language={self.language!r}, title={self.title!r})"


__all__ = ["Task", "TaskError", "CheckScript", "TestScript", "Stage", "hash_files", "iter_files",
           "TASK_FILE", "PROJECT_DIR", "SOLUTION_DIR"]
