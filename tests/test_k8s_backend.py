"""The Kubernetes backend against the Kubernetes API simulator (tests/k8s_sim).

The real ``kubernetes`` client talks HTTP to the simulator; the simulator's kubelet runs each
pod's ``server`` container as a local ``sandbox_server`` process on its own loopback address.
What the simulator cannot show is listed in docs/kubernetes.md.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import kubernetes_validate
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from control_plane.backends.base import BackendError, ImageNotFound, SandboxSpec, SnapshotsUnsupported
from control_plane.backends.kubernetes import (
    KubernetesBackend,
    KubernetesBackendConfig,
    ManifestSettings,
    build_server_manifests,
    deep_merge,
    parse_build_yaml,
)
from control_plane.backends.kubernetes.builds import build_job
from control_plane.backends.kubernetes.manifests import RESTORE_ANNOTATION, build_node_holder
from control_plane.models import SnapshotRef, StartServerRequest, Status
from tests.helpers import REPO, process_alive
from tests.k8s_sim.fixtures import SimulatorProcess

pytestmark = pytest.mark.kubernetes

IMAGE = "registry.example.com/idegym/env:1"
K8S_VERSION = "1.30"  # a version kubernetes-validate ships schemas for (it has 1.25 - 1.37)


def request(**fields: Any) -> StartServerRequest:
    return StartServerRequest(client_id=uuid.uuid4(), image_tag=fields.pop("image_tag", IMAGE), **fields)


def _is_pod_ip(ip: str) -> bool:
    """A simulated pod's own loopback address (127.N.x.y, N >= 77), not the host's 127.0.0.1."""
    parts = ip.split(".")
    return len(parts) == 4 and parts[0] == "127" and 77 <= int(parts[1]) < 127


def spec_for(req: StartServerRequest, server_id: int | None = None) -> SandboxSpec:
    server_id = server_id or int(uuid.uuid4().int % 100_000) + 1
    return SandboxSpec.from_request(req, server_id, f"{req.server_name}-{server_id}")


def run(scenario: Callable[[KubernetesBackend], Awaitable[None]], config: KubernetesBackendConfig) -> None:
    """Start a backend on ``config``, run the scenario, always close the backend."""

    async def main() -> None:
        backend = KubernetesBackend(config)
        await backend.start()
        try:
            await asyncio.wait_for(scenario(backend), 90)
        finally:
            # a failed scenario leaves no sandbox running for the next test (the instance label
            # is unique to this test, so this sweeps nothing else)
            for name in await backend.list_names():
                await backend.delete_name(name)
            await backend.close()

    asyncio.run(main())


class Inspector:
    """The tests' own view of the cluster: a separate client (default user agent), so the RBAC
    test below sees only the backend's calls."""

    def __init__(self, backend: KubernetesBackend) -> None:
        api = k8s.ApiClient(backend.api.configuration)
        self.core, self.apps = k8s.CoreV1Api(api), k8s.AppsV1Api(api)
        self.policy, self.custom = k8s.PolicyV1Api(api), k8s.CustomObjectsApi(api)


def inspect(backend: KubernetesBackend) -> Inspector:
    if not hasattr(backend, "_inspector"):
        backend._inspector = Inspector(backend)  # type: ignore[attr-defined]
    return backend._inspector  # type: ignore[attr-defined]


async def bash(backend: KubernetesBackend, handle: Any, command: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(backend.endpoint(handle).base_url + "/api/tools/bash", json={"command": command})
    assert resp.status_code == 200, resp.text
    return resp.json()


async def leftovers(backend: KubernetesBackend, name: str) -> list[str]:
    """Every object of server ``name`` still in the cluster (any kind we create)."""
    ns, sel = backend.config.namespace, f"app={name}"
    found = []
    look = inspect(backend)
    for label, fn in (("deployment", look.apps.list_namespaced_deployment),
                      ("pod", look.core.list_namespaced_pod),
                      ("service", look.core.list_namespaced_service),
                      ("pdb", look.policy.list_namespaced_pod_disruption_budget)):
        items = (await asyncio.to_thread(fn, ns, label_selector=sel)).items
        found += [f"{label}/{o.metadata.name}" for o in items]
    return found


async def wait_for(predicate: Callable[[], Awaitable[Any]], timeout: float = 15) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    return await predicate()


@pytest.fixture(scope="module")
def k8s_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimulatorProcess]:
    """One simulator for this module (tests/k8s_sim/fixtures.py has the session-wide one)."""
    sim = SimulatorProcess(tmp_path_factory.mktemp("k8s-sim"), snapshots=True)
    yield sim
    sim.stop()


