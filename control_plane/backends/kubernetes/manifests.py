"""Pure functions from a start request to the Kubernetes objects of one server.

One server is a workload (a Deployment, or a bare Pod when ``pod_overrides`` asks for a restart
policy other than ``Always``, which a Deployment cannot carry), a ClusterIP Service and a
PodDisruptionBudget. Everything here is plain dicts in the API's camelCase, so the same output
is sent to the API server, validated against the published schemas in the tests, and printed
in the docs. Nothing here talks to a cluster.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from sandbox_server import routes

from ...appuser import APPUSER
from ...models import K8S_NAME, ServerKind, StartServerRequest
from ..base import SandboxSpec

GROUP = "idegym.jetbrains.com"
SERVER_ID_LABEL = f"{GROUP}/server-id"
SNAPSHOT_ID_LABEL = f"{GROUP}/snapshot-id"
INSTANCE_LABEL = f"{GROUP}/control-plane"  # keeps two control planes sharing a namespace apart
RESTORE_ANNOTATION = "podsnapshot.gke.io/ps-name"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"  # what `kubectl rollout restart` sets
CONTAINER = "server"
PORT_NAME = "http"
PART_OF = "idegym"


def api_version_label() -> str:
    """Version label value: the installed distribution's version (a valid label value)."""
    try:
        return metadata.version("idegym")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "dev"


@dataclass(frozen=True)
class ManifestSettings:
    """Cluster-wide choices that are not part of a start request (from the backend config)."""

    instance: str = "default"
    version: str = field(default_factory=api_version_label)
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    readiness_initial_delay_seconds: int = 1
    readiness_period_seconds: int = 2
    readiness_failure_threshold: int = 3
    termination_grace_period_seconds: int = 10
    pod_disruption_budget: bool = True
    extra_env: tuple[tuple[str, str], ...] = ()
    pause_image: str = "registry.k8s.io/pause:3.10"


@dataclass
class ServerManifests:
    workload: dict[str, Any]  # a Deployment or a Pod
    service: dict[str, Any]
    pdb: dict[str, Any] | None

    @property
    def kind(self) -> str:
        return self.workload["kind"]

    def all(self) -> list[dict[str, Any]]:
        return [m for m in (self.workload, self.service, self.pdb) if m is not None]


# -- merging ------------------------------------------------------------------------------------


def deep_merge(base: Any, override: Any) -> Any:
    """``pod_overrides`` as ``specs/control-plane-api.yaml`` has it: dicts merge recursively, lists
    concatenate, scalars override.

    Neither argument is modified; the result shares no mutable structure with them.
    """
    if isinstance(base, dict) and isinstance(override, dict):
        merged = copy.deepcopy(base)
        for key, value in override.items():
            merged[key] = deep_merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(override, list):
        return copy.deepcopy(base) + copy.deepcopy(override)
    return copy.deepcopy(override)


def pod_overrides_dict(req: StartServerRequest) -> dict[str, Any]:
    """``pod_overrides`` in camelCase with nulls dropped, re-checked against the two invariants
    (the model checks them too; this guards requests built without validation)."""
    overrides = req.pod_overrides.to_k8s() if req.pod_overrides is not None else {}
    if any(k in overrides for k in ("serviceAccountName", "serviceAccount")):
        raise ValueError("pod_overrides may not set serviceAccountName; use service_account_name")
    for key in ("containers", "initContainers", "ephemeralContainers"):
        for container in overrides.get(key) or []:
            if isinstance(container, dict) and container.get("name") == CONTAINER:
                raise ValueError(
                    "pod_overrides may add sidecar containers but not replace the managed 'server' container"
                )
    return overrides


# -- labels -------------------------------------------------------------------------------------


def managed_labels(name: str, settings: ManifestSettings, component: str = "sandbox") -> dict[str, str]:
    return {
        "app": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/version": settings.version,
        INSTANCE_LABEL: settings.instance,
    }


def instance_selector(settings: ManifestSettings, component: str | None = None) -> str:
    """Label selector for everything this control plane created (the orphan sweep and informer)."""
    parts = [f"app.kubernetes.io/part-of={PART_OF}", f"{INSTANCE_LABEL}={settings.instance}"]
    if component:
        parts.append(f"app.kubernetes.io/component={component}")
    return ",".join(parts)


def check_name(name: str) -> None:
    # Service names are DNS-1035 labels; the same name is used for every object of a server.
    if not 1 <= len(name) <= 63 or not K8S_NAME.match(name):
        raise ValueError(
            f"server resource name {name!r} must be a DNS-1035 label (1-63 chars, [a-z0-9-], starting "
            "with a letter); shorten server_name"
        )


