"""Harbor / Terminal-Bench task directories as tasks: ``harbor:<dir>``.

A Harbor task is a directory::

    task.toml            schema 1.0-1.4: [metadata]; [verifier] timeout_sec/env/user/network_mode;
                         [agent] timeout_sec/user/network_mode; [solution] env; [environment]
                         cpus, memory(_mb), storage(_mb), network_mode/allow_internet, env, workdir,
                         docker_image, healthcheck
    instruction.md       what the agent is told
    environment/         the Dockerfile and its build context
    tests/test.sh        the verifier: writes /logs/verifier/reward.txt (a number) or reward.json
    solution/solve.sh    optional: the oracle

``harbor:<dir>`` is one such directory, or a directory of them. Read with ``tomllib`` only: the
``harbor`` package (Python >= 3.12) is not needed; the semantics are Harbor's (0.25): the network
is public unless the task says otherwise, ``memory = "2G"`` is 2048 MB, ``${VAR}`` /
``${VAR:-default}`` in env tables come from this process's environment.

The task: the image built from ``environment/Dockerfile`` (or ``FROM`` the ``docker_image``),
its project the ``workdir`` or the image's WORKDIR, its tools' variables the ``[environment]
env``; graded in place (the format's semantics: the verifier judges the container as the agent
left it, its processes ended); ``tests/`` reaches the sandbox only at grading, as hidden files
copied to ``/tests`` by the test stage, which then runs ``bash /tests/test.sh`` as the verifier's
user with its env and timeout; the reward is the number the verifier wrote. The oracle runs
``solve.sh`` (with the rest of ``solution/``) from ``/solution`` as Harbor's does. An image
ENTRYPOINT is started with every fresh sandbox and the services of a docker-compose environment
beside it (:mod:`..services`), as the IdeGym environment provider does under ``harbor run``. What
A separate verifier (``[verifier] environment_mode = "separate"``) grades in a sandbox of its
own image given the agent's ``artifacts`` (:mod:`idegym_env.grading.separate`). What the task
model cannot say — several ``[[steps]]``, a verifier of several services — is refused here with
an error naming it: ``harbor run`` with the IdeGym environment provider runs those.
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

from control_plane.dockerfile import final_entrypoint

from ..services import MAIN, ComposeError, Service, read_compose
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


class Healthcheck(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str = Field(min_length=1)
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    start_interval_sec: float = 5.0
    retries: int = 3


class HarborConfig(BaseModel):
    """``task.toml`` as Harbor reads it, schema versions 1.0 to 1.4 (what a run needs; the rest
    is kept in ``metadata``)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: str = "1.0"
    verifier_timeout: float = Field(600.0, gt=0)
    verifier_env: dict[str, str] = Field(default_factory=dict)
    verifier_user: str | None = None
    verifier_mode: str = "shared"
    verifier_image: str | None = None  # [verifier.environment] docker_image (a separate verifier's)
    artifacts: tuple[str, ...] = ()  # what a separate verifier gets of the agent's sandbox
    agent_timeout: float | None = Field(None, gt=0)
    agent_user: str | None = None
    solution_env: dict[str, str] = Field(default_factory=dict)
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0)
    storage_mb: int | None = Field(None, gt=0)
    network: str = "public"  # Harbor's network_mode: public | no-network (allowlists are refused)
    docker_image: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    healthcheck: Healthcheck | None = None
    steps: int = 0
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def allow_internet(self) -> bool:
        return self.network == "public"


