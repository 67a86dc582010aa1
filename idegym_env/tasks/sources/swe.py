"""SWE-style instances (SWE-bench, SWE-Gym, SWE-smith, R2E-Gym) as tasks: ``swe:<file>``.

An instance is the SWE-bench schema — ``instance_id, repo, base_commit, problem_statement,
patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS`` (the lists as JSON lists or JSON strings) — in a
``.json`` file (one object or a list) or ``.jsonl`` file (one object a line). How a repository is
obtained and its tests run comes from ``repos.json`` next to the file (``{repo: {source,
profile}}``, see :mod:`.repos`); an instance may override the profile with its own fields
``install``, ``test_cmd``, ``test_framework``, ``env``, ``dockerfile``.

The task: the repository's files at ``base_commit`` (no history) on an image built from the
profile's Dockerfile; the instruction is the problem statement; at grading the test files —
after ``test_patch`` — are written over the agent's tree and the listed tests run; reward 1.0
iff every FAIL_TO_PASS and PASS_TO_PASS test passes (a listed test missing from the report
counts as failed). The oracle applies ``patch`` with ``git apply``.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..task import GradingFiles, Task, TaskError
from . import repos, swe_family

# SWE-bench's convention: a Python environment with pip on PATH (install commands such as
# `pip install -e .` run in /testbed), here a venv that also sees Debian's pytest.
DEFAULT_DOCKERFILE = """\
FROM debian:bookworm
RUN apt-get update \\
 && apt-get install -y --no-install-recommends python3 python3-pytest python3-pip python3-venv python-is-python3 \\
    git ca-certificates \\
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv --system-site-packages /opt/venv && chown -R 1000:1000 /opt/venv
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
"""
REPORT = '"${IDEGYM_REPORT_DIR:-.}/swe-report.xml"'
UNITTEST_RUNNER = ".idegym/unittest_junit.py"
PATCH_EOF = "IDEGYM_GOLD_PATCH_EOF"
INSTRUCTION_FOOTER = """

---
The repository is in the current directory (its files at the commit the issue was filed
against; there is no git history). Change the source so that the issue is resolved. Tests that
check the fix are added when you submit; the repository's test files are restored then, so
changes to them do not count. Submit when you are done."""


class Profile(BaseModel):
    """How a repository's environment is built and its tests are run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dockerfile: str = DEFAULT_DOCKERFILE
    install: tuple[str, ...] = ()
    test_framework: Literal["pytest", "unittest"] = "pytest"
    test_cmd: str | None = Field(None, description="overrides the framework's command; {tests} and {report} "
                                                   "are replaced by the test files/modules and the report path")
    env: dict[str, str] = Field(default_factory=dict)
    timeout: float = Field(900.0, gt=0)
    log_parser: str | None = Field(None, description="a SWE-bench/SWE-rebench log parser's name: the report is read "
                                                     "from the test command's output (swe_family.py)")


class SweInstance(BaseModel):
    """One instance in the SWE-bench schema (unknown fields are kept in ``extra``)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    instance_id: str = Field(min_length=1)
    repo: str = Field(min_length=1)
    base_commit: str = Field(pattern=r"^[0-9a-f]{7,40}$")
    problem_statement: str = Field(min_length=1)
    patch: str = ""
    test_patch: str = ""
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    hints_text: str = ""
    install: tuple[str, ...] | None = None
    test_cmd: str | None = None
    test_framework: Literal["pytest", "unittest"] | None = None
    env: dict[str, str] | None = None
    dockerfile: str | None = None
    install_config: dict[str, Any] | None = None  # SWE-rebench (swe_family.py)
    image_name: str | None = None  # SWE-smith, SWE-Gym: a prebuilt image with the repository in /testbed
    docker_image: str | None = None  # R2E-Gym's spelling

    @field_validator("install_config", mode="before")
    @classmethod
    def _install_config(cls, value: Any) -> Any:
        return swe_family.read_install_config(value)

    @property
    def image(self) -> str | None:
        return self.image_name or self.docker_image

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        if isinstance(value, str):  # SWE-bench publishes the lists as JSON strings
            try:
                value = json.loads(value) if value.strip() else []
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a JSON list of test ids: {exc}") from exc
        return value

    @field_validator("install", mode="before")
    @classmethod
    def _commands(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @property
    def task_id(self) -> str:
        slug = re.sub(r"[^a-z0-9._-]+", "-", self.instance_id.lower()).strip("-._")[:100]
        return slug or "instance"

    def profile(self, base: Profile) -> Profile:
        """``base`` with this instance's own environment fields laid over it."""
        fields = {k: getattr(self, k) for k in ("install", "test_cmd", "test_framework", "env", "dockerfile")
                  if getattr(self, k) is not None}
        if self.install_config:  # the row's own fields, if any, over what its install_config says
            fields = {**swe_family.rebench_profile(self.install_config), **fields}
        return base.model_copy(update=fields) if fields else base


