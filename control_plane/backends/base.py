"""The contract between the control plane and the places sandboxes live.

A backend creates, observes, restarts, snapshots and deletes *sandboxes*: one sandbox server
each (``sandbox_server`` for ``idegym`` servers, any HTTP/WebSocket app for ``openenv`` ones).
The routes never know which backend they talk to. Everything a backend needs to find a sandbox
again after a control-plane restart is in its ``SandboxHandle`` (persisted as JSON).

    Backend
    ├── backends.local.LocalBackend            processes on this host (bubblewrap, overlayfs, cgroups)
    └── backends.kubernetes.KubernetesBackend  Deployment + Service + PodDisruptionBudget per server
"""

from __future__ import annotations

import abc
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import StatusError
from ..models import KubernetesResources, ServerKind, StartServerRequest
from ..quantities import cpu_millicores, memory_bytes

if TYPE_CHECKING:
    from ..images import Uploads


class BackendError(StatusError):
    """A backend operation failed; ``status`` is the HTTP-equivalent code for the client."""


class ImageNotFound(BackendError):
    def __init__(self, message: str) -> None:
        super().__init__(message, 404)


class SnapshotsUnsupported(BackendError):
    def __init__(self, message: str) -> None:
        super().__init__(message, 400)


class ForkUnsupported(BackendError):
    def __init__(self, message: str) -> None:
        super().__init__(message, 400)


class NodesUnsupported(BackendError):
    def __init__(self, message: str) -> None:
        super().__init__(message, 400)


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, each flag declared once here with its default. The control plane
    asks ``Backend.capabilities`` and calls the operations it allows; it never probes a backend
    for methods or attributes."""

    snapshots: bool = False  # snapshot, snapshot_exists, delete_snapshot work
    fork: bool = False  # fork works
    # A sandbox made ahead of demand can stand in for a request's: the control plane keeps a warm
    # pool. Off where a sandbox carries per-request labels, volumes or its server's own name.
    warm_pool: bool = True
    # restart keeps the server's objects (same name, same address); else the control plane
    # replaces the sandbox (a new one from the pool, the old deleted).
    restart_in_place: bool = False
    node_reservation: bool = False  # reserve_nodes and release_nodes keep nodes for a client


@dataclass(frozen=True)
class Limits:
    """Resources a sandbox is held to (the limit, else the request); ``None`` means unbounded."""

    cpu_millicores: int | None = None
    memory_bytes: int | None = None
    storage_bytes: int | None = None

    @classmethod
    def from_request(cls, resources: KubernetesResources | None) -> Limits:
        if resources is None:
            return cls()
        cpu = resources.effective("cpu")
        mem = resources.effective("memory")
        storage = resources.effective("ephemeral_storage")
        return cls(
            cpu_millicores=cpu_millicores(cpu) if cpu else None,
            memory_bytes=memory_bytes(mem) if mem else None,
            storage_bytes=memory_bytes(storage) if storage else None,
        )


@dataclass
class SandboxSpec:
    """What to run: derived from a ``StartServerRequest`` plus the server's identity."""

    server_id: int
    generated_name: str
    namespace: str
    image_tag: str
    server_kind: ServerKind
    run_as_root: bool
    runtime_class_name: str | None
    container_port: int
    service_port: int
    limits: Limits
    max_restarts: int = 0
    snapshot_source: str | None = None  # a snapshot id to restore the filesystem from
    request: StartServerRequest | None = None  # the full request, for backends that use more of it
    isolated_runs: int = 0  # the code runner's sandboxes: this many runs at once, each in namespaces of its own
    network_peer: SandboxHandle | None = None  # join this sandbox's network namespace (the request's network_of)

    @classmethod
    def from_request(cls, req: StartServerRequest, server_id: int, generated_name: str,
                     snapshot_source: str | None = None) -> SandboxSpec:
        return cls(
            server_id=server_id,
            generated_name=generated_name,
            namespace=req.namespace,
            image_tag=req.image_tag,
            server_kind=req.server_kind,
            run_as_root=req.run_as_root,
            runtime_class_name=req.runtime_class_name,
            container_port=req.container_port,
            service_port=req.service_port,
            limits=Limits.from_request(req.resources),
            max_restarts=req.max_restarts,
            snapshot_source=snapshot_source,
            request=req,
        )

    def pool_key(self) -> tuple[object, ...]:
        """Sandboxes with the same key are interchangeable before they are bound to a server."""
        return (self.image_tag, self.server_kind.value, self.run_as_root, self.runtime_class_name,
                self.container_port, self.limits, self.snapshot_source, self.isolated_runs)