def _table(doc: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    section = doc.get(name, {})
    if not isinstance(section, dict):
        raise TaskError(f"{path}: [{name}] must be a table")
    return section


def _env_table(section: dict[str, Any], where: str, path: Path) -> dict[str, str]:
    raw = section.get("env", {})
    if not isinstance(raw, dict):
        raise TaskError(f"{path}: {where} env must be a table of strings")
    return {str(k): _expand(str(v)) for k, v in raw.items()}


def _network(section: dict[str, Any], path: Path, where: str) -> str | None:
    """An explicit policy of a section: ``network_mode`` (1.2+), else the older ``allow_internet``."""
    mode = section.get("network_mode")
    if mode is not None:
        if mode == "allowlist":
            hosts = section.get("allowed_hosts") or []
            if hosts:
                raise TaskError(f"{path}: {where} network_mode = \"allowlist\" ({', '.join(map(str, hosts))}): IdeGym "
                                "cannot limit a sandbox's network to some hosts; use \"public\" or \"no-network\"")
            return "no-network"  # nothing allowed
        if mode not in ("public", "no-network"):
            raise TaskError(f"{path}: {where} network_mode {mode!r} is not public, no-network or allowlist")
        return str(mode)
    if section.get("allow_internet") is not None:
        return "public" if section["allow_internet"] else "no-network"
    return None


def read_config(path: Path) -> HarborConfig:
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise TaskError(f"{path}: not a readable task.toml: {exc}") from exc
    verifier, agent = _table(doc, "verifier", path), _table(doc, "agent", path)
    env, solution = _table(doc, "environment", path), _table(doc, "solution", path)
    if str(env.get("os", "linux")).lower() != "linux":
        raise TaskError(f"{path}: [environment] os = {env['os']!r}: IdeGym runs Linux sandboxes only")
    if env.get("gpus") or env.get("tpu"):
        raise TaskError(f"{path}: [environment] asks for GPUs or TPUs, which IdeGym's sandboxes do not have")
    network = _network(env, path, "[environment]") or "public"  # Harbor's default
    for name, section in (("[agent]", agent), ("[verifier]", verifier)):
        phase = _network(section, path, name)
        if phase is not None and phase != network:
            raise TaskError(f"{path}: {name} network_mode {phase!r} differs from [environment]'s {network!r}: IdeGym "
                            "cannot change a sandbox's network between phases (Harbor's docker environment cannot "
                            "either)")
    mode = verifier.get("environment_mode") or ("separate" if verifier.get("environment") else "shared")
    health = env.get("healthcheck")
    try:
        return HarborConfig(
            schema_version=str(doc.get("schema_version", doc.get("version", "1.0"))),
            verifier_timeout=verifier.get("timeout_sec", 600.0),
            verifier_env=_env_table(verifier, "[verifier]", path),
            verifier_user=None if verifier.get("user") is None else str(verifier["user"]),
            verifier_mode=str(mode),
            verifier_image=(verifier.get("environment") or {}).get("docker_image"),
            artifacts=tuple(str(a.get("source") if isinstance(a, dict) else a) for a in doc.get("artifacts") or []),
            agent_timeout=agent.get("timeout_sec"),
            agent_user=None if agent.get("user") is None else str(agent["user"]),
            solution_env=_env_table(solution, "[solution]", path),
            cpus=env.get("cpus"),
            memory_mb=_megabytes(env.get("memory_mb", env.get("memory")), f"{path} [environment] memory"),
            storage_mb=_megabytes(env.get("storage_mb", env.get("storage")), f"{path} [environment] storage"),
            network=network,
            docker_image=env.get("docker_image"),
            env=_env_table(env, "[environment]", path),
            workdir=env.get("workdir"),
            healthcheck=Healthcheck.model_validate(health) if isinstance(health, dict) else None,
            steps=len(doc.get("steps") or []),
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


def oracle_call(solution: Path, env: dict[str, str] | None = None, *, directory: str = SOLUTION_DIR
                ) -> dict[str, Any]:
    """One bash call that writes ``solution/`` to ``directory`` (Harbor's ``/solution``) and runs
    ``solve.sh`` from the project directory as Harbor's oracle does (``DEBIAN_FRONTEND``, the
    task's ``[solution] env``); files travel base64-encoded, so any byte survives."""
    lines = ["set -e", f"rm -rf {directory}", f"mkdir -p {directory}"]
    for file in iter_files(solution):
        if not file.is_file() or file.is_symlink():
            continue
        rel = file.relative_to(solution).as_posix()
        target = shlex.quote(f"{directory}/{rel}")
        encoded = base64.b64encode(file.read_bytes()).decode("ascii")
        lines += [f"mkdir -p $(dirname {target})", f"base64 -d > {target} <<'IDEGYM_B64'", encoded, "IDEGYM_B64"]
        if os.access(file, os.X_OK):
            lines.append(f"chmod +x {target}")
    exports = {"DEBIAN_FRONTEND": "noninteractive", **(env or {})}
    lines += [f"export {k}={shlex.quote(v)}" for k, v in exports.items()]
    lines.append(f"bash {directory}/solve.sh")
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
    if config.steps:
        raise TaskError(f"{root}: a multi-step task ({config.steps} [[steps]]): each step has an instruction, an "
                        "oracle and a verifier of its own, run one after another in one sandbox, where IdeGym's task "
                        "has one agent phase and one verifier; run it with `harbor run` and the IdeGym environment "
                        "provider")
    dockerfile = root / "environment" / "Dockerfile"
    if dockerfile.is_file():
        dockerfile_text = dockerfile.read_text(encoding="utf-8")
    elif config.docker_image:  # pulled when a registry answers, else built here when it is one of those
        dockerfile_text = f"FROM {config.docker_image}\n"
    else:
        raise TaskError(f"{root}: no environment/Dockerfile and no [environment] docker_image")
    env = dict(config.env)
    services: tuple[Service, ...] = ()
    compose = compose_file(root / "environment")
    if compose is not None:  # started beside the task's sandbox at every reset, as the provider starts them
        try:
            read = read_compose(compose, config.env)
        except ComposeError as exc:
            raise TaskError(str(exc)) from exc
        env.update(read[MAIN].environment)
        services = tuple(read.values()) if len(read) > 1 else ()
    verifier_environment = _verifier_environment(root, config, dockerfile_text, env) \
        if config.verifier_mode == "separate" else None
    entrypoint = final_entrypoint(dockerfile_text)
    user = "root" if config.verifier_user in (None, "root", "0") else "appuser"
    as_root = config.agent_user in ("root", "0") if config.agent_user is not None else runs_as_root(dockerfile_text)
    hidden = {f"tests/{p.relative_to(tests).as_posix()}": p.read_bytes() for p in iter_files(tests)
              if p.is_file() and not p.is_symlink()}
    solution = root / "solution"
    data: dict[str, Any] = {
        "id": _task_id(root.name),
        "title": (instruction_file.read_text(encoding="utf-8").strip().splitlines() or [root.name])[0][:200],
        "language": _language(config),
        "instruction": instruction_file.read_text(encoding="utf-8"),
        "environment": {"dockerfile": dockerfile_text, "context": root / "environment", "env": env,
                        "workdir": config.workdir, "entrypoint": tuple(entrypoint) if entrypoint else None,
                        "services": services},
        "test": {"script": test_stage_script(), "timeout": config.verifier_timeout, "user": user,
                 "env": config.verifier_env, "harness": "in-process", "report_glob": None,
                 "reward_file": _reward_file(tests)},
        "reward": "verifier_reward",
        "max_steps": 100,
        "grade_in_place": True,
        "verifier_environment": verifier_environment,
        "artifacts": config.artifacts,
        "run_as_root": as_root,  # Harbor's agent is [agent] user, else the image's USER
        "resources": {"cpus": config.cpus, "memory_mb": config.memory_mb, "storage_mb": config.storage_mb},
        "network": config.allow_internet,
        "agent_timeout": config.agent_timeout,
        "solution": [oracle_call(solution, config.solution_env, directory="/solution" if as_root else SOLUTION_DIR)]
        if (solution / "solve.sh").is_file() else [],
        "metadata": {"source": f"harbor:{root}", "harbor": config.metadata, "verifier_user": config.verifier_user,
                     "schema_version": config.schema_version,
                     "healthcheck": config.healthcheck.model_dump() if config.healthcheck else None},
    }
    try:
        task = Task.model_validate(data)
    except ValidationError as exc:
        raise TaskError(f"{root}: {exc}") from exc
    return task.with_grading(GradingFiles(hidden=hidden))


def _verifier_environment(root: Path, config: HarborConfig, dockerfile: str, env: dict[str, str]) -> dict[str, Any]:
    """A separate verifier's image, as Harbor chooses it: ``[verifier.environment] docker_image``,
    else ``tests/Dockerfile`` (its context ``tests/``), else the task's own environment."""
    if config.verifier_image:
        return {"dockerfile": f"FROM {config.verifier_image}\n"}
    tests = root / "tests"
    if (tests / "docker-compose.yaml").is_file():
        raise TaskError(f"{root}: tests/docker-compose.yaml: a separate verifier of several services; run it with "
                        "`harbor run` and the IdeGym environment provider")
    if (tests / "Dockerfile").is_file():
        return {"dockerfile": (tests / "Dockerfile").read_text(encoding="utf-8"), "context": tests}
    return {"dockerfile": dockerfile, "context": root / "environment", "env": env, "workdir": config.workdir}


def compose_file(environment: Path) -> Path | None:
    """The environment's compose file, as Harbor finds it: ``docker-compose.yaml``; a ``.yml``
    only when there is no Dockerfile (beside one, it is the task's content, as Harbor treats it)."""
    if (environment / "docker-compose.yaml").is_file():
        return environment / "docker-compose.yaml"
    if (environment / "docker-compose.yml").is_file() and not (environment / "Dockerfile").is_file():
        return environment / "docker-compose.yml"
    return None


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
           "shipped_tasks", "runs_as_root", "compose_file"]
