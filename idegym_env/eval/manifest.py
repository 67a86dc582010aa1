"""What a run is: the tasks (and their content hash), the agent, attempts and seeds, versions.

``<out>/manifest.json`` is written when a run starts. Re-running into the same directory resumes
it only if the run's *identity* — task-set hash, agent spec and arguments, attempts, seed, step
limit and pass criterion — is the same; otherwise :class:`ManifestMismatch` says what differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import IdeGymError
from ..tasks import BUNDLED_DIR, Task, TaskError, TaskSet, load_task
from ..tasks.task import TASK_FILE, hash_files
from ..urls import without_credentials

MANIFEST_VERSION = 1
IDENTITY = ("task_set_hash", "agent", "agent_args", "attempts", "seed", "max_steps", "pass_criterion")
SECRET_WORDS = ("key", "token", "secret", "password", "auth")


class ManifestMismatch(IdeGymError, RuntimeError):
    """The output directory holds a different run."""


# -- tasks ------------------------------------------------------------------------------------------


def resolve_tasks(spec: str | Path | Task | TaskSet | Iterable[str | Path | Task]) -> list[Task]:
    """Tasks from ``spec``: ``"bundled"``, a directory of task directories, one task directory (or
    its task.yaml), a bundled task id, a comma-separated list of these, a TaskSet, a Task, or a list.

    Ordered by id, without duplicates (the same id twice with different content is an error).
    """
    found: list[Task] = []
    if isinstance(spec, TaskSet):
        found = list(spec)
    elif isinstance(spec, Task):
        found = [spec]
    elif isinstance(spec, (str, Path)):
        for part in (str(spec).split(",") if isinstance(spec, str) else [spec]):
            part_s = str(part).strip()
            if not part_s:
                continue
            if part_s == "bundled":
                found.extend(TaskSet(BUNDLED_DIR))
                continue
            from ..tasks.sources import is_source_spec, load_source_tasks

            if is_source_spec(part_s):  # humaneval, swe:<file>, harbor:<dir>, or one of their tasks
                found.extend(load_source_tasks(part_s))
                continue
            path = Path(part_s)
            if path.is_dir() and not (path / TASK_FILE).is_file():
                found.extend(TaskSet(path))
            else:
                found.append(load_task(part_s))
    else:
        for item in spec:
            found.extend(resolve_tasks(item))
    by_id: dict[str, Task] = {}
    for task in found:
        other = by_id.get(task.id)
        if other is not None and other.content_hash() != task.content_hash():
            raise TaskError(f"two different tasks have the id {task.id!r} ({other.root} and {task.root})")
        by_id[task.id] = task
    if not by_id:
        raise TaskError(f"no tasks in {spec!r}")
    return [by_id[k] for k in sorted(by_id)]


def task_set_hash(tasks: Sequence[Task]) -> str:
    """sha256 over every task's files, in id order — equal to ``TaskSet.content_hash`` when the
    tasks are a whole task-set directory. A task built in code contributes its ``content_hash()``."""
    digest = hashlib.sha256()
    for task in sorted(tasks, key=lambda t: t.id):
        if task.root is not None:
            hash_files(task.root, f"{task.id}/", digest)
        else:
            digest.update(f"{task.id}/:{task.content_hash()}\0".encode())
    return digest.hexdigest()


def image_of(task: Task) -> str:
    """The sandbox image an episode of ``task`` runs in (content-addressed for project tasks)."""
    from ..env import task_image_tag

    return task.image or task_image_tag(task)


# -- versions and machine ------------------------------------------------------------------------


def idegym_version() -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        from importlib.metadata import version

        out["version"] = version("idegym")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        from .. import __version__

        out["version"] = __version__
    root = Path(__file__).resolve().parents[2]
    if (root / ".git").exists():
        try:
            commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                    text=True, timeout=10).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            if commit:
                out["git_commit"] = commit
                out["git_dirty"] = bool(dirty)
        except (OSError, subprocess.SubprocessError):
            pass
    return out


def machine() -> dict[str, Any]:
    return {"hostname": socket.gethostname(), "platform": platform.platform(),
            "python": sys.version.split()[0], "cpus": os.cpu_count()}


def redact(args: Mapping[str, Any]) -> dict[str, Any]:
    """Agent arguments as recorded: values of secret-looking keys are replaced."""
    return {k: ("<redacted>" if any(w in k.lower() for w in SECRET_WORDS) else v) for k, v in args.items()}


# -- the manifest -----------------------------------------------------------------------------------


def build_manifest(
    tasks: Sequence[Task], *, agent: str, agent_args: Mapping[str, Any], attempts: int, seed: int,
    max_steps: int | None, parallel: int, executor: str, episode_timeout: float,
    control_plane: str, pass_threshold: float | None, agent_source: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "task_set_hash": task_set_hash(tasks),
        "agent": agent,
        "agent_args": redact(agent_args),
        "agent_source": dict(agent_source) if agent_source else None,
        "attempts": attempts,
        "seed": seed,
        "max_steps": max_steps,
        "tasks": [{"id": t.id, "content_hash": t.content_hash(), "image": image_of(t), "language": t.language,
                   "max_steps": max_steps or t.max_steps, "source": str(t.root) if t.root else None}
                  for t in tasks],
        "started_at": now(),
        "idegym": idegym_version(),
        "machine": machine(),
        "parallel": parallel,
        "executor": executor,
        "episode_timeout": episode_timeout,
        "control_plane": without_credentials(control_plane),
        "pass_criterion": ("solved" if pass_threshold is None else f"reward >= {pass_threshold:g}"),
        "resumed_at": [],
    }
    # As it will read back from disk (tuples become lists...), so that comparisons are fair.
    return json.loads(json.dumps(manifest, default=str))


def check_same_run(old: Mapping[str, Any], new: Mapping[str, Any], out: Path) -> None:
    """Raise :class:`ManifestMismatch` unless ``old`` and ``new`` describe the same run."""
    diffs = []
    for key in IDENTITY:
        if old.get(key) != new.get(key):
            diffs.append(f"{key}: {json.dumps(old.get(key))} there, {json.dumps(new.get(key))} now")
    if diffs:
        raise ManifestMismatch(
            f"{out} holds the results of a different run, so they cannot be resumed or mixed:\n  "
            + "\n  ".join(diffs)
            + "\nUse another --out directory, or --overwrite to discard those results.")


def episode_seed(seed: int, task_id: str, attempt: int) -> int:
    """The seed of one episode: fixed by the run seed, the task and the attempt (order-independent)."""
    data = hashlib.sha256(f"{seed}/{task_id}/{attempt}".encode()).digest()
    return int.from_bytes(data[:4], "big")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


__all__ = ["resolve_tasks", "task_set_hash", "image_of", "build_manifest", "check_same_run", "episode_seed",
           "ManifestMismatch", "redact", "idegym_version", "machine"]
