"""A task's Dockerfile environment as build-YAML entries, tagged by content.

The image of a ``TaskEnvironment`` is tagged ``idegym-env:<hash>`` where the hash covers the
Dockerfile, the build context's files (path, kind, bytes) and the sandboxes' network policy —
nothing about the task or where it lies on disk. So every task with the same Dockerfile and
context shares one image (the whole shipped SWE set does), and a control plane that has it
answers a second build request from its store ("already built") without building.

Its ``RUN`` steps get the network (``build_network``: a Dockerfile's ``apt-get install`` works,
as under Docker); its sandboxes get it only when the task allows it (``network``), so a Harbor
task with ``allow_internet = false`` installs packages at build and runs offline. A task that
also has a ``project`` gets a second, small image: the project laid over the environment image's
project directory (its final WORKDIR), tagged by the environment's tag and the project's files.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from .services import Service
from .task import Task, TaskEnvironment, hash_files

ENVIRONMENT_REPOSITORY = "idegym-env"
PROJECT_REPOSITORY = "idegym-task"


def environment_digest(environment: TaskEnvironment, *, network: bool) -> str:
    """sha256 (hex) of what the image is built from: Dockerfile, context files, network policy."""
    digest = hashlib.sha256(b"idegym-environment/1\0")
    digest.update(environment.dockerfile.encode() + b"\0")
    digest.update(b"network\0" if network else b"offline\0")
    if environment.env or environment.workdir:  # (absent: the tags images had before these existed)
        digest.update(json.dumps([sorted(environment.env.items()), environment.workdir]).encode() + b"\0")
    if environment.context is not None:
        context = Path(environment.context)
        if not context.is_dir():
            raise FileNotFoundError(f"the build context {context} is not a directory")
        hash_files(context, "context/", digest)
    return digest.hexdigest()


def environment_tag(environment: TaskEnvironment, *, network: bool) -> str:
    return f"{ENVIRONMENT_REPOSITORY}:{environment_digest(environment, network=network)[:24]}"


def environment_entry(environment: TaskEnvironment, *, network: bool, rebuild: bool = False) -> dict[str, Any]:
    """The build-YAML entry of the environment's image."""
    entry: dict[str, Any] = {"tag": environment_tag(environment, network=network),
                             "dockerfile": environment.dockerfile, "build_network": True, "network": network}
    if environment.context is not None:
        entry["context"] = str(Path(environment.context).resolve())
    if environment.env:
        entry["env"] = dict(environment.env)
    if environment.workdir:
        entry["project_dir"] = environment.workdir
    if rebuild:
        entry["rebuild"] = True
    return entry


def service_entry(service: Service, *, network: bool, rebuild: bool = False) -> dict[str, Any]:
    """The build-YAML entry of a compose service's image: its Dockerfile, else ``FROM`` its image."""
    if service.dockerfile is not None:
        built = TaskEnvironment(dockerfile=service.dockerfile, context=service.build_context)
    else:
        built = TaskEnvironment(dockerfile=f"FROM {service.image}\n")
    return environment_entry(built, network=network, rebuild=rebuild)


def project_entry(base_tag: str, project: Path, *, name: str, network: bool) -> dict[str, Any]:
    """The build-YAML entry of ``project`` laid over the image ``base_tag``."""
    digest = hashlib.sha256(f"idegym-project/1\0{base_tag}\0{int(network)}\0".encode())
    hash_files(project, "project/", digest)
    repo = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "task"  # a valid OCI path component
    return {"tag": f"{PROJECT_REPOSITORY}/{repo[:80]}:{digest.hexdigest()[:24]}", "base": base_tag,
            "project": {"path": str(Path(project).resolve())}, "network": network}


def image_entries(task: Task) -> list[dict[str, Any]]:
    """The entries to build, in order, for a task with an ``environment``; the last one's tag is
    the task's image."""
    if task.environment is None:
        raise ValueError(f"task {task.id!r} has no environment (a Dockerfile) to build")
    entries = [environment_entry(task.environment, network=task.network)]
    if task.project is not None:
        entries.append(project_entry(entries[0]["tag"], task.project, name=task.id, network=task.network))
    return entries


__all__ = ["environment_digest", "environment_tag", "environment_entry", "service_entry", "project_entry",
           "image_entries", "ENVIRONMENT_REPOSITORY", "PROJECT_REPOSITORY"]