def read_instances(path: Path) -> list[SweInstance]:
    """Instances from a ``.json`` (object or list) or ``.jsonl`` file; errors name the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskError(f"{path}: cannot read SWE instances: {exc}") from exc
    rows: list[tuple[str, Any]] = []
    if path.suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append((f"{path}:{number}", json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise TaskError(f"{path}:{number}: not JSON: {exc}") from exc
    else:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TaskError(f"{path}: not JSON: {exc}") from exc
        items = doc if isinstance(doc, list) else [doc]
        rows = [(f"{path}[{i}]", item) for i, item in enumerate(items)]
    out: list[SweInstance] = []
    seen: set[str] = set()
    for where, row in rows:
        try:
            instance = SweInstance.model_validate(row)
        except ValidationError as exc:
            raise TaskError(f"{where}: not a SWE-style instance: {exc}") from exc
        if instance.task_id in seen:
            raise TaskError(f"{where}: instance id {instance.instance_id!r} appears twice")
        seen.add(instance.task_id)
        out.append(instance)
    return out


# -- test ids -------------------------------------------------------------------------------------


def test_file(test_id: str, framework: str) -> str:
    """The project-relative file that holds a test: pytest's ``path.py::…`` or unittest's dotted
    ``package.module.Class.test`` / ``test (package.module.Class)``."""
    if "::" in test_id or framework == "pytest":
        return test_id.split("::", 1)[0]
    found = re.match(r"^\w+ \(([\w.]+)\)$", test_id)
    dotted = found.group(1) if found else test_id
    parts = dotted.split(".")
    # module path: the parts before the first capitalised one (the TestCase class)
    module = []
    for part in parts:
        if part[:1].isupper():
            break
        module.append(part)
    if len(module) == len(parts):  # a function-level id: drop the test name
        module = module[:-1]
    return "/".join(module) + ".py"


def test_module(file: str) -> str:
    return file.removesuffix(".py").replace("/", ".")


def test_command(profile: Profile, targets: list[str]) -> str:
    """The bash that runs ``targets`` — the listed test ids (pytest node ids, dotted unittest ids),
    so that the report holds those tests and no others — and writes the JUnit report to
    ``$IDEGYM_REPORT_DIR``."""
    quoted = " ".join(shlex.quote(t) for t in targets)
    if profile.test_framework == "unittest":
        default = f"python3 {UNITTEST_RUNNER} --junit {{report}} {{tests}}"
    else:
        default = "python3 -m pytest -p no:cacheprovider -o addopts= -q -rN --junitxml={report} {tests}"
    command = (profile.test_cmd or default).replace("{report}", REPORT).replace("{tests}", quoted)
    if profile.log_parser:  # the dataset's command writes no report: its output is read
        return swe_family.log_test_command(command, profile.log_parser, REPORT)
    return command


def unittest_runner_source() -> bytes:
    return (Path(__file__).with_name("unittest_junit.py")).read_bytes()


# -- building tasks -------------------------------------------------------------------------------


class RepoEntry(BaseModel):
    model_config = ConfigDict(extra="allow")

    source: repos.RepoSource
    profile: Profile = Field(default_factory=Profile)


def read_repos(path: Path) -> dict[str, RepoEntry]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {name: RepoEntry.model_validate(entry) for name, entry in data.items()}
    except (json.JSONDecodeError, ValidationError, AttributeError) as exc:
        raise TaskError(f"{path}: invalid repos.json: {exc}") from exc


class SweSet:
    """The instances of one file, with their repositories; ``task(id)`` builds a task (fetching
    and caching its repository the first time)."""

    def __init__(self, path: Path | str, *, cache: Path | None = None) -> None:
        self.path = Path(path).resolve()
        self.cache = cache
        self.instances = {i.task_id: i for i in read_instances(self.path)}
        self.repos = read_repos(self.path.parent / "repos.json")

    @property
    def ids(self) -> list[str]:
        return list(self.instances)

    def entry(self, instance: SweInstance) -> RepoEntry:
        entry = self.repos.get(instance.repo)
        if entry is not None:
            return entry
        # no repos.json entry: a local path or a git URL in `repo`, else GitHub's owner/name
        where = Path(instance.repo).expanduser()
        if not where.is_absolute():
            where = self.path.parent / where
        if where.exists():
            is_git = (where / ".git").exists() or (where / "HEAD").is_file()
            if where.is_dir() and not is_git:
                raise TaskError(f"instance {instance.instance_id!r}: {where} is a directory but not a git "
                                f"repository; give a git repository, an archive, or a repos.json entry")
            source = repos.RepoSource(git=str(where)) if is_git else repos.RepoSource(archive=str(where))
        elif "://" in instance.repo:
            source = repos.RepoSource(git=instance.repo)
        else:
            source = repos.RepoSource(git=f"https://github.com/{instance.repo}.git")
        return RepoEntry(source=source)

    def project(self, instance: SweInstance) -> Path:
        """The files of ``base_commit``, exported once into the cache."""
        cache = self.cache or repos.cache_root()
        entry = self.entry(instance)
        git_dir, release = repos.release_repo(instance.repo, entry.source, base_dir=self.path.parent, cache=cache)
        commit = instance.base_commit
        if entry.source.builds_commits:
            assert release is not None
            made = repos.instance_commit(git_dir, release, instance.instance_id, instance.patch, instance.test_patch)
            if not made.startswith(commit):
                raise TaskError(f"instance {instance.instance_id!r}: building it from {instance.repo!r} gave commit "
                                f"{made}, not its base_commit {commit} (data and repository disagree)")
        elif not repos.has_commit(git_dir, commit):
            raise TaskError(f"instance {instance.instance_id!r}: {instance.repo!r} has no commit {commit}")
        dest = cache / "swe-projects" / f"{instance.task_id}-{commit[:12]}"
        if not dest.is_dir():
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=dest.parent))
            try:
                repos.export_tree(git_dir, commit, tmp / "tree")
                try:
                    (tmp / "tree").rename(dest)
                except OSError:
                    if not dest.is_dir():  # another process won the race: theirs is the same tree
                        raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return dest

    def test_files(self, instance: SweInstance, profile: Profile) -> list[str]:
        files: list[str] = []
        for test_id in instance.FAIL_TO_PASS + instance.PASS_TO_PASS:
            file = test_file(test_id, profile.test_framework)
            if file not in files:
                files.append(file)
        return files

    def grading_project_files(self, instance: SweInstance, project: Path, profile: Profile) -> dict[str, bytes]:
        """The test files as they are at grading: the pristine ones with ``test_patch`` applied."""
        touched = set(self.test_files(instance, profile)) | set(repos.patched_files(instance.test_patch))
        with tempfile.TemporaryDirectory(prefix="swe-grading-") as tmp:
            work = Path(tmp) / "tree"
            shutil.copytree(project, work, symlinks=True)
            repos.apply_patch(work, instance.test_patch)
            # The whole directory of each test file (its __init__.py and helpers are test code too);
            # a test file at the top level is taken alone.
            for directory in {str(Path(f).parent) for f in touched} - {"."}:
                touched |= {p.relative_to(work).as_posix() for p in (work / directory).rglob("*")
                            if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts}
            out = {rel: (work / rel).read_bytes() for rel in sorted(touched) if (work / rel).is_file()}
        if profile.test_framework == "unittest":
            out[UNITTEST_RUNNER] = unittest_runner_source()
        if profile.log_parser:
            out[swe_family.LOG_JUNIT] = Path(__file__).with_name("log_junit.py").read_bytes()
        return out

    def task(self, task_id: str) -> Task:
        try:
            instance = self.instances[task_id]
        except KeyError:
            raise TaskError(f"no instance {task_id!r} in {self.path}; instances: "
                            f"{', '.join(self.ids[:20])}{' …' if len(self.ids) > 20 else ''}") from None
        repo_profile = self.entry(instance).profile
        profile = instance.profile(repo_profile)
        if profile.log_parser:
            swe_family.known_parser(profile.log_parser)
        if instance.image:  # the repository is in the image: nothing to fetch
            return build_image_task(instance, profile, source=f"swe:{self.path}")
        project = self.project(instance)
        return build_task(instance, repo_profile, project, self.grading_project_files(instance, project, profile),
                          source=f"swe:{self.path}")

    def tasks(self) -> list[Task]:
        return [self.task(i) for i in self.ids]


def gold_patch_call(patch: str) -> dict[str, Any]:
    """The oracle's tool call: ``git apply`` of the gold patch, given on a here-document."""
    if PATCH_EOF in patch:
        raise TaskError("the gold patch contains the here-document delimiter")
    body = patch if patch.endswith("\n") else patch + "\n"
    return {"tool": "bash", "arguments": {
        "command": f"git apply --whitespace=nowarn <<'{PATCH_EOF}'\n{body}{PATCH_EOF}\n"}}