# -- the server ---------------------------------------------------------------------------------


def _request_of(spec: SandboxSpec) -> StartServerRequest:
    if spec.request is not None:
        return spec.request
    # A spec built without its request: rebuild the fields a request would carry.
    from uuid import UUID

    return StartServerRequest(
        client_id=UUID(int=0), namespace=spec.namespace, image_tag=spec.image_tag,
        runtime_class_name=spec.runtime_class_name, run_as_root=spec.run_as_root,
        service_port=spec.service_port, container_port=spec.container_port,
        server_kind=spec.server_kind, max_restarts=spec.max_restarts,
    )


def _resources(req: StartServerRequest) -> dict[str, Any]:
    if req.resources is None:
        return {}
    out: dict[str, Any] = {}
    for section in ("requests", "limits"):
        quantities = getattr(req.resources, section)
        if quantities is not None:
            # by_alias gives the Kubernetes spelling "ephemeral-storage" whichever one came in
            values = quantities.model_dump(by_alias=True, exclude_none=True)
            if values:
                out[section] = values
    return out


def _security_context(run_as_root: bool) -> dict[str, Any]:
    if run_as_root:
        return {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False}
    return {
        "runAsUser": APPUSER.uid,
        "runAsGroup": APPUSER.gid,
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
    }


def _env(spec: SandboxSpec, settings: ManifestSettings) -> list[dict[str, Any]]:
    def field_ref(name: str, path: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}

    env = [
        field_ref("POD_NAME", "metadata.name"),
        field_ref("POD_NAMESPACE", "metadata.namespace"),
        field_ref("POD_IP", "status.podIP"),
        # The sandbox server of an IdeGym image reads these; other images ignore them.
        {"name": "IDEGYM_SERVER_HOST", "value": "0.0.0.0"},
        {"name": "IDEGYM_SERVER_PORT", "value": str(spec.container_port)},
        {"name": "IDEGYM_SERVER_ID", "value": str(spec.server_id)},
    ]
    env += [{"name": k, "value": v} for k, v in settings.extra_env]
    return env


def readiness_path(kind: ServerKind) -> str:
    return "/health" if kind == ServerKind.OPENENV else routes.HEALTH.path


def server_container(spec: SandboxSpec, req: StartServerRequest, settings: ManifestSettings) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image_tag,
        "imagePullPolicy": settings.image_pull_policy,
        "ports": [{"name": PORT_NAME, "containerPort": spec.container_port, "protocol": "TCP"}],
        "env": _env(spec, settings),
        "readinessProbe": {
            "httpGet": {"path": readiness_path(spec.server_kind), "port": PORT_NAME, "scheme": "HTTP"},
            "initialDelaySeconds": settings.readiness_initial_delay_seconds,
            "periodSeconds": settings.readiness_period_seconds,
            "timeoutSeconds": 2,
            "failureThreshold": settings.readiness_failure_threshold,
            "successThreshold": 1,
        },
        "securityContext": _security_context(spec.run_as_root),
        # the last log lines become the termination message, so a crash explains itself
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    resources = _resources(req)
    if resources:
        container["resources"] = resources
    if req.env_from:
        container["envFrom"] = [e.to_k8s() for e in req.env_from]
    if req.volume_mounts:
        container["volumeMounts"] = [m.to_k8s() for m in req.volume_mounts]
    return container


def pod_template(spec: SandboxSpec, name: str, settings: ManifestSettings,
                 restore_snapshot: str | None = None, snapshot_group: str | None = None,
                 service_account: str | None = None) -> dict[str, Any]:
    """``{"metadata": ..., "spec": ...}`` of the server pod, pod_overrides merged last."""
    req = _request_of(spec)
    labels = {**req.labels, **managed_labels(name, settings)}
    labels[SERVER_ID_LABEL] = str(spec.server_id)
    labels[SNAPSHOT_ID_LABEL] = snapshot_group or str(spec.server_id)
    annotations = {**req.annotations, SAFE_TO_EVICT: "false"}
    if restore_snapshot:
        annotations[RESTORE_ANNOTATION] = restore_snapshot

    pod_spec: dict[str, Any] = {
        "containers": [server_container(spec, req, settings)],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": settings.termination_grace_period_seconds,
        # a sandbox runs untrusted code: no API token unless a service account is asked for,
        # and no service-link env vars (one per Service in the namespace) in its environment
        "automountServiceAccountToken": bool(service_account or req.service_account_name),
        "enableServiceLinks": False,
    }
    if not spec.run_as_root:
        pod_spec["securityContext"] = {"fsGroup": APPUSER.gid}
    if service_account or req.service_account_name:
        pod_spec["serviceAccountName"] = service_account or req.service_account_name
    if req.node_selector:
        pod_spec["nodeSelector"] = dict(req.node_selector)
    if spec.runtime_class_name:
        pod_spec["runtimeClassName"] = spec.runtime_class_name
    if req.volumes:
        pod_spec["volumes"] = [v.to_k8s() for v in req.volumes]
    if settings.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]

    pod_spec = deep_merge(pod_spec, pod_overrides_dict(req))
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec}


