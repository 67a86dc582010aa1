"""Controllers of the simulated control plane: Deployments, Jobs, garbage collection, GKE pod
snapshots. Each reacts to store events and reconciles one object at a time on the loop.

Simplifications (documented in docs/kubernetes.md): a Deployment owns its pods directly (no
ReplicaSets); RollingUpdate replaces pods like Recreate without waiting; deletion propagation is
always background; a Job runs one pod at a time (``completions``/``parallelism`` 1).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import secrets
from typing import Any

from .kubelet import Kubelet
from .store import ApiError, Event, Store, now_rfc3339

DEPLOYMENTS = "deployments.apps"
JOBS = "jobs.batch"
TRIGGERS = "podsnapshotmanualtriggers.podsnapshot.gke.io"
SNAPSHOTS = "podsnapshots.podsnapshot.gke.io"


def owner_uid(obj: dict[str, Any], kind: str) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == kind and ref.get("controller"):
            return ref.get("uid")
    return None


def owner_ref(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def delete_pod(store: Store, namespace: str, name: str, grace: int = 30) -> None:
    if store.find("pods", namespace, name) is not None:
        store.mark_deleting("pods", namespace, name, grace)


class Reconciler:
    """A de-duplicating work queue of (namespace, name) keys and one worker."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self.pending: set[tuple[str, str]] = set()
        self.task = asyncio.get_running_loop().create_task(self._work())

    def enqueue(self, namespace: str, name: str) -> None:
        if (namespace, name) not in self.pending:
            self.pending.add((namespace, name))
            self.queue.put_nowait((namespace, name))

    async def _work(self) -> None:
        while True:
            key = await self.queue.get()
            self.pending.discard(key)
            try:
                self.reconcile(*key)
            except ApiError:
                pass  # a conflicting concurrent change: the next event reconciles again

    def reconcile(self, namespace: str, name: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


def _template_pod(owner: dict[str, Any], name: str, extra_labels: dict[str, str]) -> dict[str, Any]:
    template = copy.deepcopy(owner["spec"]["template"])
    meta = template.get("metadata") or {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": owner["metadata"]["namespace"],
                     "labels": {**(meta.get("labels") or {}), **extra_labels},
                     "annotations": meta.get("annotations") or {},
                     "ownerReferences": [owner_ref(owner)]},
        "spec": template["spec"],
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    }


class DeploymentController(Reconciler):
    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        store.listeners.append(self.on_event)

    def on_event(self, event: Event) -> None:
        meta = event.obj["metadata"]
        if event.resource == DEPLOYMENTS:
            self.enqueue(meta["namespace"], meta["name"])
        elif event.resource == "pods":
            for ref in meta.get("ownerReferences") or []:
                if ref.get("kind") == "Deployment":
                    self.enqueue(meta["namespace"], ref["name"])

    def reconcile(self, namespace: str, name: str) -> None:
        d = self.store.find(DEPLOYMENTS, namespace, name)
        if d is None or d["metadata"].get("deletionTimestamp"):
            return
        uid = d["metadata"]["uid"]
        template_hash = hashlib.sha256(json.dumps(d["spec"]["template"], sort_keys=True).encode()).hexdigest()[:10]
        pods = [p for p in self.store.list("pods", namespace) if owner_uid(p, "Deployment") == uid]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        current = [p for p in live if p["metadata"]["labels"].get("pod-template-hash") == template_hash]
        old = [p for p in live if p not in current]
        replicas = d["spec"].get("replicas", 1)
        recreate = (d["spec"].get("strategy") or {}).get("type") == "Recreate"
        for pod in old:
            delete_pod(self.store, namespace, pod["metadata"]["name"])
        terminating = len(pods) - len(live) + len(old)
        if not (recreate and terminating):
            for _ in range(replicas - len(current)):
                pod_name = f"{name}-{template_hash}-{secrets.token_hex(3)[:5]}"
                current.append(self.store.create("pods", namespace, _template_pod(
                    d, pod_name, {"pod-template-hash": template_hash})))
            for pod in sorted(current, key=lambda p: p["metadata"]["creationTimestamp"])[replicas:]:
                delete_pod(self.store, namespace, pod["metadata"]["name"])
                current.remove(pod)
        ready = sum(1 for p in current if pod_ready(p))
        status = {
            "observedGeneration": d["metadata"].get("generation", 1),
            "replicas": len(live),
            "updatedReplicas": len(current),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": max(replicas - ready, 0),
            "conditions": [
                {"type": "Available", "status": "True" if ready >= replicas else "False",
                 "reason": "MinimumReplicasAvailable" if ready >= replicas else "MinimumReplicasUnavailable"},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"
                 if ready >= replicas else "ReplicaSetUpdated"},
            ],
        }
        if not ready:
            status.pop("readyReplicas")
            status.pop("availableReplicas")
        self.store.set_status(DEPLOYMENTS, namespace, name, status)


