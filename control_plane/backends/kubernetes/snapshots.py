"""GKE pod snapshots through their custom resources.

Resources (group ``podsnapshot.gke.io``, version ``v1``, as GKE's pod-snapshot reference and the
kubernetes-sigs/agent-sandbox GKE extension use them):

* ``podsnapshotmanualtriggers`` (kind ``PodSnapshotManualTrigger``): ``spec.targetPod`` names the
  pod to checkpoint; GKE reports ``status.conditions[type=Triggered]`` (``True``/``Complete`` or
  ``False``/``Failed|Error``) and the created snapshot in ``status.snapshotCreated.name``.
* ``podsnapshots`` (kind ``PodSnapshot``): the snapshot itself, ``Ready`` condition when usable.
* A pod annotated ``podsnapshot.gke.io/ps-name: <PodSnapshot name>`` is restored from it.

The cluster administrator creates the PodSnapshotStorageConfig and a PodSnapshotPolicy with a
manual trigger selecting ``app.kubernetes.io/part-of: idegym`` pods (docs/kubernetes.md).

IdeGym's ``SnapshotRef`` semantics on top: a snapshot belongs to a *group*, the id of the server
it was taken from; we label every PodSnapshot we trigger with ``idegym.jetbrains.com/snapshot-id
=<group>``. Restoring ``{id, tag}`` uses that exact PodSnapshot; ``{id}`` alone resolves, here,
to the newest Ready PodSnapshot of the group, which is then named in the annotation - so the
restored state never depends on how GKE would pick among candidates.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ..base import BackendError, SnapshotsUnsupported
from . import kube
from .manifests import PART_OF, SNAPSHOT_ID_LABEL, ManifestSettings, managed_labels

GROUP = "podsnapshot.gke.io"
VERSION = "v1"
SNAPSHOTS = "podsnapshots"
TRIGGERS = "podsnapshotmanualtriggers"
TAKEN_AT = "idegym.jetbrains.com/taken-at"


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})


def _taken_at(snapshot: dict[str, Any]) -> tuple[str, float]:
    meta = snapshot["metadata"]
    return meta.get("creationTimestamp", ""), float((meta.get("annotations") or {}).get(TAKEN_AT, 0))


def is_ready(snapshot: dict[str, Any]) -> bool:
    return _condition(snapshot, "Ready").get("status") == "True"


class PodSnapshots:
    def __init__(self, api: client.ApiClient, settings: ManifestSettings, *, enabled: bool,
                 timeout: float = 120.0) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.apis = client.ApisApi(api)
        self.settings = settings
        self.enabled = enabled
        self.timeout = timeout
        self.available = False
        self.why_not = "pod snapshots are disabled in the control plane's configuration (snapshots=false)"

    async def probe(self) -> bool:
        """Whether the cluster serves the pod-snapshot API; remembers why not."""
        if not self.enabled:
            self.available = False
            return False
        try:
            groups = await kube.call(self.apis.get_api_versions)
        except ApiException as exc:
            self.available, self.why_not = False, f"cannot read the cluster's API groups: {kube.error_text(exc)}"
            return False
        versions = {v.get("version") for g in groups.get("groups") or [] if g.get("name") == GROUP
                    for v in g.get("versions") or []}
        self.available = VERSION in versions
        if not self.available:
            self.why_not = (f"the cluster does not serve {GROUP}/{VERSION} (GKE pod snapshots are not enabled "
                            "on this cluster)")
        return self.available

    def require(self) -> None:
        if not self.available:
            raise SnapshotsUnsupported(f"Pod snapshot feature is not enabled: {self.why_not}")

    # -- taking --

    async def take(self, namespace: str, pod_name: str, group: str) -> str:
        """Checkpoint ``pod_name``; return the PodSnapshot's name once it is Ready."""
        self.require()
        trigger_name = f"idegym-{pod_name[:40]}-{secrets.token_hex(4)}".rstrip("-")
        labels = {**managed_labels(trigger_name, self.settings, component="snapshot"), SNAPSHOT_ID_LABEL: group}
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PodSnapshotManualTrigger",
                "metadata": {"name": trigger_name, "namespace": namespace, "labels": labels},
                "spec": {"targetPod": pod_name}}
        try:
            created = await kube.call(self.custom.create_namespaced_custom_object, GROUP, VERSION, namespace,
                                      TRIGGERS, body)
        except ApiException as exc:
            raise BackendError(f"could not create a PodSnapshotManualTrigger for pod {pod_name}: "
                               f"{kube.error_text(exc)}", 403 if exc.status == 403 else 500) from exc
        try:
            name = await self._wait_triggered(namespace, trigger_name, created["metadata"]["resourceVersion"])
            # our own group label, so SnapshotRef{id} finds it whatever labels GKE copies
            # (and a precise time: creationTimestamp has whole seconds, too coarse to find the newest)
            await kube.call(self.custom.patch_namespaced_custom_object, GROUP, VERSION, namespace, SNAPSHOTS, name,
                            {"metadata": {"labels": {SNAPSHOT_ID_LABEL: group, "app.kubernetes.io/part-of": PART_OF},
                                          "annotations": {TAKEN_AT: f"{time.time():.6f}"}}})
            await self._wait_ready(namespace, name)
            return name
        finally:
            await kube.delete_quietly(self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace,
                                      TRIGGERS, trigger_name)

    async def _wait_triggered(self, namespace: str, trigger: str, rv: str) -> str:
        def check(kind: str, obj: dict[str, Any]) -> tuple[str, str] | None:
            if kind == "DELETED":
                return ("error", f"trigger {trigger} was deleted before it completed")
            cond = _condition(obj, "Triggered")
            if cond.get("status") == "True" and cond.get("reason") == "Complete":
                name = ((obj.get("status") or {}).get("snapshotCreated") or {}).get("name")
                return ("ok", name) if name else ("error", "completed without naming the snapshot")
            if cond.get("status") == "False" and cond.get("reason") in ("Failed", "Error"):
                return ("error", cond.get("message") or cond["reason"])
            return None

        result = await asyncio.to_thread(
            kube.watch_until, self.custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, TRIGGERS),
            {"field_selector": f"metadata.name={trigger}", "resource_version": rv}, check, self.timeout)
        if result is None:
            raise BackendError(f"pod snapshot {trigger} did not complete within {self.timeout:g}s")
        if result[0] == "error":
            raise BackendError(f"pod snapshot {trigger} failed: {result[1]}")
        return result[1]

    async def _wait_ready(self, namespace: str, name: str) -> None:
        result = await asyncio.to_thread(
            kube.watch_until, self.custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, SNAPSHOTS),
            {"field_selector": f"metadata.name={name}"},
            lambda kind, obj: True if kind != "DELETED" and is_ready(obj) else None, self.timeout)
        if result is None:
            raise BackendError(f"PodSnapshot {name} was not Ready within {self.timeout:g}s")

    # -- finding, restoring, deleting --

    async def in_group(self, namespace: str, group: str) -> list[dict[str, Any]]:
        data = await kube.call(self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, SNAPSHOTS,
                               label_selector=f"{SNAPSHOT_ID_LABEL}={group}")
        return sorted(data.get("items") or [], key=_taken_at)

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await kube.call_or_none(self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace,
                                       SNAPSHOTS, name)

    async def resolve(self, namespace: str, group: str | None, tag: str | None) -> tuple[str, str | None]:
        """``(PodSnapshot name, its group)`` that a ``SnapshotRef{id: group, tag}`` restores: the
        named one, else the newest Ready one of the group. 404 when there is none."""
        self.require()
        if tag:
            snapshot = await self.get(namespace, tag)
            if snapshot is None:
                raise BackendError(f"pod snapshot {tag!r} not found in namespace {namespace}", 404)
            if not is_ready(snapshot):
                raise BackendError(f"pod snapshot {tag!r} is not Ready yet", 409)
            labels = snapshot["metadata"].get("labels") or {}
            return tag, group or labels.get(SNAPSHOT_ID_LABEL)
        if not group:
            raise BackendError("a snapshot reference needs a group id or a tag", 422)
        ready = [s for s in await self.in_group(namespace, group) if is_ready(s)]
        if not ready:
            raise BackendError(f"no Ready pod snapshot in group {group!r}", 404)
        return ready[-1]["metadata"]["name"], group

    async def exists(self, namespace: str, snapshot_id: str) -> bool:
        """A Ready snapshot named ``snapshot_id``, or in group ``snapshot_id``."""
        if not self.available:
            return False
        named = await self.get(namespace, snapshot_id)
        if named is not None and is_ready(named):
            return True
        return any(is_ready(s) for s in await self.in_group(namespace, snapshot_id))

    async def delete_named(self, namespace: str, name: str) -> None:
        """Delete the one PodSnapshot ``name`` (a fork's), whether or not snapshots are available now."""
        await kube.delete_quietly(self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, SNAPSHOTS,
                                  name)

    async def delete(self, namespace: str, snapshot_id: str) -> None:
        """Delete the snapshot named ``snapshot_id``, or every snapshot of that group."""
        if not self.available:
            return
        names = {s["metadata"]["name"] for s in await self.in_group(namespace, snapshot_id)}
        if await self.get(namespace, snapshot_id) is not None:
            names.add(snapshot_id)
        for name in names:
            await kube.delete_quietly(self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace,
                                      SNAPSHOTS, name)