def owner_reference(obj: dict[str, Any]) -> dict[str, Any]:
    """An ownerReference to a created object (needs its uid), so the cluster's garbage collector
    removes the Service and PDB with the workload even if our own delete is interrupted.
    No ``blockOwnerDeletion``: we delete in the background, and setting it would need update
    rights on the owner's ``finalizers`` where OwnerReferencesPermissionEnforcement is on."""
    meta = obj["metadata"]
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"], "uid": meta["uid"],
            "controller": True}


def build_server_manifests(spec: SandboxSpec, settings: ManifestSettings, *, namespace: str | None = None,
                           restore_snapshot: str | None = None, snapshot_group: str | None = None,
                           service_account: str | None = None,
                           owner: dict[str, Any] | None = None) -> ServerManifests:
    """Deployment (or Pod), Service and PodDisruptionBudget of one server.

    ``restore_snapshot`` names a PodSnapshot to restore (GKE's ``podsnapshot.gke.io/ps-name``);
    ``snapshot_group`` is the group it belongs to (default: this server's own id);
    ``owner`` is the created workload, for the Service's and PDB's ownerReferences.
    Raises ``ValueError`` for requests Kubernetes would refuse.
    """
    name = spec.generated_name
    check_name(name)
    for what, port in (("service_port", spec.service_port), ("container_port", spec.container_port)):
        if not 1 <= port <= 65535:
            raise ValueError(f"{what} {port} is outside 1-65535, which Kubernetes requires")
    req = _request_of(spec)
    ns = namespace or spec.namespace
    template = pod_template(spec, name, settings, restore_snapshot, snapshot_group, service_account)
    labels = {**req.labels, **managed_labels(name, settings), SERVER_ID_LABEL: str(spec.server_id)}

    if template["spec"].get("restartPolicy", "Always") == "Always":
        workload: dict[str, Any] = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": name}},
                # never two pods of one sandbox: the old one goes before the new one starts
                "strategy": {"type": "Recreate"},
                "revisionHistoryLimit": 1,
                "template": template,
            },
        }
    else:
        workload = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, **template["metadata"]},
            "spec": template["spec"],
        }

    owned: dict[str, Any] = {"ownerReferences": [owner_reference(owner)]} if owner else {}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "labels": labels, **owned},
        "spec": {
            "type": "ClusterIP",
            "selector": {"app": name},
            "ports": [{"name": PORT_NAME, "port": spec.service_port, "targetPort": PORT_NAME, "protocol": "TCP"}],
        },
    }
    pdb = None
    if settings.pod_disruption_budget:
        pdb = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": ns, "labels": labels, **owned},
            "spec": {
                "minAvailable": 1,
                "selector": {"matchLabels": {"app": name}},
                # a crash-looping sandbox must not block a node drain
                "unhealthyPodEvictionPolicy": "AlwaysAllow",
            },
        }
    return ServerManifests(copy.deepcopy(workload), service, pdb)


# -- node holders (RegisterClientRequest.nodes_count) -------------------------------------------


def node_holder_name(client_name: str, instance: str = "default") -> str:
    """One holder per client *name* (clients sharing a name share nodes), per control plane."""
    return "node-holder-" + hashlib.md5(f"{instance}/{client_name}".encode()).hexdigest()[:12]


def build_node_holder(client_name: str, count: int, namespace: str, settings: ManifestSettings
                      ) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Deployment of ``count`` pause pods, at most one per node, and a PDB keeping them: the
    nodes stay provisioned (and warm) for the client's sandboxes."""
    name = node_holder_name(client_name, settings.instance)
    labels = managed_labels(name, settings, component="node-holder")
    template = {
        "metadata": {"labels": labels, "annotations": {SAFE_TO_EVICT: "false"}},
        "spec": {
            "containers": [{
                "name": "pause",
                "image": settings.pause_image,
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                "securityContext": _security_context(False),
            }],
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 0,
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {"app": name}},
                "topologyKey": "kubernetes.io/hostname",
            }]}},
        },
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels,
                     "annotations": {f"{GROUP}/client-name": client_name}},
        "spec": {"replicas": count, "selector": {"matchLabels": {"app": name}}, "template": template},
    }
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"minAvailable": count, "selector": {"matchLabels": {"app": name}}},
    }
    return deployment, pdb