@dataclass
class ForkChild:
    """One child of a fork: its spec (the parent's, with the child's server id and sandbox name in
    ``generated_name``) and, maybe, a ready warm-pool sandbox of the parent's kind that the
    backend may turn into the child instead of starting one."""

    spec: SandboxSpec
    warm: SandboxHandle | None = None


@dataclass
class SandboxAddress:
    """How to reach a sandbox's HTTP server: a Unix socket, or a base URL."""

    base_url: str
    unix_socket: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SandboxHandle:
    """A backend's record of one sandbox; persisted so a restarted control plane can adopt it."""

    backend: str
    name: str
    endpoint: SandboxAddress
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "name": self.name, "endpoint": self.endpoint.to_json(), "data": self.data}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SandboxHandle:
        return cls(raw["backend"], raw["name"], SandboxAddress(**raw["endpoint"]), raw.get("data", {}))


@dataclass
class Observation:
    """What a backend sees of a sandbox right now."""

    exists: bool
    running: bool
    ready: bool
    restarts: int = 0
    phase: str | None = None  # e.g. Running, Pending, Failed (the pod phase on Kubernetes)
    reason: str | None = None  # why it is not running/ready, in the backend's words


@dataclass
class SnapshotInfo:
    snapshot_id: str
    snapshot_tag: str | None
    size_bytes: int | None = None


class Backend(abc.ABC):
    """Where sandboxes live. All methods are coroutines unless stated; all are idempotent where
    the name says delete/close. Optional operations have a default here that says "not
    supported"; ``capabilities`` tells which ones a backend has."""

    name: str = "abstract"

    @property
    def capabilities(self) -> Capabilities:
        """What this backend can do now (snapshots and fork may depend on what ``start`` found)."""
        return Capabilities()

    async def start(self) -> None:  # noqa: B027 - optional hook: most backends need nothing here
        """Prepare (directories, clients). Called once before any other method."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release the backend's own resources. Sandboxes stay: they outlive the control plane."""

    async def settle(self) -> None:  # noqa: B027 - optional hook
        """Wait until no create is in flight (each ends made or undone); called at shutdown."""

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec, timeout: float, *, background: bool = False) -> SandboxHandle:
        """Create a sandbox and return once its server answers health checks.

        Raises ``ImageNotFound`` for an unknown image, ``BackendError`` (with the backend's own
        reason: image pull error, unschedulable, crash…) when it does not become ready in time.
        A failed create leaves nothing behind. ``background``: made ahead of demand (the warm
        pool); the backend may give it fewer resources than serving sandboxes until ``claim``.
        """

    def claim(self, handle: SandboxHandle) -> None:  # noqa: B027 - optional hook
        """A sandbox made with ``background`` is about to serve: give it its full share. Cheap:
        it is on the path of a start."""

    def hurry(self, name: str) -> None:  # noqa: B027 - optional hook
        """The sandbox ``name``, being made with ``background``, is waited for by a start (the
        warm pool ran dry): make the rest of it as a serving one is made. Cheap; nothing for a
        name not being made in the background."""

    @abc.abstractmethod
    async def delete(self, handle: SandboxHandle) -> None:
        """Remove the sandbox and everything it holds (processes, mounts, files, cgroups)."""

    async def retire(self, handle: SandboxHandle) -> None:
        """Delete a sandbox whose deletion nobody waits for (a restart's old one, a member the warm
        pool sheds or deletes as it closes): its processes are killed once this returns, and the
        backend may remove the rest later, off the path of the calls that follow; it does before
        ``close`` returns. A later failure is the backend's
        to log, and what is left the orphan sweep's. The default deletes it now."""
        await self.delete(handle)

    @abc.abstractmethod
    async def observe(self, handle: SandboxHandle) -> Observation:
        """Current state, cheaply (the watcher calls this every few seconds for every sandbox)."""

    async def restart(self, handle: SandboxHandle, spec: SandboxSpec, timeout: float) -> SandboxHandle:
        """Make the sandbox as fresh as a new one from its image (files, processes, /tmp), keeping
        the server identity. The default replaces it: create a new one, then delete the old."""
        fresh = await self.create(spec, timeout)
        await self.delete(handle)
        return fresh

    @abc.abstractmethod
    async def list_names(self) -> set[str]:
        """Names of every sandbox this backend currently has (for the orphan sweep)."""

    @abc.abstractmethod
    async def delete_name(self, name: str) -> None:
        """Remove a sandbox known only by name (an orphan with no database row)."""

    async def snapshot(self, handle: SandboxHandle, group: str) -> SnapshotInfo:
        """Capture the sandbox's filesystem state; ``group`` is the snapshot group (a server id)."""
        raise SnapshotsUnsupported(f"the {self.name} backend cannot take snapshots")

    async def snapshot_exists(self, snapshot_id: str) -> bool:
        return False

    async def delete_snapshot(self, snapshot_id: str) -> None:  # noqa: B027 - optional hook
        """Remove one snapshot (no-op when it does not exist)."""

    async def snapshot_bytes(self) -> int | None:
        """What this backend's snapshots take on disk (None: it cannot tell)."""
        return None

    async def fork(self, parent: SandboxHandle, children: list[ForkChild], timeout: float) -> list[SandboxHandle]:
        """New sandboxes, one per child (in order), each with ``parent``'s whole filesystem as it
        was at one instant and fresh processes; ``parent`` keeps running and sees none of them.
        All or nothing: on failure every child made is removed. A warm sandbox handed in (a
        pool member, made in the background and not claimed) is either claimed and turned into
        its child, or deleted."""
        raise ForkUnsupported(f"the {self.name} backend cannot fork sandboxes")

    def endpoint(self, handle: SandboxHandle) -> SandboxAddress:
        return handle.endpoint

    def image_builder(self) -> ImageBuilder | None:
        """The builder of this backend's images; None: it cannot build images."""
        return None

    async def reserve_nodes(self, client_name: str, count: int, timeout: float = 600.0) -> None:
        """Keep ``count`` nodes provisioned for ``client_name`` and wait until they are; 0 releases
        them (``capabilities.node_reservation``)."""
        raise NodesUnsupported(f"the {self.name} backend does not reserve nodes for clients")

    async def release_nodes(self, client_name: str, count: int = 0) -> None:  # noqa: B027 - optional hook
        """Shrink ``client_name``'s reservation to ``count`` nodes (0: none). A backend that
        reserves nothing has nothing to release."""