def build_task(instance: SweInstance, repo_profile: Profile, project: Path, grading_files: dict[str, bytes],
               *, source: str) -> Task:
    """The :class:`Task` of one instance (``project``: its exported files)."""
    profile = instance.profile(repo_profile)
    expected = list(dict.fromkeys(instance.FAIL_TO_PASS + instance.PASS_TO_PASS))
    if not instance.FAIL_TO_PASS:
        raise TaskError(f"instance {instance.instance_id!r} has no FAIL_TO_PASS test")
    protected = sorted({f for f in grading_files if f != UNITTEST_RUNNER})
    if profile.install:
        # The install commands need the project: bake it into the image (SWE-bench's /testbed).
        dockerfile = (profile.dockerfile.rstrip("\n") + "\nWORKDIR /testbed\nCOPY . /testbed\n"
                      + "".join(f"RUN {cmd}\n" for cmd in profile.install))
        environment = {"dockerfile": dockerfile, "context": project}
        project_field: Path | None = None
    else:
        environment = {"dockerfile": profile.dockerfile}
        project_field = project
    data: dict[str, Any] = {
        "id": instance.task_id,
        "title": instance.problem_statement.strip().splitlines()[0][:200],
        "language": "python",
        "instruction": instance.problem_statement.rstrip() + INSTRUCTION_FOOTER,
        "environment": environment,
        "project": project_field,
        "test": {"script": test_command(profile, expected), "timeout": profile.timeout, "env": profile.env,
                 "harness": "in-process", "expected": expected, "report_glob": None},
        "reward": "all_tests_pass",
        "max_steps": 60,
        "expected_tests": len(expected),
        "protected_paths": protected,
        "editable": ["**"],
        "solution": [gold_patch_call(instance.patch)] if instance.patch.strip() else [],
        "metadata": {"source": source, "instance_id": instance.instance_id, "repo": instance.repo,
                     "base_commit": instance.base_commit, "FAIL_TO_PASS": instance.FAIL_TO_PASS,
                     "PASS_TO_PASS": instance.PASS_TO_PASS, "test_framework": profile.test_framework},
    }
    try:
        task = Task.model_validate(data)
    except ValidationError as exc:
        raise TaskError(f"instance {instance.instance_id!r}: {exc}") from exc
    return task.with_grading(GradingFiles(project=grading_files))


