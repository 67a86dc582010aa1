"""Harbor / Terminal-Bench task directories as tasks: ``harbor:<dir>``.

A Harbor task is a directory::

    task.toml            [metadata] [verifier] timeout_sec/env/user, [agent] timeout_sec,
                         [environment] cpus, memory(_mb), storage(_mb), allow_internet, docker_image
    instruction.md       what the agent is told
    environment/         the Dockerfile and its build context
    tests/test.sh        the verifier: writes /logs/verifier/reward.txt (a number) or reward.json
    solution/solve.sh    optional: the oracle

``harbor:<dir>`` is one such directory, or a directory of them. Read with ``tomllib`` only: the
``harbor`` package (Python >= 3.12) is not needed.

The task: the image built from ``environment/Dockerfile`` (the project is its WORKDIR); graded
in place (the format's semantics: the verifier judges the container as the agent left it, its
processes ended); ``tests/`` reaches the sandbox only at grading, as hidden files copied to
``/tests`` by the test stage, which then runs ``bash /tests/test.sh`` as the verifier's user with
its env and timeout; the reward is the number the verifier wrote. The oracle runs ``solve.sh``
(with the rest of ``solution/``) from a directory of its own.
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..task import GradingFiles, Task, TaskError, iter_files

TASK_TOML = "task.toml"
REWARD_DIR = "/logs/verifier"
SOLUTION_DIR = "/tmp/idegym-solution"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _megabytes(value: Any, where: str) -> int | None:
    """``2048`` (MB), ``"2G"``, ``"512M"``, ``"1.5GiB"`` → MB."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    found = _SIZE.match(str(value))
    if not found:
        raise TaskError(f"{where}: {value!r} is not a size (e.g. 2048, '2G', '512M')")
    number, unit = float(found.group(1)), (found.group(2) or "m").lower()[:1]
    factor = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024, "b": 1 / (1024 * 1024)}[unit]
    return max(1, int(number * factor))


def _expand(value: str) -> str:
    """Harbor's ``${VAR}`` / ``${VAR:-default}`` references, from this process's environment."""
    def sub(found: re.Match[str]) -> str:
        name, default = found.group(1), found.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise TaskError(f"task.toml refers to ${{{name}}}, which is not set")
    return _ENV_REF.sub(sub, value)


class HarborConfig(BaseModel):
    """The parts of ``task.toml`` a run needs (unknown keys are kept in ``metadata``)."""

    model_config = ConfigDict(extra="forbid")

    verifier_timeout: float = Field(600.0, gt=0)
    verifier_env: dict[str, str] = Field(default_factory=dict)
    verifier_user: str | None = None
    agent_timeout: float | None = Field(None, gt=0)
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0)
    storage_mb: int | None = Field(None, gt=0)
    allow_internet: bool = False
    docker_image: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


def read_config(path: Path) -> HarborConfig:
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise TaskError(f"{path}: not a readable task.toml: {exc}") from exc
    verifier, agent = doc.get("verifier", {}), doc.get("agent", {})
    env = doc.get("environment", {})
    for name, section in (("verifier", verifier), ("agent", agent), ("environment", env)):
        if not isinstance(section, dict):
            raise TaskError(f"{path}: [{name}] must be a table")
    raw_env = verifier.get("env", {})
    if not isinstance(raw_env, dict):
        raise TaskError(f"{path}: [verifier] env must be a table of strings")
    try:
        return HarborConfig(
            verifier_timeout=verifier.get("timeout_sec", 600.0),
            verifier_env={str(k): _expand(str(v)) for k, v in raw_env.items()},
            verifier_user=verifier.get("user"),
            agent_timeout=agent.get("timeout_sec"),
            cpus=env.get("cpus"),
            memory_mb=_megabytes(env.get("memory_mb", env.get("memory")), f"{path} [environment] memory"),
            storage_mb=_megabytes(env.get("storage_mb", env.get("storage")), f"{path} [environment] storage"),
            allow_internet=bool(env.get("allow_internet", False)),
            docker_image=env.get("docker_image"),
            metadata={**doc.get("metadata", {}), **({"task": doc["task"]} if "task" in doc else {})},
        )
    except ValidationError as exc:
        raise TaskError(f"{path}: {exc}") from exc


def _reward_file(tests: Path) -> str:
    """reward.txt unless the verifier only ever mentions reward.json."""
    text = ""
    for file in iter_files(tests):
        try:
            text += file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
    if "reward.json" in text and "reward.txt" not in text:
        return f"{REWARD_DIR}/reward.json"
    return f"{REWARD_DIR}/reward.txt"


def test_stage_script() -> str:
    """Copy the hidden tests to /tests (whatever the agent left there goes first) and run test.sh."""
    return ("set -e\n"
            "rm -rf /tests\n"
            'cp -R "$IDEGYM_HIDDEN/tests" /tests\n'
            "chmod -R a+rX /tests\n"
            "find /tests -type f -exec chmod a+x {} +\n"
            "mkdir -p /logs/agent\n"
            "set +e\n"
            "bash /tests/test.sh\n")


