"""``KubernetesBackend``: every server of the control plane as objects on a cluster.

One server = Deployment (or bare Pod) + Service + PodDisruptionBudget from ``manifests``; its
readiness, restarts and failure reasons are read from the pod (``podstate``) through a pod
informer; addressing is chosen by configuration:

* ``service-dns`` - ``http://<name>.<ns>.svc.<domain>:<service_port>``; the control plane runs
  in the cluster (the default there).
* ``api-proxy`` - through the API server's service proxy, via a loopback relay that adds the
  kubeconfig's credentials (the default outside a cluster: a laptop with a kubeconfig).
* ``pod-ip`` - ``http://<podIP>:<container_port>``; outside a cluster this needs a route to the
  pod network (VPC-native clusters, a VPN).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ..base import (
    Backend,
    BackendError,
    Capabilities,
    ForkChild,
    ImageNotFound,
    Observation,
    SandboxAddress,
    SandboxHandle,
    SandboxSpec,
    SnapshotInfo,
)
from ..config import KubernetesBackendConfig
from . import fork, kube, podstate
from .api_client import load_api_client
from .builds import KubernetesImageBuilder
from .informer import PodInformer
from .manifests import (
    RESTARTED_AT,
    RESTORE_ANNOTATION,
    SNAPSHOT_ID_LABEL,
    api_version_label,
    build_node_holder,
    build_server_manifests,
    instance_selector,
    node_holder_name,
)
from .relay import ApiProxyRelay
from .snapshots import PodSnapshots

log = logging.getLogger(__name__)
USER_AGENT = f"idegym-control-plane/{api_version_label()}"
BACKGROUND = {"propagationPolicy": "Background"}


class KubernetesBackend(Backend):
    """``KubernetesBackend(config)``, or ``KubernetesBackend(namespace=..., addressing=...)`` with
    ``KubernetesBackendConfig`` fields as keywords (unset fields from ``IDEGYM_K8S_*``)."""

    name = "kubernetes"

    def __init__(self, config: KubernetesBackendConfig | None = None, api_client: client.ApiClient | None = None,
                 **settings: Any) -> None:
        if config is not None and settings:
            raise TypeError("pass a KubernetesBackendConfig or keyword settings, not both")
        self.config = config or KubernetesBackendConfig.from_env(**settings)
        self.addressing = self.config.resolved_addressing()
        self.settings = self.config.manifest_settings()
        self._api = api_client
        self.api: client.ApiClient | None = None  # set by start(): given, or made from the configuration
        self.informers: dict[str, PodInformer] = {}
        self.relay: ApiProxyRelay | None = None
        self.builder = KubernetesImageBuilder(self)

    @property
    def capabilities(self) -> Capabilities:
        # Kubernetes restarts a server in place (a rollout of its Deployment, same name and
        # Service). Pods carry per-request labels, annotations, volumes, node selectors and
        # overrides, which a pre-started pod cannot know: no warm pool. Snapshots and fork need
        # GKE pod snapshots, known once start() probed for them.
        snapshots = self.api is not None and self.snapshots.available  # start() sets both at once
        return Capabilities(snapshots=snapshots, fork=snapshots, warm_pool=False, restart_in_place=True,
                            node_reservation=True)

    def image_builder(self) -> KubernetesImageBuilder:
        """Builds run as Jobs in this backend's namespace."""
        return self.builder

    # -- lifecycle --

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (self.config.namespace, *[n for n in self.config.extra_namespaces if n != self.config.namespace])

    async def start(self) -> None:
        api = self._api if self._api is not None else await asyncio.to_thread(load_api_client, self.config)
        self.api = api
        api.user_agent = USER_AGENT  # the control plane, recognizable in audit logs
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.policy = client.PolicyV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.snapshots = PodSnapshots(api, self.settings, enabled=self.config.snapshots,
                                      timeout=self.config.snapshot_timeout)
        self.forks = fork.KubernetesForkSite(snapshots=self.snapshots, core=self.core, pods=self._pods,
                                             create=self.create, delete=self.delete)
        for ns in self.namespaces:
            informer = PodInformer(self.core, ns, instance_selector(self.settings))
            informer.start()
            self.informers[ns] = informer
        for ns, informer in self.informers.items():
            if not await informer.wait_synced(15):
                await self.close()
                raise BackendError(f"cannot list pods in namespace {ns!r} on {api.configuration.host}: "
                                   f"{informer.last_error or 'no answer'}")
        if self.addressing == "api-proxy":
            self.relay = ApiProxyRelay(api.configuration, set(self.namespaces), USER_AGENT)
            await self.relay.start()
        await self.snapshots.probe()
        log.info("kubernetes backend on %s, namespaces %s, addressing %s, snapshots %s",
                 api.configuration.host, ",".join(self.namespaces), self.addressing,
                 "on" if self.snapshots.available else f"off ({self.snapshots.why_not})")

    async def close(self) -> None:
        informers, self.informers = list(self.informers.values()), {}
        await asyncio.gather(*(asyncio.to_thread(i.stop) for i in informers))
        if self.relay is not None:
            await self.relay.close()
            self.relay = None
        if self._api is None and self.api is not None:
            await asyncio.to_thread(self.api.close)

    # -- helpers --

    def _namespace(self, requested: str) -> str:
        return requested if requested in self.namespaces else self.config.namespace

    def _informer(self, ns: str) -> PodInformer:
        informer = self.informers.get(ns)
        if informer is None:
            raise BackendError(f"namespace {ns!r} is not managed by this backend (namespaces: "
                               f"{', '.join(self.namespaces)})", 400)
        return informer

    def _pods(self, ns: str, name: str, exclude: Collection[str] = ()) -> list[dict[str, Any]]:
        return [p for p in self._informer(ns).pods(name) if p["metadata"]["name"] not in exclude]

    def _handle(self, spec: SandboxSpec, ns: str, kind: str) -> SandboxHandle:
        data = {"namespace": ns, "kind": kind, "service_port": spec.service_port,
                "container_port": spec.container_port, "server_id": spec.server_id, "image": spec.image_tag}
        handle = SandboxHandle(self.name, spec.generated_name, SandboxAddress(""), data)
        handle.endpoint = self.endpoint(handle)
        return handle

    @staticmethod
    def _api_error(action: str, exc: ApiException) -> BackendError:
        status = exc.status if exc.status in (400, 403, 404, 409, 422) else 500
        return BackendError(f"{action}: {kube.error_text(exc)}", status)

    async def _warning_event(self, ns: str, pod_name: str) -> str | None:
        with contextlib.suppress(ApiException):
            data = await kube.call(self.core.list_namespaced_event, ns,
                                   field_selector=f"involvedObject.name={pod_name}")
            warnings = [e for e in data.get("items") or [] if e.get("type") == "Warning"]
            if warnings:
                last = max(warnings, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
                return f"{last.get('reason')}: {last.get('message')}"
        return None

    # -- create / wait --

    async def create(self, spec: SandboxSpec, timeout: float, *, background: bool = False) -> SandboxHandle:
        if spec.network_peer is not None:
            raise BackendError("network_of (joining another sandbox's network) is a local-backend feature; on "
                               "Kubernetes run a task's services as containers of one pod", 400)
        ns = self._namespace(spec.namespace)
        started = time.monotonic()
        ref = spec.request.snapshot if spec.request is not None else None
        restore = group = None
        if spec.snapshot_source:  # one snapshot, already chosen by the control plane
            restore, group = await self.snapshots.resolve(ns, ref.id if ref else None, spec.snapshot_source)
        elif ref is not None:  # SnapshotRef semantics: the tag, else the newest of the group
            restore, group = await self.snapshots.resolve(ns, ref.id, ref.tag)
        service_account = self.config.snapshot_service_account if restore else None
        try:
            manifests = build_server_manifests(spec, self.settings, namespace=ns, restore_snapshot=restore,
                                               snapshot_group=group, service_account=service_account)
        except ValueError as exc:  # includes pydantic's ValidationError
            raise BackendError(str(exc), 422) from exc
        name, kind = spec.generated_name, manifests.kind
        try:
            if kind == "Deployment":
                workload = await kube.call(self.apps.create_namespaced_deployment, ns, manifests.workload)
            else:
                workload = await kube.call(self.core.create_namespaced_pod, ns, manifests.workload)
        except ApiException as exc:
            raise self._api_error(f"cannot create {kind} {ns}/{name}", exc) from exc
        try:
            owned = build_server_manifests(spec, self.settings, namespace=ns, restore_snapshot=restore,
                                           snapshot_group=group, service_account=service_account, owner=workload)
            await kube.call(self.core.create_namespaced_service, ns, owned.service)
            if owned.pdb is not None:
                await kube.call(self.policy.create_namespaced_pod_disruption_budget, ns, owned.pdb)
            await self._wait_ready(ns, name, spec.image_tag, spec.max_restarts,
                                   timeout - (time.monotonic() - started), budget=timeout)
        except BaseException as exc:
            # a failed create leaves nothing behind; shielded so a cancelled start still cleans up
            with contextlib.suppress(Exception):
                await asyncio.shield(self._remove(ns, name, kind, wait=True))
            if isinstance(exc, ApiException):
                raise self._api_error(f"cannot create server {ns}/{name}", exc) from exc
            raise
        return self._handle(spec, ns, kind)

    async def _wait_ready(self, ns: str, name: str, image: str, max_restarts: int, timeout: float,
                          exclude: Collection[str] = (), budget: float | None = None) -> dict[str, Any]:
        """Until a pod of ``name`` (not in ``exclude``) is Ready; fail early when waiting cannot
        help (image not found, crashed more than ``max_restarts``, unschedulable too long)."""
        informer = self._informer(ns)
        unschedulable_since: dict[str, float] = {}

        def check() -> tuple[str, dict[str, Any], podstate.Verdict | None] | None:
            pods = [p for p in self._pods(ns, name, exclude) if not podstate.is_terminating(p)]
            for pod in pods:
                if podstate.is_ready(pod):
                    return ("ready", pod, None)
            for pod in pods:
                verdict = podstate.diagnose(pod, max_restarts)
                if verdict is None:
                    continue
                if verdict.fatal:
                    return ("fatal", pod, verdict)
                if verdict.reason == "Unschedulable":
                    since = unschedulable_since.setdefault(pod["metadata"]["uid"], time.monotonic())
                    if time.monotonic() - since > self.config.unschedulable_timeout:
                        return ("fatal", pod, verdict)
            return None

        result = await informer.wait_for(check, max(timeout, 0.0), app=name)
        if result is not None and result[0] == "ready":
            return result[1]
        if result is None:
            pod = podstate.newest([p for p in self._pods(ns, name, exclude)])
            verdict = podstate.diagnose(pod, max_restarts) if pod is not None else None
        else:
            _, pod, verdict = result
        detail = verdict.text() if verdict else "no pod was created for it"
        if pod is not None and (verdict is None or verdict.reason in ("ContainersNotReady", "NotReady")):
            event = await self._warning_event(ns, pod["metadata"]["name"])
            if event:
                detail += f" (last event: {event})"
        if verdict is not None and verdict.image_missing:
            raise ImageNotFound(f"image {image} not found: {detail}")
        if result is None:
            raise BackendError(f"server {name} was not ready within {budget or max(timeout, 0):g}s: {detail}")
        raise BackendError(f"server {name} cannot start: {detail}")

    # -- delete / observe / restart --

    async def _remove(self, ns: str, name: str, kind: str | None, wait: bool) -> None:
        """Delete the server's objects (only ours: name and instance label checked by selector)."""
        kinds = [kind] if kind else ["Deployment", "Pod"]
        for k in kinds:
            if k == "Deployment":
                await kube.delete_quietly(self.apps.delete_namespaced_deployment, name, ns, body=BACKGROUND)
            else:
                await kube.delete_quietly(self.core.delete_namespaced_pod, name, ns, body=BACKGROUND)
        await kube.delete_quietly(self.core.delete_namespaced_service, name, ns, body=BACKGROUND)
        await kube.delete_quietly(self.policy.delete_namespaced_pod_disruption_budget, name, ns, body=BACKGROUND)
        if not wait:
            return
        informer = self._informer(ns)
        gone = await informer.wait_for(lambda: True if not informer.pods(name) else None,
                                       self.config.delete_timeout, app=name)
        if gone is None:
            left = ", ".join(p["metadata"]["name"] for p in informer.pods(name))
            raise BackendError(
                f"pods of {ns}/{name} still exist {self.config.delete_timeout:g}s after deletion: {left}")

    async def delete(self, handle: SandboxHandle) -> None:
        ns = handle.data.get("namespace", self.config.namespace)
        try:
            await self._remove(ns, handle.name, handle.data.get("kind"), wait=True)
            if handle.data.get(fork.FORK_DATA):  # a fork's child: its snapshot goes with the last of them
                await fork.release(self.forks, ns, handle.data[fork.FORK_DATA], handle.name)
        except ApiException as exc:
            raise self._api_error(f"cannot delete server {ns}/{handle.name}", exc) from exc

    async def observe(self, handle: SandboxHandle) -> Observation:
        ns = handle.data.get("namespace", self.config.namespace)
        pods = self._pods(ns, handle.name)
        if pods:
            return podstate.observe(pods, True)
        read = self.apps.read_namespaced_deployment if handle.data.get("kind", "Deployment") == "Deployment" \
            else self.core.read_namespaced_pod
        try:
            exists = await kube.call_or_none(read, handle.name, ns) is not None
        except ApiException as exc:
            raise self._api_error(f"cannot read server {ns}/{handle.name}", exc) from exc
        return podstate.observe([], exists)

    async def restart(self, handle: SandboxHandle, spec: SandboxSpec, timeout: float) -> SandboxHandle:
        """A fresh pod from the same template (``kubectl rollout restart``; the Recreate strategy
        removes the old pod first). A bare Pod is deleted and created again."""
        ns = handle.data.get("namespace", self.config.namespace)
        if handle.data.get("kind") == "Pod":
            await self.delete(handle)
            return await self.create(spec, timeout)
        old = {p["metadata"]["name"] for p in self._pods(ns, handle.name)}
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        patch: dict[str, Any] = {"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: stamp}}}}}
        forked = handle.data.pop(fork.FORK_DATA, None)
        if forked:  # as fresh as a new server of the image: no longer restored from the fork's snapshot
            patch["spec"]["template"]["metadata"].update(
                annotations={RESTARTED_AT: stamp, RESTORE_ANNOTATION: None},
                labels={SNAPSHOT_ID_LABEL: str(handle.data.get("server_id", spec.server_id))})
        try:
            await kube.call(self.apps.patch_namespaced_deployment, handle.name, ns, patch)
        except ApiException as exc:
            raise self._api_error(f"cannot restart server {ns}/{handle.name}", exc) from exc
        await self._wait_ready(ns, handle.name, handle.data.get("image", spec.image_tag), spec.max_restarts,
                               timeout, exclude=old)
        if forked:
            await fork.release(self.forks, ns, forked, handle.name)
        handle.endpoint = self.endpoint(handle)
        return handle

    # -- the orphan sweep --

    async def list_names(self) -> set[str]:
        selector = instance_selector(self.settings, "sandbox")
        names: set[str] = set()
        for ns in self.namespaces:
            for fn in (self.apps.list_namespaced_deployment, self.core.list_namespaced_service,
                       self.policy.list_namespaced_pod_disruption_budget):
                data = await kube.call(fn, ns, label_selector=selector)
                names.update(o["metadata"]["name"] for o in data.get("items") or [])
            data = await kube.call(self.core.list_namespaced_pod, ns, label_selector=selector)
            names.update(p["metadata"]["labels"]["app"] for p in data.get("items") or []
                         if "app" in p["metadata"]["labels"])
        return names

    async def delete_name(self, name: str) -> None:
        selector = f"{instance_selector(self.settings, 'sandbox')},app={name}"
        for ns in self.namespaces:
            found = False
            for fn in (self.apps.list_namespaced_deployment, self.core.list_namespaced_pod,
                       self.core.list_namespaced_service, self.policy.list_namespaced_pod_disruption_budget):
                found = found or bool((await kube.call(fn, ns, label_selector=selector)).get("items"))
            if found:
                await self._remove(ns, name, None, wait=True)

    # -- addressing --

    def endpoint(self, handle: SandboxHandle) -> SandboxAddress:
        ns = handle.data.get("namespace", self.config.namespace)
        name = handle.name
        if self.addressing == "service-dns":
            return SandboxAddress(f"http://{name}.{ns}.svc.{self.config.cluster_domain}:{handle.data['service_port']}")
        if self.addressing == "api-proxy":
            if self.relay is None:
                raise BackendError("the API proxy relay is not running (backend not started)")
            return SandboxAddress(f"{self.relay.url}/api/v1/namespaces/{ns}/services/{name}:"
                            f"{handle.data['service_port']}/proxy")
        ready = [p for p in self._pods(ns, name) if podstate.is_ready(p) and (p.get("status") or {}).get("podIP")]
        pod = podstate.newest(ready)
        if pod is None:
            return handle.endpoint  # last known address; a forward to it fails like any unreachable sandbox
        return SandboxAddress(f"http://{pod['status']['podIP']}:{handle.data['container_port']}")

    # -- snapshots --

    async def snapshot(self, handle: SandboxHandle, group: str) -> SnapshotInfo:
        self.snapshots.require()
        ns = handle.data.get("namespace", self.config.namespace)
        pod = podstate.newest([p for p in self._pods(ns, handle.name) if podstate.is_ready(p)])
        if pod is None:
            raise BackendError(f"server {handle.name} has no ready pod to snapshot", 409)
        name = await self.snapshots.take(ns, pod["metadata"]["name"], str(group))
        # one PodSnapshot is one snapshot: its name is both the id and the SnapshotRef tag
        return SnapshotInfo(snapshot_id=name, snapshot_tag=name)

    # -- forks (fork.py) --

    async def fork(self, parent: SandboxHandle, children: list[ForkChild], timeout: float) -> list[SandboxHandle]:
        ns = parent.data.get("namespace", self.config.namespace)
        return await fork.fork(self.forks, ns, parent, children, timeout)

    async def snapshot_exists(self, snapshot_id: str) -> bool:
        for ns in self.namespaces:
            if await self.snapshots.exists(ns, snapshot_id):
                return True
        return False

    async def delete_snapshot(self, snapshot_id: str) -> None:
        for ns in self.namespaces:
            await self.snapshots.delete(ns, snapshot_id)

    # -- node holders (RegisterClientRequest.nodes_count) --

    async def reserve_nodes(self, client_name: str, count: int, timeout: float = 600.0) -> None:
        """Keep ``count`` nodes provisioned for ``client_name`` (one pause pod per node) and wait
        until they are; 0 releases them. Raises with the pods' reason when they do not fit."""
        if count <= 0:
            await self.release_nodes(client_name, 0)
            return
        ns = self.config.namespace
        deployment, pdb = build_node_holder(client_name, count, ns, self.settings)
        name = deployment["metadata"]["name"]
        try:
            if await kube.call_or_none(self.apps.read_namespaced_deployment, name, ns) is None:
                await kube.call(self.apps.create_namespaced_deployment, ns, deployment)
            else:
                await kube.call(self.apps.patch_namespaced_deployment, name, ns, {"spec": {"replicas": count}})
            if await kube.call_or_none(self.policy.read_namespaced_pod_disruption_budget, name, ns) is None:
                await kube.call(self.policy.create_namespaced_pod_disruption_budget, ns, pdb)
            else:
                await kube.call(self.policy.patch_namespaced_pod_disruption_budget, name, ns,
                                {"spec": {"minAvailable": count}})
        except ApiException as exc:
            raise self._api_error(f"cannot reserve {count} node(s) for {client_name!r}", exc) from exc
        informer = self._informer(ns)

        def enough() -> bool | None:
            ready = [p for p in informer.pods(name) if podstate.is_ready(p)]
            return True if len(ready) >= count else None

        if await informer.wait_for(enough, timeout, app=name) is None:
            waiting = [p for p in informer.pods(name) if not podstate.is_ready(p)]
            verdict = podstate.diagnose(waiting[0]) if waiting else None
            raise BackendError(f"{count} node(s) for {client_name!r} not ready within {timeout:g}s: "
                               f"{verdict.text() if verdict else 'no pods'}")

    async def release_nodes(self, client_name: str, count: int = 0) -> None:
        """Shrink the client's node holder to ``count`` pods, or remove it at 0."""
        ns, name = self.config.namespace, node_holder_name(client_name, self.settings.instance)
        if count <= 0:
            await kube.delete_quietly(self.apps.delete_namespaced_deployment, name, ns, body=BACKGROUND)
            await kube.delete_quietly(self.policy.delete_namespaced_pod_disruption_budget, name, ns, body=BACKGROUND)
            return
        await kube.call(self.policy.patch_namespaced_pod_disruption_budget, name, ns, {"spec": {"minAvailable": count}})
        await kube.call(self.apps.patch_namespaced_deployment, name, ns, {"spec": {"replicas": count}})