class JobController(Reconciler):
    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        store.listeners.append(self.on_event)

    def on_event(self, event: Event) -> None:
        meta = event.obj["metadata"]
        if event.resource == JOBS and event.type != "DELETED":
            self.enqueue(meta["namespace"], meta["name"])
        elif event.resource == "pods":
            for ref in meta.get("ownerReferences") or []:
                if ref.get("kind") == "Job":
                    self.enqueue(meta["namespace"], ref["name"])

    def reconcile(self, namespace: str, name: str) -> None:
        job = self.store.find(JOBS, namespace, name)
        if job is None:
            return
        status = copy.deepcopy(job.get("status") or {})
        if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in status.get("conditions") or []):
            return
        uid = job["metadata"]["uid"]
        pods = [p for p in self.store.list("pods", namespace) if owner_uid(p, "Job") == uid]
        phases = [(p.get("status") or {}).get("phase") for p in pods]
        succeeded, failed = phases.count("Succeeded"), phases.count("Failed")
        active = [p for p, ph in zip(pods, phases, strict=True) if ph not in ("Succeeded", "Failed")
                  and not p["metadata"].get("deletionTimestamp")]
        status.setdefault("startTime", now_rfc3339())
        now = now_rfc3339()
        if succeeded >= 1:
            status["conditions"] = [
                {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now},
                {"type": "Complete", "status": "True", "lastTransitionTime": now}]
            status["completionTime"] = now
            self._ttl(job)
        elif failed > job["spec"].get("backoffLimit", 6):
            status["conditions"] = [
                {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
                 "lastTransitionTime": now},
                {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                 "message": "Job has reached the specified backoff limit", "lastTransitionTime": now}]
            for pod in active:
                delete_pod(self.store, namespace, pod["metadata"]["name"])
            active = []
            self._ttl(job)
        elif not active:
            labels = {"batch.kubernetes.io/job-name": name, "job-name": name,
                      "batch.kubernetes.io/controller-uid": uid, "controller-uid": uid}
            active.append(self.store.create("pods", namespace, _template_pod(
                job, f"{name}-{secrets.token_hex(3)[:5]}", labels)))
        status.update(active=len(active), succeeded=succeeded, failed=failed,
                      ready=sum(1 for p in active if pod_ready(p)))
        for key in ("active", "succeeded", "failed"):
            if not status[key]:
                status.pop(key)
        self.store.set_status(JOBS, namespace, name, status)

    def _ttl(self, job: dict[str, Any]) -> None:
        ttl = job["spec"].get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        ns, name, uid = job["metadata"]["namespace"], job["metadata"]["name"], job["metadata"]["uid"]

        def expire() -> None:
            current = self.store.find(JOBS, ns, name)
            if current is not None and current["metadata"]["uid"] == uid:
                self.store.remove(JOBS, ns, name)

        asyncio.get_running_loop().call_later(ttl, expire)


class GarbageCollector:
    """Background cascading deletion through ownerReferences."""

    def __init__(self, store: Store) -> None:
        self.store = store
        store.listeners.append(self.on_event)

    def on_event(self, event: Event) -> None:
        if event.type != "DELETED":
            return
        uid = event.obj["metadata"]["uid"]
        for resource, namespace, name in self.store.owned_by(uid):
            if resource == "pods":
                delete_pod(self.store, namespace, name)
            elif self.store.find(resource, namespace, name) is not None:
                self.store.remove(resource, namespace, name)


class SnapshotController:
    """GKE's pod snapshot controller, as far as it can be shown: a PodSnapshotManualTrigger
    checkpoints its target pod's project directory into a new PodSnapshot (labels copied from the
    pod, ``Ready`` condition), and the trigger reports ``Triggered``/``Complete`` with
    ``status.snapshotCreated.name``. Memory, processes and GKE's storage config are not modelled."""

    def __init__(self, store: Store, kubelet: Kubelet) -> None:
        self.store = store
        self.kubelet = kubelet
        store.listeners.append(self.on_event)

    def on_event(self, event: Event) -> None:
        meta = event.obj["metadata"]
        if event.resource == TRIGGERS and event.type == "ADDED":
            # processed a moment later, so a watcher sees ADDED (no status) then MODIFIED
            asyncio.get_running_loop().call_later(0.05, self.process, meta["namespace"], meta["name"])
        elif event.resource == SNAPSHOTS and event.type == "DELETED":
            import shutil

            shutil.rmtree(self.kubelet.snapshot_dir(meta["namespace"], meta["name"]), ignore_errors=True)

    def process(self, namespace: str, name: str) -> None:
        trigger = self.store.find(TRIGGERS, namespace, name)
        if trigger is None:
            return
        target = (trigger.get("spec") or {}).get("targetPod", "")
        snapshot = f"{target[:40]}-{secrets.token_hex(4)}"
        now = now_rfc3339()
        error = self.kubelet.checkpoint(namespace, target, snapshot)
        if error:
            self.store.set_status(TRIGGERS, namespace, name, {"conditions": [
                {"type": "Triggered", "status": "False", "reason": "Failed", "message": error,
                 "lastTransitionTime": now}]})
            return
        pod = self.store.find("pods", namespace, target) or {"metadata": {}}
        self.store.create(SNAPSHOTS, namespace, {
            "apiVersion": "podsnapshot.gke.io/v1", "kind": "PodSnapshot",
            "metadata": {"name": snapshot, "namespace": namespace,
                         "labels": dict(pod["metadata"].get("labels") or {}),
                         "annotations": {"podsnapshot.gke.io/origin-pod": target}},
            "spec": {"source": {"podName": target}},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                                       "lastTransitionTime": now}]},
        })
        self.store.set_status(TRIGGERS, namespace, name, {
            "conditions": [{"type": "Triggered", "status": "True", "reason": "Complete", "lastTransitionTime": now}],
            "snapshotCreated": {"name": snapshot},
        })