def oracle_call(solution: Path) -> dict[str, Any]:
    """One bash call that writes ``solution/`` to a directory of its own and runs ``solve.sh``
    from the project directory (files travel base64-encoded, so any byte survives)."""
    lines = ["set -e", f"rm -rf {SOLUTION_DIR}", f"mkdir -p {SOLUTION_DIR}"]
    for file in iter_files(solution):
        if not file.is_file() or file.is_symlink():
            continue
        rel = file.relative_to(solution).as_posix()
        target = shlex.quote(f"{SOLUTION_DIR}/{rel}")
        encoded = base64.b64encode(file.read_bytes()).decode("ascii")
        lines += [f"mkdir -p $(dirname {target})", f"base64 -d > {target} <<'IDEGYM_B64'", encoded, "IDEGYM_B64"]
        if os.access(file, os.X_OK):
            lines.append(f"chmod +x {target}")
    lines.append(f"bash {SOLUTION_DIR}/solve.sh")
    return {"tool": "bash", "arguments": {"command": "\n".join(lines) + "\n", "timeout": 1800.0}}


def _task_id(name: str) -> str:
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._")[:100]
    return slug or "harbor-task"


def load_harbor_task(directory: Path | str) -> Task:
    """The :class:`Task` of one Harbor task directory."""
    root = Path(directory).resolve()
    config = read_config(root / TASK_TOML)
    instruction_file = root / "instruction.md"
    if not instruction_file.is_file():
        raise TaskError(f"{root}: no instruction.md")
    tests = root / "tests"
    if not (tests / "test.sh").is_file():
        raise TaskError(f"{root}: no tests/test.sh (the verifier)")
    dockerfile = root / "environment" / "Dockerfile"
    if not dockerfile.is_file():
        if config.docker_image:
            raise TaskError(f"{root}: the environment is the prebuilt image {config.docker_image!r}, and no "
                            f"registry is reachable here; give an environment/Dockerfile")
        raise TaskError(f"{root}: no environment/Dockerfile (compose environments are not supported)")
    user = "root" if config.verifier_user in (None, "root", "0") else "appuser"
    dockerfile_text = dockerfile.read_text(encoding="utf-8")
    hidden = {f"tests/{p.relative_to(tests).as_posix()}": p.read_bytes() for p in iter_files(tests)
              if p.is_file() and not p.is_symlink()}
    solution = root / "solution"
    data: dict[str, Any] = {
        "id": _task_id(root.name),
        "title": (instruction_file.read_text(encoding="utf-8").strip().splitlines() or [root.name])[0][:200],
        "language": _language(config),
        "instruction": instruction_file.read_text(encoding="utf-8"),
        "environment": {"dockerfile": dockerfile_text, "context": root / "environment"},
        "test": {"script": test_stage_script(), "timeout": config.verifier_timeout, "user": user,
                 "env": config.verifier_env, "harness": "in-process", "report_glob": None,
                 "reward_file": _reward_file(tests)},
        "reward": "verifier_reward",
        "max_steps": 100,
        "grade_in_place": True,
        "run_as_root": runs_as_root(dockerfile_text),  # Harbor's agent is the image's USER
        "resources": {"cpus": config.cpus, "memory_mb": config.memory_mb, "storage_mb": config.storage_mb},
        "network": config.allow_internet,
        "agent_timeout": config.agent_timeout,
        "solution": [oracle_call(solution)] if (solution / "solve.sh").is_file() else [],
        "metadata": {"source": f"harbor:{root}", "harbor": config.metadata, "verifier_user": config.verifier_user},
    }
    try:
        task = Task.model_validate(data)
    except ValidationError as exc:
        raise TaskError(f"{root}: {exc}") from exc
    return task.with_grading(GradingFiles(hidden=hidden))


def runs_as_root(dockerfile: str) -> bool:
    """True unless the Dockerfile's last ``USER`` names someone other than root."""
    users = [line.split(None, 1)[1].strip() for line in dockerfile.splitlines()
             if line.strip().upper().startswith("USER ") and len(line.split(None, 1)) == 2]
    return not users or users[-1].split(":", 1)[0] in ("root", "0")


def _language(config: HarborConfig) -> str:
    tags = config.metadata.get("tags") or []
    known = ("python", "c", "cpp", "javascript", "typescript", "bash", "sql", "go", "rust", "java")
    for tag in tags:
        if str(tag).lower() in known:
            return str(tag).lower()
    return "shell"


def harbor_dirs(path: Path | str) -> list[Path]:
    """``path`` itself when it is a task directory, else its immediate task subdirectories."""
    root = Path(path).resolve()
    if (root / TASK_TOML).is_file():
        return [root]
    if not root.is_dir():
        raise TaskError(f"{root}: not a Harbor task directory nor a directory of them")
    found = sorted(d for d in root.iterdir() if (d / TASK_TOML).is_file())
    if not found:
        raise TaskError(f"{root}: no Harbor task (a subdirectory with {TASK_TOML})")
    return found


def shipped_tasks() -> Path:
    """The Harbor-format tasks shipped with the package."""
    return Path(__file__).resolve().parent.parent / "data" / "harbor"


__all__ = ["load_harbor_task", "harbor_dirs", "read_config", "HarborConfig", "oracle_call", "test_stage_script",
           "shipped_tasks", "runs_as_root"]