# -- images --------------------------------------------------------------------------------------


@dataclass
class ImageDefinition:
    """One entry of the ``images:`` list of a build YAML (see ``control_plane.images``)."""

    tag: str
    base: str
    project: dict[str, Any] | None = None
    commands: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    network: bool = False  # sandboxes of the image may use the network (and so may its build)
    raw: dict[str, Any] = field(default_factory=dict)
    # A Dockerfile build (``docs/images.md``): the Dockerfile's text, or a path in the build context.
    dockerfile: str | None = None
    dockerfile_path: str | None = None
    context: str | None = None  # a directory; default: the project, else empty
    build_args: dict[str, str] = field(default_factory=dict)
    project_dir: str | None = None  # where the image holds the project (default: its WORKDIR, else ~appuser/work)
    build_network: bool = False  # the build (RUN, commands) may use the network; its sandboxes only with `network`
    # The build context as the tar it was uploaded as (``uploads.py``), when it is an upload:
    # what a builder that ships the context elsewhere (a Kubernetes Job) sends.
    context_archive: str | None = None


class ImageBuilder(abc.ABC):
    """Builds images for one backend. ``log`` receives progress lines for the job's details."""

    @abc.abstractmethod
    async def build(self, definition: ImageDefinition, log: Any) -> str:
        """Build and store the image; return its tag. Raise ``BackendError`` with a reason."""

    @abc.abstractmethod
    async def exists(self, tag: str) -> bool:
        """Whether ``tag`` names an image this backend can start."""

    def runs_as_host_root(self, definition: ImageDefinition) -> bool:
        """Whether building ``definition`` runs its steps as the control plane host's root."""
        return False

    def parse_yaml(self, text: str, uploads: Uploads | None = None) -> list[ImageDefinition]:
        """A build YAML's ``images:`` as this builder reads them (``control_plane.images``); a
        builder that pushes to a registry rewrites the tags."""
        from ..images import parse_build_yaml  # images.py builds on this module

        return parse_build_yaml(text, uploads=uploads)