def build_image_task(instance: SweInstance, profile: Profile, *, source: str) -> Task:
    """The :class:`Task` of a row whose image holds the repository (SWE-smith, SWE-Gym, R2E-Gym):
    graded in a fresh sandbox of that image with the agent's files laid over, after the test
    patch's files are taken back to the base commit and the test patch applied."""
    assert instance.image is not None
    expected = list(dict.fromkeys(instance.FAIL_TO_PASS + instance.PASS_TO_PASS))
    if not instance.FAIL_TO_PASS:
        raise TaskError(f"instance {instance.instance_id!r} has no FAIL_TO_PASS test")
    touched = repos.patched_files(instance.test_patch)
    files = {swe_family.LOG_JUNIT: Path(__file__).with_name("log_junit.py").read_bytes()} if profile.log_parser \
        else {}
    if profile.test_framework == "unittest":
        files[UNITTEST_RUNNER] = unittest_runner_source()
    data: dict[str, Any] = {
        "id": instance.task_id,
        "title": instance.problem_statement.strip().splitlines()[0][:200],
        "language": "python",
        "instruction": instance.problem_statement.rstrip() + INSTRUCTION_FOOTER,
        "environment": {"dockerfile": f"FROM {instance.image}\nWORKDIR {swe_family.IMAGE_PROJECT_DIR}\n"},
        "setup": {"script": swe_family.restore_and_patch_script(instance.base_commit, instance.test_patch, touched),
                  "timeout": 300, "user": "root"},
        "test": {"script": test_command(profile, expected), "timeout": profile.timeout, "env": profile.env,
                 "harness": "in-process", "expected": expected, "report_glob": None},
        "reward": "all_tests_pass",
        "max_steps": 60,
        "expected_tests": len(expected),
        "protected_paths": sorted({*touched, *files}),
        "editable": ["**"],
        "solution": [gold_patch_call(instance.patch)] if instance.patch.strip() else [],
        "metadata": {"source": source, "instance_id": instance.instance_id, "repo": instance.repo,
                     "base_commit": instance.base_commit, "image": instance.image,
                     "FAIL_TO_PASS": instance.FAIL_TO_PASS, "PASS_TO_PASS": instance.PASS_TO_PASS,
                     "test_framework": profile.test_framework},
    }
    try:
        task = Task.model_validate(data)
    except ValidationError as exc:
        raise TaskError(f"instance {instance.instance_id!r}: {exc}") from exc
    return task.with_grading(GradingFiles(project=files))


def shipped_instances() -> Path:
    """The SWE-style set shipped with the package."""
    return Path(__file__).resolve().parent.parent / "data" / "swe" / "instances.jsonl"


__all__ = ["SweInstance", "SweSet", "Profile", "read_instances", "build_task", "build_image_task", "test_file",
           "test_command",
           "gold_patch_call", "shipped_instances", "DEFAULT_DOCKERFILE"]
