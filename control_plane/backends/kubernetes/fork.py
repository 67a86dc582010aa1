"""Fork on Kubernetes: a GKE pod snapshot of the parent, restored into each child.

The parent's pod is checkpointed once (``PodSnapshots.take``, as the snapshot routes do), in a
group of its own (``fork-<token>``), and every child is created restoring that PodSnapshot: the
parent's state at one instant, the parent running on. The PodSnapshot stays while a child
stands on it (its pods carry the group's label) and is deleted with the last child, or when a
child's RESTART (as fresh as a new server of the image: the restore annotation is dropped)
leaves nobody on it. A fork that fails removes the children it made and its snapshot.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from kubernetes import client

from ..base import BackendError, ForkChild, SandboxHandle, SandboxSpec
from . import kube, podstate
from .manifests import SNAPSHOT_ID_LABEL
from .snapshots import PodSnapshots

log = logging.getLogger(__name__)

FORK_DATA = "fork_snapshot"  # in a child's handle data: {"name": PodSnapshot, "group": its group}
FORK_GROUP_PREFIX = "fork-"


@dataclass(frozen=True)
class KubernetesForkSite:
    """What a fork uses of the Kubernetes backend (made by ``KubernetesBackend.start``)."""

    snapshots: PodSnapshots
    core: client.CoreV1Api
    pods: Callable[[str, str], list[dict[str, Any]]]  # (namespace, server name) -> its pods, as last seen
    create: Callable[[SandboxSpec, float], Awaitable[SandboxHandle]]
    delete: Callable[[SandboxHandle], Awaitable[None]]


async def fork(site: KubernetesForkSite, ns: str, parent: SandboxHandle, children: list[ForkChild],
               timeout: float) -> list[SandboxHandle]:
    site.snapshots.require()
    pod = podstate.newest([p for p in site.pods(ns, parent.name) if podstate.is_ready(p)])
    if pod is None:
        raise BackendError(f"server {parent.name} has no ready pod to fork", 409)
    group = f"{FORK_GROUP_PREFIX}{secrets.token_hex(8)}"
    snapshot = await site.snapshots.take(ns, pod["metadata"]["name"], group)
    results = await asyncio.gather(*(site.create(replace(c.spec, snapshot_source=snapshot), timeout)
                                     for c in children), return_exceptions=True)
    made = [r for r in results if isinstance(r, SandboxHandle)]
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        await asyncio.gather(*(site.delete(h) for h in made), return_exceptions=True)
        await site.snapshots.delete_named(ns, snapshot)
        raise failed[0]
    for handle in made:
        handle.data[FORK_DATA] = {"name": snapshot, "group": group}
    return made


async def release(site: KubernetesForkSite, ns: str, fork: dict[str, Any], leaving: str) -> None:
    """``leaving`` no longer stands on the fork's snapshot: delete it when no other pod does."""
    selector = f"{SNAPSHOT_ID_LABEL}={fork['group']}"
    pods = await kube.call(site.core.list_namespaced_pod, ns, label_selector=selector)
    users = {p["metadata"]["labels"].get("app") for p in pods.get("items") or []} - {leaving}
    if not users:
        await site.snapshots.delete_named(ns, fork["name"])
