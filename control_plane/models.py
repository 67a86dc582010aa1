"""Wire shapes of the control plane, defined once (``specs/control-plane-api.yaml``; the
Kubernetes shapes are in ``pod_spec.py``). Requests ignore
unknown keys and take ``null`` for optional fields; responses keep the exact field names the
published ``idegym-client`` 0.13.1 parses.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any
from uuid import UUID

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from sandbox_server.models import CapabilitiesResponse, Status  # noqa: F401 - re-exported wire shapes

from .image_tags import IMAGE_TAG, MAX_TAG_LENGTH
from .pod_spec import (
    K8S_NAME,
    LABEL_VALUE,
    MAX_ANNOTATION_BYTES,
    RESERVED_ANNOTATIONS,
    RESERVED_LABELS,
    KubernetesEnvFromSource,
    KubernetesPodOverrides,
    KubernetesResources,
    KubernetesVolume,
    KubernetesVolumeMount,
    SnapshotRef,
    check_label_key,
    reserved,
)

# -- enumerations -------------------------------------------------------------------------------


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

    @classmethod
    def _missing_(cls, value: object) -> ServerReuseStrategy:
        raise ValueError(f"{value!r} is not a reuse strategy: use one of {', '.join(m.value for m in cls)} "
                         "(RESET: project restored, RESTART: a fresh sandbox, NONE: a new server)")


class ServerKind(StrEnum):
    IDEGYM = "idegym"
    OPENENV = "openenv"


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


# -- client requests and responses ----------------------------------------------------------------


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


# -- server requests and responses ----------------------------------------------------------------


def resources_key(resources: KubernetesResources | dict | None) -> str | None:
    """Limits and requests in one comparable spelling (a stored request's, or a new one's)."""
    if resources is None:
        return None
    return KubernetesResources.model_validate(resources).model_dump_json(exclude_none=True)


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
    network_of: int | None = Field(None, ge=1, description=(
        "the id of another live server of this client whose network namespace this one joins (a task's "
        "services: each reaches the others on 127.0.0.1); local backend only"))

    @field_validator("labels", "annotations", "pod_overrides", "volumes", "volume_mounts", "env_from", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any, info: Any) -> Any:
        if value is None:
            return {} if info.field_name in ("labels", "annotations", "pod_overrides") else []
        return value

    @field_validator("node_selector")
    @classmethod
    def _node_selector(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key, val in (value or {}).items():
            check_label_key(key, "node_selector")
            if len(val) > 63 or not LABEL_VALUE.match(val):
                raise ValueError(f"node_selector value {val!r} for {key!r} is not a valid label value")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            check_label_key(key, "label")
            if reserved(key, RESERVED_LABELS):
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
            check_label_key(key, "annotation")
            if reserved(key, RESERVED_ANNOTATIONS):
                raise ValueError(
                    f"annotation {key!r} is managed by IdeGym (cluster-autoscaler.kubernetes.io/safe-to-evict, "
                    "podsnapshot.gke.io/*, prometheus.io/*); choose another key"
                )
            total += len(key.encode()) + len(val.encode())
        if total > MAX_ANNOTATION_BYTES:
            raise ValueError(f"annotations total {total} bytes, over the {MAX_ANNOTATION_BYTES}-byte limit")
        return value

    def reuse_key(self) -> tuple:
        """What a FINISHED server must match (with the client name) to be reused: a server started
        with other limits is not the sandbox this request asks for."""
        return (self.image_tag, self.runtime_class_name, self.run_as_root, self.server_kind.value, self.server_name,
                resources_key(self.resources))


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


# -- snapshots -----------------------------------------------------------------------------------


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


# -- fork ------------------------------------------------------------------------------------------

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


class ServerQuery(Request):
    """The query string of a server's routes: whose server it is."""

    client_id: UUID


class ListServersQuery(ServerQuery):
    include_terminal: bool = False


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


# -- images and jobs -----------------------------------------------------------------------------


class BuildFromYamlRequest(Request):
    namespace: str = "idegym"
    yaml_content: str
    client_id: UUID | None = None  # whose builds these are, for per-client quotas and metrics


# -- uploads (uploads.py) ---------------------------------------------------------------------------

UPLOAD_DIGEST = r"^sha256:[0-9a-f]{64}$"
MAX_DIGESTS = 1000


class MissingUploadsRequest(Request):
    digests: list[Annotated[str, Field(pattern=UPLOAD_DIGEST)]] = Field(max_length=MAX_DIGESTS)


class MissingUploadsResponse(Response):
    missing: list[str]  # of the digests asked, those this tenant must send (PUT /api/uploads/{digest})


class UploadQuery(Request):
    client_id: UUID | None = None  # the sending client, for per-client quotas and metrics


class UploadResponse(Response):
    digest: str
    stored: bool  # False: this tenant held it already, nothing was read
    bytes: int  # of the tar received
    files: int = 0


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


# -- operations and forwarding ---------------------------------------------------------------------


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