def documented_role() -> set[tuple[str, str, str]]:
    """(verb, API group, resource) the Role in docs/kubernetes.md grants."""
    docs = (REPO / "docs" / "kubernetes.md").read_text()
    role = next(doc for block in re.findall(r"```yaml\n(.*?)```", docs, re.DOTALL)
                for doc in yaml.safe_load_all(block) if doc.get("kind") == "Role")
    return {(verb, group, resource) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def backend_calls(sim: SimulatorProcess) -> set[tuple[str, str, str]]:
    """(verb, API group, resource) of every call the control plane's client sent to ``sim``."""
    return {(verb, group, resource) for agent, verb, group, resource in sim.http.get("/_sim/audit").json()
            if agent == "idegym-control-plane"}


def ungranted(used: set[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """Calls the documented Role does not grant (services/proxy, for api-proxy addressing, is the
    documented extra: any verb a forwarded call uses)."""
    proxied = {u for u in used if u[2] == "services/proxy"}
    bad_proxy = {u for u in proxied if u[0] not in ("get", "create", "update", "patch", "delete")}
    return sorted((used - proxied - documented_role()) | bad_proxy)


@pytest.fixture(autouse=True)
def each_test_is_granted_and_leaves_no_pod(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test on the module's simulator: every call the backend made so far is granted
    by the documented Role, and no pod process is left running (each test deletes its servers)."""
    yield
    if "k8s_sim" not in request.fixturenames:
        return
    sim: SimulatorProcess = request.getfixturevalue("k8s_sim")
    assert not ungranted(backend_calls(sim))

    async def settled() -> bool:
        return not sim.pod_pids()

    assert asyncio.run(wait_for(settled, 20)), sim.state()


@pytest.fixture
def k8s_config(k8s_sim: SimulatorProcess) -> KubernetesBackendConfig:
    return k8s_sim.backend_config()  # a test-unique instance label: tests never see each other's servers


# -- manifests ----------------------------------------------------------------------------------

VOLUMES = [{"name": "creds", "secret": {"secret_name": "agent-creds", "items": None, "default_mode": 0o440,
                                         "optional": None}, "config_map": None, "empty_dir": None,
            "persistent_volume_claim": None},
           {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
           {"name": "data", "persistent_volume_claim": {"claim_name": "data", "read_only": True}},
           {"name": "conf", "configMap": {"name": "conf"}},
           {"name": "ext", "csi": {"driver": "secrets-store.csi.k8s.io", "readOnly": True}}]
MOUNTS = [{"name": "creds", "mount_path": "/etc/creds", "read_only": True, "sub_path": None,
           "sub_path_expr": None, "mount_propagation": None},
          {"name": "scratch", "mountPath": "/scratch"}]
ENV_FROM = [{"prefix": "AGENT_", "secret_ref": {"name": "agent-creds", "optional": None}, "config_map_ref": None},
            {"configMapRef": {"name": "settings", "optional": True}}]

SHAPES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "openenv": {"server_kind": "openenv", "service_port": 8000, "container_port": 7860},
    "resources-underscore": {"resources": {"requests": {"cpu": "500m", "memory": "512Mi", "ephemeral_storage": "1Gi"},
                                           "limits": {"cpu": 1.5, "memory": "1Gi", "ephemeral_storage": "2Gi"}}},
    "resources-dash": {"resources": {"requests": {"cpu": "2", "ephemeral-storage": "10Gi"}, "limits": None}},
    "everything": {
        "runtime_class_name": "gvisor", "node_selector": {"cloud.google.com/gke-nodepool": "sandboxes"},
        "labels": {"job": "swe-bench-42", "team": "research"},
        "annotations": {"idegym.example.com/task-url": "https://tracker.example.com/TASK-1"},
        "volumes": VOLUMES, "volume_mounts": MOUNTS, "env_from": ENV_FROM, "service_account_name": "agent-runner",
        "max_restarts": 3, "snapshot": {"id": "12", "tag": None},
    },
    "run-as-root": {"run_as_root": True},
    "overrides-typed": {"pod_overrides": {
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule", "value": None,
                         "toleration_seconds": None}],
        "host_aliases": [{"ip": "10.0.0.1", "hostnames": ["git.internal"]}],
        "node_selector": {"disk": "ssd"}, "runtime_class_name": "kata", "priority_class_name": "low",
        "scheduler_name": "default-scheduler", "termination_grace_period_seconds": 5,
        "automount_service_account_token": False, "dns_policy": "None", "restart_policy": None}},
    "overrides-extra": {"node_selector": {"zone": "a"}, "pod_overrides": {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "arch", "operator": "In", "values": ["amd64"]}]}]}}},
        "dnsConfig": {"nameservers": ["1.1.1.1"]},
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, "fsGroup": 2000},
        "containers": [{"name": "log-shipper", "image": "fluent/fluent-bit:3"}],
        "volumes": [{"name": "shared", "emptyDir": {}}],
        "tolerations": [{"key": "gpu", "operator": "Exists"}]}},
    "bare-pod": {"pod_overrides": {"restartPolicy": "Never"}},
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_manifests_validate_against_the_published_kubernetes_schemas(shape: str) -> None:
    req = request(**copy.deepcopy(SHAPES[shape]))
    spec = spec_for(req, 42)
    settings = ManifestSettings(image_pull_secrets=("regcred",), extra_env=(("OTEL_SERVICE_NAME", "sandbox"),))
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": spec.generated_name, "uid": "u-1"}}
    manifests = build_server_manifests(spec, settings, restore_snapshot="snap-1" if req.snapshot else None,
                                       snapshot_group=req.snapshot.id if req.snapshot else None, owner=owner)
    objects = list(manifests.all())
    kinds = [obj["kind"] for obj in objects]
    assert "Service" in kinds and ("Deployment" in kinds or "Pod" in kinds), kinds
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:  # pragma: no cover - the failure message
            pytest.fail(f"{shape}: {obj['kind']} does not validate: {exc.message} at {list(exc.path)}")


def test_every_other_generated_manifest_validates_too() -> None:
    backend = KubernetesBackend(KubernetesBackendConfig(kubeconfig="/nonexistent", in_cluster=False,
                                                 registry_secret="regcred", insecure_registry=True))
    (definition,) = parse_build_yaml("images:\n  - name: env\n    base: python:3.12-slim\n"
                                     "    commands: [pip install pytest]\n    env: {A: '1'}\n",
                                     registry="registry.example.com/idegym")
    job, configmap = build_job("idegym-build-env-1", "idegym", definition, backend)
    holder, holder_pdb = build_node_holder("client-a", 3, "idegym", ManifestSettings())
    for obj in (job, configmap, holder, holder_pdb):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert "FROM python:3.12-slim" in configmap["data"]["Dockerfile"]
    assert "RUN pip install pytest" in configmap["data"]["Dockerfile"]
    assert f"--destination={definition.tag}" in job["spec"]["template"]["spec"]["containers"][0]["args"]


def test_manifest_content_follows_the_seed_rules() -> None:
    req = request(**copy.deepcopy(SHAPES["everything"]))
    m = build_server_manifests(spec_for(req, 12), ManifestSettings(instance="cp1"), restore_snapshot="ps-1",
                               snapshot_group="9")
    pod = m.workload["spec"]["template"]
    labels, spec = pod["metadata"]["labels"], pod["spec"]
    assert m.kind == "Deployment" and m.workload["spec"]["strategy"] == {"type": "Recreate"}
    assert labels["app"] == labels["app.kubernetes.io/name"] == "default-idegym-server-12"
    assert labels["app.kubernetes.io/component"] == "sandbox" and labels["app.kubernetes.io/part-of"] == "idegym"
    assert labels["idegym.jetbrains.com/server-id"] == "12" and labels["idegym.jetbrains.com/snapshot-id"] == "9"
    assert labels["job"] == "swe-bench-42" and m.service["metadata"]["labels"]["team"] == "research"
    assert m.pdb is not None and m.pdb["metadata"]["labels"]["team"] == "research"
    assert pod["metadata"]["annotations"][RESTORE_ANNOTATION] == "ps-1"
    assert pod["metadata"]["annotations"]["idegym.example.com/task-url"].startswith("https://")
    assert pod["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    server = spec["containers"][0]
    assert server["name"] == "server" and server["readinessProbe"]["httpGet"]["path"] == "/api/health"
    assert server["securityContext"]["runAsUser"] == 1000 and server["securityContext"]["runAsNonRoot"] is True
    assert spec["serviceAccountName"] == "agent-runner" and spec["automountServiceAccountToken"] is True
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["nodeSelector"] == {"cloud.google.com/gke-nodepool": "sandboxes"}
    assert spec["volumes"][0] == {"name": "creds", "secret": {"secretName": "agent-creds", "defaultMode": 0o440}}
    assert spec["volumes"][4]["csi"]["driver"] == "secrets-store.csi.k8s.io"  # extra keys pass through
    assert server["volumeMounts"][0] == {"name": "creds", "mountPath": "/etc/creds", "readOnly": True}
    assert server["envFrom"][0] == {"prefix": "AGENT_", "secretRef": {"name": "agent-creds"}}

    for spelling in ("resources-underscore", "resources-dash"):
        res = build_server_manifests(spec_for(request(**copy.deepcopy(SHAPES[spelling]))), ManifestSettings())
        resources = res.workload["spec"]["template"]["spec"]["containers"][0]["resources"]
        assert "ephemeral-storage" in resources["requests"] and "ephemeral_storage" not in str(resources)
    underscore = build_server_manifests(spec_for(request(**copy.deepcopy(SHAPES["resources-underscore"]))),
                                        ManifestSettings()).workload
    assert underscore["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "500m", "memory": "512Mi", "ephemeral-storage": "1Gi"},
        "limits": {"cpu": "1500m", "memory": "1Gi", "ephemeral-storage": "2Gi"}}

    root = build_server_manifests(spec_for(request(run_as_root=True)), ManifestSettings()).workload
    root_spec = root["spec"]["template"]["spec"]
    assert root_spec["containers"][0]["securityContext"] == {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False}
    assert "securityContext" not in root_spec and root_spec["automountServiceAccountToken"] is False

    openenv = build_server_manifests(spec_for(request(server_kind="openenv")), ManifestSettings()).workload
    assert openenv["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/health"

    bare = build_server_manifests(spec_for(request(pod_overrides={"restartPolicy": "Never"})), ManifestSettings())
    assert bare.kind == "Pod" and bare.workload["spec"]["restartPolicy"] == "Never"


def test_pod_overrides_deep_merge_last() -> None:
    assert deep_merge({"a": {"b": 1, "c": [1]}, "s": "x"}, {"a": {"c": [2], "d": 3}, "s": "y"}) == \
        {"a": {"b": 1, "c": [1, 2], "d": 3}, "s": "y"}
    req = request(**copy.deepcopy(SHAPES["overrides-extra"]))
    spec = build_server_manifests(spec_for(req), ManifestSettings()).workload["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["server", "log-shipper"]  # lists concatenate
    assert spec["nodeSelector"] == {"zone": "a"} and spec["dnsConfig"] == {"nameservers": ["1.1.1.1"]}
    assert spec["securityContext"] == {"fsGroup": 2000, "seccompProfile": {"type": "RuntimeDefault"}}  # scalar wins
    typed = build_server_manifests(spec_for(request(
        runtime_class_name="gvisor", node_selector={"pool": "a"},
        pod_overrides={"runtime_class_name": "kata", "node_selector": {"disk": "ssd"},
                       "termination_grace_period_seconds": 5})), ManifestSettings()).workload
    tspec = typed["spec"]["template"]["spec"]
    assert tspec["runtimeClassName"] == "kata" and tspec["terminationGracePeriodSeconds"] == 5
    assert tspec["nodeSelector"] == {"pool": "a", "disk": "ssd"}


@pytest.mark.parametrize("fields, words", [
    ({"labels": {"app": "x"}}, "managed by IdeGym"),
    ({"labels": {"app.kubernetes.io/name": "x"}}, "managed by IdeGym"),
    ({"labels": {"idegym.jetbrains.com/server-id": "1"}}, "managed by IdeGym"),
    ({"annotations": {"podsnapshot.gke.io/ps-name": "x"}}, "managed by IdeGym"),
    ({"annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}}, "managed by IdeGym"),
    ({"annotations": {"prometheus.io/scrape": "true"}}, "managed by IdeGym"),
    ({"pod_overrides": {"serviceAccountName": "admin"}}, "serviceAccountName"),
    ({"pod_overrides": {"containers": [{"name": "server", "image": "evil"}]}}, "managed 'server' container"),
])
def test_reserved_keys_and_override_invariants_are_rejected(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        request(**fields)


def test_kubernetes_refusals_are_422_before_any_api_call() -> None:
    long_name = SandboxSpec.from_request(request(server_name="a" * 60), 12345, "a" * 60 + "-12345")
    with pytest.raises(ValueError, match="DNS-1035"):
        build_server_manifests(long_name, ManifestSettings())
    with pytest.raises(ValueError, match="service_port 0"):
        build_server_manifests(spec_for(request(service_port=0)), ManifestSettings())


def _pod(phase: str, state: dict[str, Any], restarts: int = 0, ready: bool = False,
         last: dict[str, Any] | None = None, scheduled: dict[str, Any] | None = None) -> dict[str, Any]:
    status = {"name": "server", "restartCount": restarts, "state": state, **({"lastState": last} if last else {})}
    conditions = [scheduled or {"type": "PodScheduled", "status": "True"},
                  {"type": "Ready", "status": "True" if ready else "False"}]
    return {"metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": phase, "conditions": conditions, "containerStatuses": [status]}}


def test_reading_pods_like_kubectl_describe() -> None:
    from control_plane.backends.kubernetes import podstate

    crashed = {"terminated": {"exitCode": 137, "reason": "OOMKilled", "message": "boom"}}
    backoff = _pod("Running", {"waiting": {"reason": "CrashLoopBackOff"}}, restarts=2, last=crashed)
    seen = podstate.observe([backoff], True)
    # the kubelet is restarting it: still "running" for the watcher, restarts decide max_restarts
    assert seen.running and not seen.ready and seen.restarts == 2 and "OOMKilled" in (seen.reason or "")
    assert not podstate.diagnose(backoff, max_restarts=2).fatal
    assert podstate.diagnose(backoff, max_restarts=1).fatal
    pull = _pod("Pending", {"waiting": {"reason": "ErrImagePull", "message": "x: not found"}})
    assert podstate.diagnose(pull).image_missing and not podstate.observe([pull], True).running
    auth = _pod("Pending", {"waiting": {"reason": "ImagePullBackOff", "message": "401 Unauthorized"}})
    assert not podstate.diagnose(auth).fatal  # may be fixed by a pull secret: wait, report at timeout
    pending = _pod("Pending", {}, scheduled={"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                             "message": "0/3 nodes are available"})
    assert podstate.diagnose(pending).text() == "Unschedulable: 0/3 nodes are available"
    ok = _pod("Running", {"running": {}}, ready=True)
    assert podstate.diagnose(ok) is None and podstate.observe([ok], True).ready
    assert not podstate.observe([], True).running and not podstate.observe([], False).exists


def test_backend_takes_keyword_settings_like_the_control_plane_passes_them(tmp_path: Any) -> None:
    backend = KubernetesBackend(kubeconfig=str(tmp_path / "kubeconfig"), addressing="pod-ip", namespace="sandboxes",
                                instance="cp-2")
    assert backend.config.namespace == "sandboxes" and backend.addressing == "pod-ip"
    assert backend.image_builder() is backend.builder and backend.capabilities.restart_in_place
    env = {"IDEGYM_K8S_NAMESPACE": "envns", "IDEGYM_K8S_SNAPSHOTS": "true",
           "IDEGYM_K8S_IMAGE_PULL_SECRETS": "a, b", "KUBECONFIG": "/k"}
    cfg = KubernetesBackendConfig.from_env(env)
    assert (cfg.namespace, cfg.snapshots, cfg.image_pull_secrets, cfg.kubeconfig) == ("envns", True, ("a", "b"), "/k")
    with pytest.raises(ValueError, match="addressing"):
        KubernetesBackend(addressing="telepathy")


# -- the simulator speaks the API -----------------------------------------------------------------


def test_simulator_speaks_the_kubernetes_protocol(k8s_sim: SimulatorProcess) -> None:
    api = kube_config.new_client_from_config(str(k8s_sim.kubeconfig))
    core, apps = k8s.CoreV1Api(api), k8s.AppsV1Api(api)
    name = f"cm-{uuid.uuid4().hex[:6]}"
    try:
        created = core.create_namespaced_config_map("idegym", {"metadata": {"name": name, "labels": {"t": name}},
                                                               "data": {"a": "1"}})
        with pytest.raises(ApiException) as conflict:
            core.create_namespaced_config_map("idegym", {"metadata": {"name": name}})
        assert conflict.value.status == 409 and '"reason": "AlreadyExists"' in conflict.value.body
        core.patch_namespaced_config_map(name, "idegym", {"data": {"a": "2"}})
        with pytest.raises(ApiException) as stale_write:
            core.replace_namespaced_config_map(name, "idegym", api.sanitize_for_serialization(
                k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name,
                                                          resource_version=created.metadata.resource_version),
                                data={"a": "3"})))
        assert stale_write.value.status == 409 and "Conflict" in stale_write.value.body
        listed = core.list_namespaced_config_map("idegym", label_selector=f"t={name}")
        assert [c.metadata.name for c in listed.items] == [name] and listed.metadata.resource_version
        assert core.list_namespaced_config_map("idegym", label_selector=f"t!={name},t").items == []
        # a watch from the create's resourceVersion replays the patch as MODIFIED
        resp = core.list_namespaced_config_map("idegym", watch=True, resource_version=created.metadata.resource_version,
                                               field_selector=f"metadata.name={name}", timeout_seconds=1,
                                               _preload_content=False)
        assert b'"type": "MODIFIED"' in resp.read()
        with pytest.raises(ApiException) as missing:
            core.read_namespaced_config_map("nope", "idegym")
        assert missing.value.status == 404 and '"kind": "Status"' in missing.value.body
        bad = {"metadata": {"name": "bad"}, "spec": {"selector": {"matchLabels": {"app": "x"}},
               "template": {"metadata": {"labels": {"app": "y"}},
                            "spec": {"containers": [{"name": "c", "image": "i"}]}}}}
        with pytest.raises(ApiException) as invalid:
            apps.create_namespaced_deployment("idegym", bad)
        assert invalid.value.status == 422 and "selector" in invalid.value.body
        unknown_field = {"metadata": {"name": "bad2"}, "spec": {"selector": {"matchLabels": {"app": "x"}},
                                                                "replicaz": 1,
                         "template": {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": "no"}}}}
        # the client's own models would refuse this body; send it raw, as kubectl could
        raw = httpx.post(f"{k8s_sim.url}/apis/apps/v1/namespaces/idegym/deployments", json=unknown_field,
                         headers={"Authorization": f"Bearer {k8s_sim.token}"})
        assert raw.status_code == 422 and raw.json()["reason"] == "Invalid" and raw.json()["kind"] == "Status"
        with pytest.raises(ApiException) as unauthorized:
            k8s.CoreV1Api(k8s.ApiClient(k8s.Configuration(host=k8s_sim.url))).list_namespaced_pod("idegym")
        assert unauthorized.value.status == 401
    finally:
        core.delete_namespaced_config_map(name, "idegym")
        api.close()


# -- servers ------------------------------------------------------------------------------------


def test_create_ready_bash_through_the_api_server_proxy_and_delete_leaves_nothing(
        k8s_sim: SimulatorProcess, k8s_config: KubernetesBackendConfig) -> None:
    async def scenario(backend: KubernetesBackend) -> None:
        req = request(labels={"team": "research"}, annotations={"example.com/task": "t-1"})
        spec = spec_for(req)
        started = time.monotonic()
        handle = await backend.create(spec, 30)
        ready_after = time.monotonic() - started
        assert handle.endpoint.base_url.startswith(backend.relay.url + "/api/v1/namespaces/idegym/services/")
        result = await bash(backend, handle, "echo hello from $POD_NAME; id -u")
        assert result["exit_code"] == 0 and result["stdout"].startswith(f"hello from {spec.generated_name}-")
        # the typed client reads the simulator's objects (the protocol, not only our dicts)
        pods = (await asyncio.to_thread(inspect(backend).core.list_namespaced_pod, "idegym",
                                        label_selector=f"app={spec.generated_name}")).items
        assert len(pods) == 1 and _is_pod_ip(pods[0].status.pod_ip)
        assert {c.type: c.status for c in pods[0].status.conditions}["Ready"] == "True"
        assert pods[0].metadata.labels["team"] == "research"
        assert pods[0].metadata.annotations["example.com/task"] == "t-1"
        svc = await asyncio.to_thread(inspect(backend).core.read_namespaced_service, spec.generated_name, "idegym")
        assert svc.metadata.owner_references[0].kind == "Deployment"
        obs = await backend.observe(handle)
        assert obs.exists and obs.ready and obs.running and obs.phase == "Running" and obs.restarts == 0
        assert spec.generated_name in await backend.list_names()
        pid = k8s_sim.state()["pods"][f"idegym/{pods[0].metadata.name}"]["pid"]
        assert process_alive(pid)

        await backend.delete(handle)
        assert await leftovers(backend, spec.generated_name) == []
        assert not process_alive(pid)
        assert spec.generated_name not in await backend.list_names()
        gone = await backend.observe(handle)
        assert not gone.exists and not gone.ready
        await backend.delete(handle)  # idempotent
        assert ready_after < 15

    run(scenario, k8s_config)


def test_pod_ip_addressing_and_restart_gives_a_fresh_pod(k8s_sim: SimulatorProcess) -> None:
    async def scenario(backend: KubernetesBackend) -> None:
        spec = spec_for(request())
        handle = await backend.create(spec, 30)
        first = backend.endpoint(handle).base_url
        assert _is_pod_ip(first.removeprefix("http://").rsplit(":", 1)[0]) and first.endswith(":8000")
        await bash(backend, handle, "echo scratch > left-behind.txt")
        assert (await bash(backend, handle, "cat left-behind.txt"))["stdout"] == "scratch\n"

        same = await backend.restart(handle, spec, 30)
        assert same.name == handle.name
        second = backend.endpoint(same).base_url
        assert second != first  # a new pod, a new address
        result = await bash(backend, same, "cat left-behind.txt")
        assert result["exit_code"] != 0  # as fresh as a new sandbox
        assert len([p for p in backend.informers["idegym"].pods(handle.name)]) == 1
        await backend.delete(same)
        assert await leftovers(backend, spec.generated_name) == []

    run(scenario, k8s_sim.backend_config(addressing="pod-ip"))


def test_service_dns_addressing_names_the_service() -> None:
    backend = KubernetesBackend(KubernetesBackendConfig(addressing="service-dns", namespace="sandboxes",
                                                 cluster_domain="cluster.local"))
    from control_plane.backends.base import SandboxAddress, SandboxHandle

    handle = SandboxHandle("kubernetes", "srv-7", SandboxAddress(""), {"namespace": "sandboxes", "service_port": 80})
    assert backend.endpoint(handle).base_url == "http://srv-7.sandboxes.svc.cluster.local:80"
    assert KubernetesBackendConfig(in_cluster=True).resolved_addressing() == "service-dns"
    assert KubernetesBackendConfig(in_cluster=False).resolved_addressing() == "api-proxy"


def test_crashes_are_counted_and_max_restarts_ends_a_start(k8s_sim: SimulatorProcess,
                                                           k8s_config: KubernetesBackendConfig) -> None:
    async def scenario(backend: KubernetesBackend) -> None:
        handle = await backend.create(spec_for(request(max_restarts=2)), 30)
        pod_key = next(k for k in k8s_sim.state()["pods"] if handle.name in k)
        for crash in (1, 2):
            pid = k8s_sim.state()["pods"][pod_key]["pid"]
            os.kill(pid, signal.SIGKILL)  # the container dies (like an OOM kill)

            async def restarted(n: int = crash) -> bool:
                obs = await backend.observe(handle)
                return obs.restarts == n and obs.ready

            assert await wait_for(restarted), await backend.observe(handle)
        assert (await bash(backend, handle, "echo back"))["stdout"] == "back\n"
        await backend.delete(handle)

        # an image that crashes on start: with max_restarts=0 the first crash ends the start,
        # carrying the container's own last words
        crash_spec = spec_for(request(image_tag="registry.example.com/crashloop:1", max_restarts=0))
        started = time.monotonic()
        with pytest.raises(BackendError) as failed:
            await backend.create(crash_spec, 30)
        assert time.monotonic() - started < 10  # fail fast, not at the timeout
        assert failed.value.status == 500
        assert "exited with code 3" in failed.value.message
        assert "cannot open /etc/sandbox.conf" in failed.value.message
        assert await leftovers(backend, crash_spec.generated_name) == []

    run(scenario, k8s_config)


def test_start_failures_carry_the_pods_reason_and_leave_nothing(k8s_config: KubernetesBackendConfig) -> None:
    async def scenario(backend: KubernetesBackend) -> None:
        missing = spec_for(request(image_tag="registry.example.com/does-not-exist:1"))
        with pytest.raises(ImageNotFound) as not_found:
            await backend.create(missing, 30)
        assert not_found.value.status == 404
        assert "ErrImagePull" in not_found.value.message and "not found" in not_found.value.message

        unschedulable = spec_for(request(node_selector={"cloud.google.com/gke-nodepool": "gpu"}))
        with pytest.raises(BackendError) as timed_out:
            await backend.create(unschedulable, 2)
        assert timed_out.value.status == 500
        assert "not ready within 2s" in timed_out.value.message
        assert "Unschedulable: 0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector" \
            in timed_out.value.message

        never = spec_for(request(image_tag="registry.example.com/never-ready:1"))
        with pytest.raises(BackendError) as unready:
            await backend.create(never, 2)
        assert "ContainersNotReady" in unready.value.message
        assert "Readiness probe failed" in unready.value.message  # from the pod's events

        for spec in (missing, unschedulable, never):
            assert await leftovers(backend, spec.generated_name) == []

    run(scenario, k8s_config)


def test_orphan_sweep_finds_our_objects_by_label_only(k8s_sim: SimulatorProcess,
                                                      k8s_config: KubernetesBackendConfig) -> None:
    async def scenario(backend: KubernetesBackend) -> None:
        kept = await backend.create(spec_for(request()), 30)
        # leaked objects: a server whose database row is gone, and a half-created one (Service only)
        leaked = spec_for(request())
        manifests = build_server_manifests(leaked, backend.settings, namespace="idegym")
        await asyncio.to_thread(inspect(backend).apps.create_namespaced_deployment, "idegym", manifests.workload)
        await asyncio.to_thread(inspect(backend).core.create_namespaced_service, "idegym", manifests.service)
        half = spec_for(request())
        await asyncio.to_thread(inspect(backend).core.create_namespaced_service, "idegym",
                                build_server_manifests(half, backend.settings, namespace="idegym").service)
        # someone else's objects with the same shape but another control plane's label
        foreign_settings = ManifestSettings(instance="someone-else")
        foreign = spec_for(request())
        await asyncio.to_thread(inspect(backend).core.create_namespaced_service, "idegym",
                                build_server_manifests(foreign, foreign_settings, namespace="idegym").service)

        names = await backend.list_names()
        assert {kept.name, leaked.generated_name, half.generated_name} <= names
        assert foreign.generated_name not in names
        for orphan in names - {kept.name}:
            await backend.delete_name(orphan)
        assert await backend.list_names() == {kept.name}
        assert await leftovers(backend, leaked.generated_name) == []
        assert (await backend.observe(kept)).ready
        await backend.delete_name(foreign.generated_name)  # not ours: untouched
        svc = await asyncio.to_thread(inspect(backend).core.read_namespaced_service, foreign.generated_name, "idegym")
        assert svc.metadata.name == foreign.generated_name
        await asyncio.to_thread(inspect(backend).core.delete_namespaced_service, foreign.generated_name, "idegym")
        await backend.delete(kept)

    run(scenario, k8s_config)


def test_openenv_server_is_ready_on_its_health_path(k8s_config: KubernetesBackendConfig) -> None:
    async def scenario(backend: KubernetesBackend) -> None:
        spec = spec_for(request(image_tag="registry.example.com/openenv-echo:1", server_kind="openenv",
                                container_port=7860))
        handle = await backend.create(spec, 30)
        base = backend.endpoint(handle).base_url
        async with httpx.AsyncClient() as http:
            resp = await http.get(base + "/health")
        assert resp.status_code == 200 and resp.json() == {"status": "healthy"}
        # OpenEnv speaks WebSocket: relay → API server's service proxy → pod, frames both ways
        async with aiohttp.ClientSession() as session, session.ws_connect(base.replace("http", "ws", 1) + "/ws") as ws:
            await ws.send_str("ping")
            assert (await ws.receive(timeout=10)).data == "ping"
        await backend.delete(handle)

    run(scenario, k8s_config)


def test_bare_pod_workload_when_restart_policy_is_overridden(k8s_config: KubernetesBackendConfig) -> None:
    async def scenario(backend: KubernetesBackend) -> None:
        spec = spec_for(request(pod_overrides={"restartPolicy": "Never"}))
        handle = await backend.create(spec, 30)
        assert handle.data["kind"] == "Pod"
        assert (await bash(backend, handle, "echo pod"))["stdout"] == "pod\n"
        handle = await backend.restart(handle, spec, 30)
        assert (await backend.observe(handle)).ready
        await backend.delete(handle)
        assert await leftovers(backend, spec.generated_name) == []

    run(scenario, k8s_config)


# -- snapshots ----------------------------------------------------------------------------------


def test_snapshot_create_and_restore_by_group_and_by_tag(k8s_sim: SimulatorProcess,
                                                         k8s_config: KubernetesBackendConfig) -> None:
    k8s_sim.set_snapshots(True)
    config = k8s_sim.backend_config(snapshots=True)

    async def scenario(backend: KubernetesBackend) -> None:
        assert backend.capabilities.snapshots
        source_spec = spec_for(request())
        source = await backend.create(source_spec, 30)
        await bash(backend, source, "echo first > state.txt")
        group = str(source_spec.server_id)
        first = await backend.snapshot(source, group)
        assert first.snapshot_id == first.snapshot_tag  # one PodSnapshot: its name is id and tag
        await bash(backend, source, "echo second > state.txt")
        second = await backend.snapshot(source, group)
        assert second.snapshot_tag != first.snapshot_tag
        assert await backend.snapshot_exists(group) and await backend.snapshot_exists(first.snapshot_id)
        ps = await asyncio.to_thread(inspect(backend).custom.get_namespaced_custom_object, "podsnapshot.gke.io",
                                     "v1", "idegym", "podsnapshots", first.snapshot_id)
        assert ps["metadata"]["labels"]["idegym.jetbrains.com/snapshot-id"] == group
        assert not (await asyncio.to_thread(inspect(backend).custom.list_namespaced_custom_object,
                                            "podsnapshot.gke.io", "v1", "idegym",
                                            "podsnapshotmanualtriggers"))["items"]  # triggers cleaned up

        latest = spec_for(request(snapshot=SnapshotRef(id=group)))
        restored = await backend.create(latest, 30)
        assert (await bash(backend, restored, "cat state.txt"))["stdout"] == "second\n"  # newest of the group
        pod = backend.informers["idegym"].pods(restored.name)[0]
        assert pod["metadata"]["annotations"][RESTORE_ANNOTATION] == second.snapshot_tag
        assert pod["metadata"]["labels"]["idegym.jetbrains.com/snapshot-id"] == group

        tagged = spec_for(request(snapshot=SnapshotRef(id=group, tag=first.snapshot_tag)))
        pinned = await backend.create(tagged, 30)
        assert (await bash(backend, pinned, "cat state.txt"))["stdout"] == "first\n"
        # the control plane's path: it picked the snapshot itself and passes its id
        chosen = SandboxSpec.from_request(request(snapshot=SnapshotRef(id=group)), 77001, "chosen-77001",
                                          snapshot_source=first.snapshot_id)
        by_id = await backend.create(chosen, 30)
        assert (await bash(backend, by_id, "cat state.txt"))["stdout"] == "first\n"

        with pytest.raises(BackendError) as unknown:
            await backend.create(spec_for(request(snapshot=SnapshotRef(id=group, tag="no-such-snapshot"))), 30)
        assert unknown.value.status == 404
        with pytest.raises(BackendError) as empty_group:
            await backend.create(spec_for(request(snapshot=SnapshotRef(id="999999"))), 30)
        assert empty_group.value.status == 404

        await backend.delete_snapshot(group)
        assert not await backend.snapshot_exists(group)
        for handle in (source, restored, pinned, by_id):
            await backend.delete(handle)

    run(scenario, config)


def test_snapshots_disabled_answer_400_with_the_reason(k8s_sim: SimulatorProcess) -> None:
    async def by_config(backend: KubernetesBackend) -> None:
        assert not backend.capabilities.snapshots
        handle = await backend.create(spec_for(request()), 30)
        with pytest.raises(SnapshotsUnsupported) as off:
            await backend.snapshot(handle, "1")
        assert off.value.status == 400 and "configuration" in off.value.message
        await backend.delete(handle)

    run(by_config, k8s_sim.backend_config(snapshots=False))

    async def by_cluster(backend: KubernetesBackend) -> None:
        assert not backend.capabilities.snapshots
        with pytest.raises(SnapshotsUnsupported) as lacking:
            await backend.create(spec_for(request(snapshot=SnapshotRef(id="1"))), 30)
        assert lacking.value.status == 400
        assert "does not serve podsnapshot.gke.io/v1" in lacking.value.message
        assert not await backend.snapshot_exists("1")

    k8s_sim.set_snapshots(False)
    try:
        run(by_cluster, k8s_sim.backend_config(snapshots=True))
    finally:
        k8s_sim.set_snapshots(True)


# -- builds and node holders ------------------------------------------------------------------------


def test_image_builds_run_as_jobs_and_report_their_status(k8s_config: KubernetesBackendConfig) -> None:
    yaml_text = """
images:
  - name: good-env
    base: python:3.12-slim
    commands: ["pip install pytest"]
  - name: broken-env
    base: registry.example.com/does-not-exist:1
"""
    good, broken = parse_build_yaml(yaml_text, registry="registry.example.com/idegym")
    assert good.tag.startswith("registry.example.com/idegym/good-env:")

    async def scenario(backend: KubernetesBackend) -> None:
        builder = backend.builder
        good_job = await builder.submit(good)
        status = await builder.status(good_job)
        assert status.status in (Status.IN_PROGRESS, Status.SUCCESS) and status.tag == good.tag
        configmap = await asyncio.to_thread(inspect(backend).core.read_namespaced_config_map, f"{good_job}-context",
                                            "idegym")
        assert configmap.data["Dockerfile"].startswith("FROM python:3.12-slim")
        assert configmap.metadata.owner_references[0].name == good_job
        done = await builder.wait(good_job, timeout=30)
        assert done.status == Status.SUCCESS and done.tag == good.tag
        assert f"Pushed {good.tag}" in await builder.logs(good_job)

        broken_job = await builder.submit(broken)
        failed = await builder.wait(broken_job, timeout=30)
        assert failed.status == Status.FAILURE
        assert "BackoffLimitExceeded" in failed.details or "backoff limit" in failed.details
        assert "MANIFEST_UNKNOWN" in failed.details  # the builder's own error, from its log tail

        lines: list[str] = []
        assert await builder.build(good, lines.append) == good.tag
        assert any("Pushed" in line for line in lines)
        with pytest.raises(BackendError, match="MANIFEST_UNKNOWN"):
            await builder.build(broken, lines.append)
        with pytest.raises(BackendError) as unknown:
            await builder.status("idegym-build-no-such-job")
        assert unknown.value.status == 404

    run(scenario, k8s_config)


def test_nodes_count_keeps_one_holder_pod_per_node(k8s_config: KubernetesBackendConfig) -> None:
    async def scenario(backend: KubernetesBackend) -> None:
        try:
            await holders(backend)
        finally:
            await backend.release_nodes("client-a", 0)

    async def holders(backend: KubernetesBackend) -> None:
        await backend.reserve_nodes("client-a", 2, timeout=20)
        holder = [p for p in backend.informers["idegym"].pods()
                  if p["metadata"]["labels"].get("app.kubernetes.io/component") == "node-holder"]
        assert len(holder) == 2 and len({p["spec"]["nodeName"] for p in holder}) == 2
        with pytest.raises(BackendError) as too_many:
            await backend.reserve_nodes("client-a", 4, timeout=2)  # the simulator has 3 nodes
        assert "didn't match pod anti-affinity rules" in too_many.value.message
        await backend.release_nodes("client-a", 1)

        async def one_left() -> bool:
            pods = [p for p in backend.informers["idegym"].pods()
                    if p["metadata"]["labels"].get("app.kubernetes.io/component") == "node-holder"]
            return len(pods) == 1
        assert await wait_for(one_left)
        await backend.release_nodes("client-a", 0)

        async def none_left() -> bool:
            return not [p for p in backend.informers["idegym"].pods()
                        if p["metadata"]["labels"].get("app.kubernetes.io/component") == "node-holder"]
        assert await wait_for(none_left)

    run(scenario, k8s_config)


def test_the_documented_role_grants_every_call_the_backend_made_and_nothing_unused(tmp_path: Path) -> None:
    """On a simulator of its own, a tour of every path of the backend (servers created, called
    through the API server's proxy, restarted, snapshotted and restored, failing to start, image
    builds, node holders, a bare Pod, the orphan sweep): every (verb, resource) its client sent is granted by
    the Role in docs/kubernetes.md, and the Role grants nothing unused. Can fail: without the tour's
    node holders and bare Pod, ``create pods`` and ``patch poddisruptionbudgets`` went unused. (Every other test here is
    checked against the Role too, by ``each_test_is_granted_and_leaves_no_pod``.)"""
    sim = SimulatorProcess(tmp_path, snapshots=True)
    try:
        run(_tour, sim.backend_config(snapshots=True))
        used = backend_calls(sim)
    finally:
        sim.stop()
    assert not ungranted(used), ungranted(used)
    assert {u for u in used if u[2] == "services/proxy"}, "no call went through the API server's proxy"
    # granted for paths the tour does not take: cleaning up a build whose ConfigMap could not be
    # created, and observing a bare-Pod server whose pod left the informer's cache
    rarely = {("delete", "batch", "jobs"), ("get", "", "pods")}
    assert documented_role() - used <= rarely, sorted(documented_role() - used - rarely)


async def _tour(backend: KubernetesBackend) -> None:
    spec = spec_for(request())
    handle = await backend.create(spec, 30)
    assert (await bash(backend, handle, "echo toured > state.txt"))["exit_code"] == 0
    group = str(spec.server_id)
    await backend.snapshot(handle, group)
    restored = await backend.create(spec_for(request(snapshot=SnapshotRef(id=group))), 30)
    assert (await bash(backend, restored, "cat state.txt"))["stdout"] == "toured\n"
    handle = await backend.restart(handle, spec, 30)
    assert (await backend.observe(handle)).ready
    await backend.delete_snapshot(group)
    with pytest.raises(BackendError, match="ContainersNotReady"):  # the reason, from the pod's events
        await backend.create(spec_for(request(image_tag="registry.example.com/never-ready:1")), 2)
    (image,) = parse_build_yaml("images:\n  - name: toured\n    base: python:3.12-slim\n",
                                registry="registry.example.com/idegym")
    job = await backend.builder.submit(image)
    assert (await backend.builder.wait(job, timeout=30)).status == Status.SUCCESS
    assert "Pushed" in await backend.builder.logs(job)
    await backend.reserve_nodes("tourist", 2, timeout=20)
    await backend.release_nodes("tourist", 1)
    await backend.release_nodes("tourist", 0)
    bare = await backend.create(spec_for(request(pod_overrides={"restartPolicy": "Never"})), 30)
    assert bare.data["kind"] == "Pod"
    await backend.delete(bare)
    leaked = spec_for(request())
    await asyncio.to_thread(inspect(backend).core.create_namespaced_service, "idegym",
                            build_server_manifests(leaked, backend.settings, namespace="idegym").service)
    for name in await backend.list_names() - {handle.name, restored.name}:
        await backend.delete_name(name)
    for each in (handle, restored):
        await backend.delete(each)
    assert await backend.list_names() == set()


def test_deploy_manifests_validate_and_match_the_docs() -> None:
    """deploy/kubernetes/control-plane.yaml is valid Kubernetes and is what the docs show."""
    root = Path(__file__).resolve().parent.parent
    text = (root / "deploy" / "kubernetes" / "control-plane.yaml").read_text()
    docs = (root / "docs" / "kubernetes.md").read_text()
    shown = re.search(r"## Deploying the control plane in a cluster.*?```yaml\n(.*?)```", docs, re.S).group(1)
    assert text.split("\n", 1)[1] == shown
    kinds = []
    for obj in yaml.safe_load_all(text):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        kinds.append(obj["kind"])
    assert {"ServiceAccount", "Role", "RoleBinding", "Deployment", "Service"} <= set(kinds)
