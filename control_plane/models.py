"""Wire shapes of the control plane, defined once (``seeds/control-plane-api.yaml`` and the wire
contract §3–§6, §11–§12). Requests ignore unknown keys and take ``null`` for optional fields;
responses keep the exact field names the published ``idegym-client`` 0.13.1 parses.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any
from uuid import UUID

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from sandbox_server.models import CapabilitiesResponse, Status  # noqa: F401 - re-exported wire shapes

from .image_tags import IMAGE_TAG, MAX_TAG_LENGTH
from .quantities import cpu_millicores, format_cpu, format_memory, memory_bytes

# -- enumerations (§11) --------------------------------------------------------------------------


class AvailabilityStatus(StrEnum):
    ALIVE = "ALIVE"
    FINISHED = "FINISHED"
    REUSED = "REUSED"
    FAILED_TO_START = "FAILED_TO_START"
    STOPPED = "STOPPED"
    KILLED = "KILLED"
    CRASHED = "CRASHED"
    DELETION_FAILED = "DELETION_FAILED"
    RESTART_FAILED = "RESTART_FAILED"


class AsyncOperationStatus(StrEnum):
    SCHEDULED = "SCHEDULED"
    IN_PROGRESS = "IN_PROGRESS"
    FAILED = "FAILED"
    SUCCEEDED = "SUCCEEDED"
    CANCELLED = "CANCELLED"
    FINISHED_BY_WATCHER = "FINISHED_BY_WATCHER"


class AsyncOperationType(StrEnum):
    REGISTER_CLIENT_WITH_NODES = "REGISTER_CLIENT_WITH_NODES"
    START_SERVER = "START_SERVER"
    RESTART_SERVER = "RESTART_SERVER"
    STOP_SERVER = "STOP_SERVER"
    STOP_CLIENT = "STOP_CLIENT"
    FORWARD_REQUEST = "FORWARD_REQUEST"
    SNAPSHOT_SERVER = "SNAPSHOT_SERVER"
    FORK_SERVER = "FORK_SERVER"


class ServerReuseStrategy(StrEnum):
    NONE = "NONE"
    RESTART = "RESTART"
    RESET = "RESET"


class ServerKind(StrEnum):
    IDEGYM = "idegym"
    OPENENV = "openenv"


# -- scalar rules (§12.1) ------------------------------------------------------------------------

K8S_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[a-zA-Z0-9]([a-zA-Z0-9._-]{0,61}[a-zA-Z0-9])?$"
)
LABEL_VALUE = re.compile(r"^([a-zA-Z0-9]([a-zA-Z0-9._-]*[a-zA-Z0-9])?)?$")
RESERVED_LABELS = ("app", "app.kubernetes.io/", "idegym.jetbrains.com/")
RESERVED_ANNOTATIONS = ("cluster-autoscaler.kubernetes.io/safe-to-evict", "podsnapshot.gke.io/", "prometheus.io/")
MAX_ANNOTATION_BYTES = 262_144


def _check_label_key(key: str, what: str) -> None:
    prefix = key.rsplit("/", 1)[0] if "/" in key else ""
    if not 1 <= len(key) <= 317 or len(prefix) > 253 or not LABEL_KEY.match(key):
        raise ValueError(f"{what} key {key!r} is not a valid Kubernetes label key")


def _reserved(key: str, reserved: tuple[str, ...]) -> bool:
    return any(key == r or (r.endswith("/") and key.startswith(r)) for r in reserved)


INT64 = 1 << 63


class Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="after")
    def _integers_fit_the_database(self) -> Request:
        """Ids, counts and timeouts end up in SQLite INTEGER columns or in time arithmetic: a
        number beyond 64 bits is a request error (422), not an OverflowError deep inside."""
        for name, value in self:
            if isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
                raise ValueError(f"{name} is out of range (a 64-bit integer is expected)")
        return self


class Response(BaseModel):
    model_config = ConfigDict(extra="ignore")


class K8sModel(BaseModel):
    """Pod-spec pass-through: snake_case or camelCase in, extra keys kept (§12.3)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, alias_generator=None)

    def to_k8s(self) -> dict[str, Any]:
        """camelCase, nulls dropped, extra keys verbatim (they are already camelCase)."""
        return _camel_dump(self.model_dump(by_alias=True, exclude_none=True))


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _camel_dump(value: Any) -> Any:
    if isinstance(value, dict):
        return {(_camel(k) if "_" in k else k): _camel_dump(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_camel_dump(v) for v in value]
    return value


def _alias(name: str) -> Any:
    return Field(None, validation_alias=AliasChoices(name, _camel(name)), serialization_alias=_camel(name))


class SecretVolumeSource(K8sModel):
    secret_name: str | None = _alias("secret_name")
    items: list[dict[str, Any]] | None = None
    default_mode: int | None = _alias("default_mode")
    optional: bool | None = None


class ConfigMapVolumeSource(K8sModel):
    name: str | None = None
    items: list[dict[str, Any]] | None = None
    default_mode: int | None = _alias("default_mode")
    optional: bool | None = None


class EmptyDirVolumeSource(K8sModel):
    medium: str | None = None
    size_limit: str | None = _alias("size_limit")


class PersistentVolumeClaimVolumeSource(K8sModel):
    claim_name: str = Field(validation_alias=AliasChoices("claim_name", "claimName"), serialization_alias="claimName")
    read_only: bool | None = _alias("read_only")


class KubernetesVolume(K8sModel):
    name: str
    secret: SecretVolumeSource | None = None
    config_map: ConfigMapVolumeSource | None = _alias("config_map")
    empty_dir: EmptyDirVolumeSource | None = _alias("empty_dir")
    persistent_volume_claim: PersistentVolumeClaimVolumeSource | None = _alias("persistent_volume_claim")


class KubernetesVolumeMount(K8sModel):
    name: str
    mount_path: str = Field(validation_alias=AliasChoices("mount_path", "mountPath"), serialization_alias="mountPath")
    read_only: bool | None = _alias("read_only")
    sub_path: str | None = _alias("sub_path")
    sub_path_expr: str | None = _alias("sub_path_expr")
    mount_propagation: str | None = _alias("mount_propagation")


class SecretEnvSource(K8sModel):
    name: str | None = None
    optional: bool | None = None


class ConfigMapEnvSource(K8sModel):
    name: str | None = None
    optional: bool | None = None


class KubernetesEnvFromSource(K8sModel):
    prefix: str | None = None
    secret_ref: SecretEnvSource | None = _alias("secret_ref")
    config_map_ref: ConfigMapEnvSource | None = _alias("config_map_ref")


class KubernetesToleration(K8sModel):
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = _alias("toleration_seconds")


class KubernetesHostAlias(K8sModel):
    ip: str | None = None
    hostnames: list[str] | None = None


class KubernetesPodOverrides(K8sModel):
    tolerations: list[KubernetesToleration] | None = None
    host_aliases: list[KubernetesHostAlias] | None = _alias("host_aliases")
    node_selector: dict[str, str] | None = _alias("node_selector")
    runtime_class_name: str | None = _alias("runtime_class_name")
    priority_class_name: str | None = _alias("priority_class_name")
    scheduler_name: str | None = _alias("scheduler_name")
    termination_grace_period_seconds: int | None = _alias("termination_grace_period_seconds")
    automount_service_account_token: bool | None = _alias("automount_service_account_token")
    restart_policy: str | None = _alias("restart_policy")
    dns_policy: str | None = _alias("dns_policy")

    @model_validator(mode="after")
    def _invariants(self) -> KubernetesPodOverrides:
        extra = self.model_extra or {}
        if "serviceAccountName" in extra or "service_account_name" in extra or "serviceAccount" in extra:
            raise ValueError("pod_overrides may not set serviceAccountName; use service_account_name")
        for key in ("containers", "initContainers"):
            for container in extra.get(key) or []:
                if isinstance(container, dict) and container.get("name") == "server":
                    raise ValueError(
                        "pod_overrides may add sidecar containers but not replace the managed 'server' container"
                    )
        return self


class ResourceQuantities(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    cpu: str | None = None
    memory: str | None = None
    ephemeral_storage: str | None = Field(
        None, validation_alias=AliasChoices("ephemeral_storage", "ephemeral-storage"),
        serialization_alias="ephemeral-storage",
    )

    @field_validator("cpu", mode="before")
    @classmethod
    def _cpu(cls, value: Any) -> Any:
        return None if value is None else format_cpu(cpu_millicores(value))

    @field_validator("memory", "ephemeral_storage", mode="before")
    @classmethod
    def _mem(cls, value: Any) -> Any:
        return None if value is None else format_memory(memory_bytes(value))


class KubernetesResources(BaseModel):
    model_config = ConfigDict(extra="forbid")
    requests: ResourceQuantities | None = None
    limits: ResourceQuantities | None = None

    @model_validator(mode="after")
    def _limits_cover_requests(self) -> KubernetesResources:
        if self.requests and self.limits:
            for name, parse in (("cpu", cpu_millicores), ("memory", memory_bytes),
                                ("ephemeral_storage", memory_bytes)):
                req, lim = getattr(self.requests, name), getattr(self.limits, name)
                if req is not None and lim is not None and parse(lim) < parse(req):
                    raise ValueError(f"limits.{name} ({lim}) is below requests.{name} ({req})")
        return self

    def effective(self, name: str) -> str | None:
        """The limit if set, else the request (what a sandbox is held to)."""
        for section in (self.limits, self.requests):
            if section is not None and getattr(section, name) is not None:
                return getattr(section, name)
        return None


class SnapshotRef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str
    tag: str | None = None


# -- client requests and responses (§5.2–§5.5) ----------------------------------------------------


class RegisterClientRequest(Request):
    name: str = Field(min_length=1, max_length=253)
    nodes_count: int = Field(0, ge=0)
    namespace: str = "idegym"


class RegisteredClientResponse(Response):
    id: UUID
    name: str | None = None
    nodes_count: int
    namespace: str
    last_heartbeat_time: int
    availability: AvailabilityStatus
    created_at: int
    operation_id: int | None = None


class SendClientHeartbeatRequest(Request):
    client_id: UUID
    availability: AvailabilityStatus = AvailabilityStatus.ALIVE


class ClientScopedRequest(Request):
    client_id: UUID
    namespace: str = "idegym"


class StopClientRequest(ClientScopedRequest):
    pass


class FinishClientRequest(ClientScopedRequest):
    pass


class StopClientResponse(Response):
    operation_id: int | None = None


# -- server requests and responses (§5.6–§5.16) ---------------------------------------------------


class StartServerRequest(Request):
    client_id: UUID
    namespace: str = "idegym"
    image_tag: str = Field(min_length=1, max_length=MAX_TAG_LENGTH, pattern=IMAGE_TAG.pattern)
    server_name: str = Field("default-idegym-server", min_length=1, max_length=63, pattern=K8S_NAME.pattern)
    runtime_class_name: str | None = None
    run_as_root: bool = False
    service_port: int = Field(80, ge=0, le=65535)
    container_port: int = Field(8000, ge=0, le=65535)
    resources: KubernetesResources | None = None
    node_selector: dict[str, str] | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    volumes: list[KubernetesVolume] = Field(default_factory=list)
    volume_mounts: list[KubernetesVolumeMount] = Field(default_factory=list)
    env_from: list[KubernetesEnvFromSource] = Field(default_factory=list)
    service_account_name: str | None = None
    pod_overrides: KubernetesPodOverrides = Field(default_factory=KubernetesPodOverrides)
    server_start_wait_timeout_in_seconds: int = Field(300, ge=0)
    reuse_strategy: ServerReuseStrategy = ServerReuseStrategy.RESET
    server_kind: ServerKind = ServerKind.IDEGYM
    snapshot: SnapshotRef | None = None
    max_restarts: int = Field(0, ge=0)

    @field_validator("labels", "annotations", "volumes", "volume_mounts", "env_from", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any, info: Any) -> Any:
        if value is None:
            return {} if info.field_name in ("labels", "annotations") else []
        return value

    @field_validator("pod_overrides", mode="before")
    @classmethod
    def _none_overrides(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("node_selector")
    @classmethod
    def _node_selector(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key, val in (value or {}).items():
            _check_label_key(key, "node_selector")
            if len(val) > 63 or not LABEL_VALUE.match(val):
                raise ValueError(f"node_selector value {val!r} for {key!r} is not a valid label value")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            _check_label_key(key, "label")
            if _reserved(key, RESERVED_LABELS):
                raise ValueError(
                    f"label {key!r} is managed by IdeGym (app, app.kubernetes.io/*, idegym.jetbrains.com/*); "
                    "choose another key"
                )
            if len(val) > 63 or not LABEL_VALUE.match(val):
                raise ValueError(f"label value {val!r} for {key!r} is not a valid label value")
        return value

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, value: dict[str, str]) -> dict[str, str]:
        total = 0
        for key, val in value.items():
            _check_label_key(key, "annotation")
            if _reserved(key, RESERVED_ANNOTATIONS):
                raise ValueError(
                    f"annotation {key!r} is managed by IdeGym (cluster-autoscaler.kubernetes.io/safe-to-evict, "
                    "podsnapshot.gke.io/*, prometheus.io/*); choose another key"
                )
            total += len(key.encode()) + len(val.encode())
        if total > MAX_ANNOTATION_BYTES:
            raise ValueError(f"annotations total {total} bytes, over the {MAX_ANNOTATION_BYTES}-byte limit")
        return value

    def reuse_key(self) -> tuple:
        """What a FINISHED server must match (with the client name) to be reused."""
        return (self.image_tag, self.runtime_class_name, self.run_as_root, self.server_kind.value, self.server_name)


class StartServerResponse(Response):
    namespace: str
    client_id: UUID
    operation_id: int | None = None
    server_id: int | None = None
    server_name: str | None = None
    generated_name: str | None = None
    service_name: str | None = None
    image_tag: str | None = None
    reused: bool = False
    need_to_reset: bool = False


class ServerScopedRequest(Request):
    client_id: UUID
    namespace: str = "idegym"
    server_id: int


class StopServerRequest(ServerScopedRequest):
    pass


class FinishServerRequest(ServerScopedRequest):
    pass


class RestartServerRequest(ServerScopedRequest):
    server_start_wait_timeout_in_seconds: int = Field(300, ge=0)


class KeepaliveServerRequest(ServerScopedRequest):
    minutes: float = Field(15.0, gt=0, le=1440)


class ServerActionResponse(Response):
    server_name: str
    message: str
    operation_id: int | None = None


class KeepaliveServerResponse(Response):
    server_id: int
    keepalive_until: int = Field(ge=0)
    minutes: float = Field(ge=0)


class ServerSummary(Response):
    server_id: int
    server_name: str | None = None
    generated_name: str
    namespace: str
    availability: AvailabilityStatus
    usable: bool
    image_tag: str | None = None
    created_at: int = Field(ge=0)
    last_activity_at: int = Field(ge=0)
    keepalive_until: int | None = None
    details: str | None = None


class ListServersResponse(Response):
    client_id: UUID
    servers: list[ServerSummary] = Field(default_factory=list)


class ServerStatusResponse(ServerSummary):
    idle_seconds: float = Field(ge=0)
    pod_phase: str | None = None
    pod_ready: bool | None = None
    restarts: int = 0
    max_restarts: int = 0


# -- snapshots (§5.14–§5.16) ---------------------------------------------------------------------


class CreateSnapshotRequest(Request):
    client_id: UUID
    server_id: int
    namespace: str = "idegym"


class CreateSnapshotResponse(Response):
    server_id: int
    server_name: str
    snapshot_id: str | None = None
    snapshot_tag: str | None = None
    operation_id: int | None = None


# -- fork (issue 17) -------------------------------------------------------------------------------

MAX_FORK_COUNT = 64


class ForkServerRequest(Request):
    client_id: UUID
    namespace: str = "idegym"
    server_id: int
    count: int = Field(ge=1, le=MAX_FORK_COUNT, description=f"children to make (1 to {MAX_FORK_COUNT})")
    server_name: str | None = Field(None, min_length=1, max_length=63, pattern=K8S_NAME.pattern,
                                    description="the children's server name (default: the parent's)")


class ForkedServer(Response):
    server_id: int
    generated_name: str
    service_name: str | None = None  # the backend's name of its sandbox (as StartServerResponse's)


class ForkServerResponse(Response):
    server_id: int  # the parent's
    server_name: str  # the parent's generated name
    operation_id: int | None = None
    servers: list[ForkedServer] = Field(default_factory=list)  # the children, once the fork is done


class PrepareSnapshotsRequest(Request):
    requests: list[StartServerRequest]


class PrepareSnapshotsResponse(Response):
    request_id: str


class SnapshotJobResult(Response):
    request_hash: str
    status: Status
    snapshot_name: str | None = None
    snapshot_tag: str | None = None
    details: str | None = None


class PrepareSnapshotsStatusResponse(Response):
    request_id: str
    status: str
    total_requested: int
    succeeded: int
    failed: int
    results: list[SnapshotJobResult] | None = None


class SnapshotJobStatusResponse(Response):
    job_id: str
    status: Status
    snapshot_name: str | None = None
    snapshot_tag: str | None = None
    details: str | None = None


class SnapshotExistsRequest(Request):
    namespace: str = "idegym"
    image_tag: str
    server_name: str = "default-idegym-server"
    runtime_class_name: str | None = None
    run_as_root: bool = False
    server_kind: ServerKind = ServerKind.IDEGYM


class SnapshotExistsResponse(Response):
    exists: bool
    snapshot_name: str | None = None
    snapshot_tag: str | None = None


# -- images and jobs (§5.17–§5.18) ---------------------------------------------------------------


class BuildFromYamlRequest(Request):
    namespace: str = "idegym"
    yaml_content: str


class BuildFromYamlResponse(Response):
    job_names: list[str]


class JobStatusResponse(Response):
    id: int = 0
    job_name: str
    status: Status
    created_at: int = 0
    updated_at: int = 0
    details: str | None = None
    tag: str | None = None
    request_id: str | None = None


# -- operations and forwarding (§3.1, §4, §6) -----------------------------------------------------


class ErrorResponse(Response):
    status_code: int | None = None
    headers: dict[str, str] | None = Field(default_factory=dict)
    body: str | None = None


class AsyncOperationStatusResponse(Response):
    id: int
    request_type: AsyncOperationType
    status: AsyncOperationStatus
    request: str | None = None
    result: str | None = None
    client_id: UUID | None = None
    server_id: int | None = None
    orchestrator_pod: str | None = None
    scheduled_at: int
    started_at: int | None = None
    finished_at: int | None = None


class ForwardRequestResponse(Response):
    async_operation_id: int | None = None
    status_code: int | None = None
    headers: dict[str, str] | None = Field(default_factory=dict)
    body: str | None = None


class HealthCheckResponse(Response):
    status: str = "healthy"
    message: str | None = None
