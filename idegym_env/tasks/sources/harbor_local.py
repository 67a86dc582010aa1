"""Prove a Harbor task on this machine without building its image: a bubblewrap root made of the
host's ``/usr`` (standing in for the image's packages: ``apt-get`` lines are skipped), the
Dockerfile's ``WORKDIR``/``COPY``/``RUN``/``ENV`` replayed into a scratch directory, then the oracle
(or nothing) and the verifier exactly as the test stage runs them. A stand-in for the sandbox
path, for authoring and for machines where Dockerfile images cannot be built.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..task import Task, TaskError

ROOT_BINDS = ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc")


def _bwrap(root: Path, workdir: str, command: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--dev", "/dev", "--proc", "/proc"]
    for path in ROOT_BINDS:
        if Path(path).exists():
            args += ["--ro-bind", path, path]
    for name in ("app", "logs", "tmp", "hidden", "home"):
        (root / name).mkdir(exist_ok=True)
    args += ["--bind", str(root / "tmp"), "/tmp", "--bind", str(root / "logs"), "/logs",
             "--bind", str(root / "hidden"), "/hidden",
             "--bind", str(root / "home"), "/home/appuser"]
    args += ["--bind", str(root / "app"), workdir, "--chdir", workdir, "--clearenv"]
    full_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/home/appuser", "LANG": "C.UTF-8",
                "TZ": "UTC", "IDEGYM_HIDDEN": "/hidden", **env}
    for key, value in full_env.items():
        args += ["--setenv", key, value]
    return subprocess.run(args + ["bash", "-c", command], capture_output=True, text=True, timeout=timeout)


def _replay_dockerfile(task: Task, root: Path) -> tuple[str, dict[str, str]]:
    assert task.environment is not None
    context = Path(task.environment.context) if task.environment.context else None
    workdir, env = "/", {}
    for raw in _instructions(task.environment.dockerfile):
        word, _, rest = raw.partition(" ")
        word = word.upper()
        if word == "WORKDIR":
            workdir = rest.strip()
        elif word == "ENV":
            key, _, value = rest.strip().partition("=" if "=" in rest else " ")
            env[key.strip()] = value.strip().strip('"')
        elif word == "COPY":
            parts = shlex.split(rest)
            *sources, dest = parts
            if context is None:
                raise TaskError("COPY without a build context")
            for source in sources:
                src = context / source
                target = dest if dest.startswith("/") else f"{workdir}/{dest}"
                local = _local(root, workdir, target if not target.endswith("/") else target + src.name)
                local.parent.mkdir(parents=True, exist_ok=True)
                if src.is_dir():
                    shutil.copytree(src, local, dirs_exist_ok=True)
                else:
                    shutil.copy2(src, local)
        elif word == "RUN" and "apt-get" not in rest:
            proc = _bwrap(root, workdir, rest, env, 300)
            if proc.returncode != 0:
                raise TaskError(f"RUN {rest!r} failed: {proc.stderr[-1000:]}")
    return workdir, env


def _local(root: Path, workdir: str, target: str) -> Path:
    """Where an absolute path of the image lives in the scratch root (only WORKDIR and /tmp)."""
    if target == workdir or target.startswith(workdir.rstrip("/") + "/"):
        return root / "app" / target[len(workdir):].lstrip("/")
    if target.startswith("/tmp/"):
        return root / "tmp" / target[5:]
    raise TaskError(f"the local prover only replays COPY into WORKDIR or /tmp, not {target}")


def _instructions(dockerfile: str) -> list[str]:
    out, current = [], ""
    for line in dockerfile.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        out.append((current + stripped).strip())
        current = ""
    return out


def run_locally(task: Task, *, oracle: bool, timeout: float = 600) -> tuple[float | None, str]:
    """The verifier's reward after the oracle (``oracle=True``) or after nothing, and its output."""
    environment = task.environment
    missing = [what for what, present in (
        ("the services of its compose environment", environment is not None and environment.services),
        ("its image's ENTRYPOINT", environment is not None and environment.entrypoint),
        ("its separate verifier's sandbox", task.verifier_environment is not None)) if present]
    if missing:
        raise TaskError(f"task {task.id!r}: --local cannot start {' or '.join(missing)}; validate it without --local")
    if shutil.which("bwrap") is None:
        raise TaskError("bubblewrap (bwrap) is needed to prove Harbor tasks locally")
    with tempfile.TemporaryDirectory(prefix="harbor-local-") as tmp:
        root = Path(tmp)
        (root / "app").mkdir()
        workdir, env = _replay_dockerfile(task, root)
        if oracle:
            for call in task.solution:
                proc = _bwrap(root, workdir, call.arguments.command, env, timeout)  # type: ignore[attr-defined]
                if proc.returncode != 0:
                    return None, f"the oracle failed: {proc.stdout[-1000:]}{proc.stderr[-1000:]}"
        for rel, data in task.grading.hidden.items():
            target = root / "hidden" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        assert task.test is not None and task.test.reward_file
        reward_dir = root / "logs" / Path(task.test.reward_file).parent.relative_to("/logs")
        shutil.rmtree(reward_dir, ignore_errors=True)
        reward_dir.mkdir(parents=True)
        proc = _bwrap(root, workdir, task.test.script, {**env, **task.test.env}, task.test.timeout)
        reward_path = reward_dir / Path(task.test.reward_file).name
        if not reward_path.is_file():
            return None, proc.stdout[-2000:] + proc.stderr[-2000:]
        text = reward_path.read_text().strip()
        value = json.loads(text)["reward"] if reward_path.suffix == ".json" else float(text)
        return float(value), proc.stdout[-2000:]


__all__ = ["run_locally"]
