"""Which backend a control plane runs on, with its settings: one typed value per backend, each
building its backend (``build()``). ``BackendConfig`` tells them apart by ``type``::

    BackendConfig
    ├── LocalBackendConfig        type "local": sandboxes on this host (backends.local)
    └── KubernetesBackendConfig   type "kubernetes": pods on a cluster (backends.kubernetes)

Light on purpose: the CLI reads flags into these without importing a backend (the Kubernetes
client library alone costs ~0.4 s); ``build()`` imports the one it makes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sandbox_server.env_settings import SettingsError

from ..constants import DEFAULT_DELETE_TIMEOUT, DEFAULT_ORPHAN_TTL, DEFAULT_STORAGE_BYTES, DEFAULT_STORAGE_INODES
from ..settings import ControlPlaneSettings

if TYPE_CHECKING:
    from .kubernetes import KubernetesBackend
    from .kubernetes.manifests import ManifestSettings
    from .local import LocalBackend

Addressing = Literal["service-dns", "api-proxy", "pod-ip"]


class LocalBackendConfig(BaseModel):
    """The local backend's settings (``LocalBackend`` says what each does)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["local"] = "local"
    state_dir: Path | None = None  # None: the control plane's (ControlPlaneConfig fills it in)
    isolation: Literal["auto", "bwrap", "none"] = "auto"
    network: bool = False  # sandboxes get the network unless their image says otherwise
    sandbox_storage: int = DEFAULT_STORAGE_BYTES  # bound of a sandbox's writes without ephemeral-storage (0: none)
    sandbox_inodes: int = DEFAULT_STORAGE_INODES  # bound of the files a sandbox makes (0: none)
    orphan_ttl: float = DEFAULT_ORPHAN_TTL  # a sandbox whose lease is this stale ends itself
    delete_timeout: float = Field(DEFAULT_DELETE_TIMEOUT, gt=0)  # a stop or delete taking longer fails
    image_registry: str | None = None  # a registry mirror buildah may pull other bases from
    image_cache: Path | None = None  # the shared cache of OCI bases (default ~/.cache/idegym/images)
    build_cache: bool = True  # builds are published to, and taken from, the host's build cache
    host_package_config: bool = True  # builds and networked sandboxes get the host's package sources

    def build(self) -> LocalBackend:
        from .local import LocalBackend
        from .local.oci.settings import OciSettings

        if self.state_dir is None:
            raise ValueError("LocalBackendConfig.state_dir is not set: the local backend keeps its images, "
                             "sandboxes and snapshots there")
        oci = OciSettings.from_env(registry=self.image_registry, cache_dir=self.image_cache,
                                   share_builds=self.build_cache)
        return LocalBackend(self.state_dir, isolation=self.isolation, network=self.network,
                            storage_bytes=self.sandbox_storage, storage_inodes=self.sandbox_inodes,
                            orphan_ttl=self.orphan_ttl, delete_timeout=self.delete_timeout, oci=oci,
                            host_package_config=self.host_package_config)


class KubernetesBackendConfig(BaseModel):
    """The Kubernetes backend's settings; ``from_env`` reads them from ``IDEGYM_K8S_<FIELD>``
    variables (tuples comma-separated, ``extra_env`` as ``K=V,K=V``), the CLI from ``--k8s-<field>``
    flags. docs/kubernetes.md says what each does."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["kubernetes"] = "kubernetes"
    namespace: str = "idegym"
    extra_namespaces: tuple[str, ...] = ()  # a request's namespace is honoured only if listed here
    kubeconfig: str | None = None  # default: $KUBECONFIG, ~/.kube/config
    context: str | None = None
    in_cluster: bool | None = None  # None: in-cluster when $KUBERNETES_SERVICE_HOST is set and no kubeconfig
    addressing: Addressing | None = None  # None: service-dns in a cluster, else api-proxy
    cluster_domain: str = "cluster.local"
    instance: str = "default"  # label value separating control planes that share a namespace
    snapshots: bool = False
    snapshot_timeout: float = 120.0
    snapshot_service_account: str | None = None
    builder_image: str = "gcr.io/kaniko-project/executor:v1.24.0"
    builder_args: tuple[str, ...] = ()
    registry: str | None = None
    registry_secret: str | None = None
    insecure_registry: bool = False
    build_timeout: float = 7200.0
    build_ttl_seconds: int = 3600
    image_pull_secrets: tuple[str, ...] = ()
    image_pull_policy: str = "IfNotPresent"
    pause_image: str = "registry.k8s.io/pause:3.10"
    readiness_period_seconds: int = 2
    unschedulable_timeout: float = 300.0
    delete_timeout: float = 60.0
    pod_disruption_budget: bool = True
    extra_env: dict[str, str] = Field(default_factory=dict)

    ENV_PREFIX: ClassVar[str] = "IDEGYM_K8S_"

    @field_validator("extra_namespaces", "builder_args", "image_pull_secrets", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        return tuple(x.strip() for x in value.split(",") if x.strip()) if isinstance(value, str) else value

    @field_validator("extra_env", mode="before")
    @classmethod
    def _pairs(cls, value: Any) -> Any:
        return dict(kv.split("=", 1) for kv in value.split(",") if "=" in kv) if isinstance(value, str) else value

    @classmethod
    def settings(cls) -> list[str]:
        """The fields a variable or flag sets (all but ``type``)."""
        return [name for name in cls.model_fields if name != "type"]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> KubernetesBackendConfig:
        """Fields from ``IDEGYM_K8S_<FIELD>`` of ``env`` (default: the control plane's settings,
        ``control_plane/settings.py``), then ``overrides``. A value that does not parse is a
        ``SettingsError`` naming its variable."""
        env = dict(ControlPlaneSettings.from_env().kubernetes if env is None else env)
        values: dict[str, Any] = {}
        for name in cls.settings():
            raw = env.get(cls.ENV_PREFIX + name.upper())
            if raw is not None:
                values[name] = raw
        if "kubeconfig" not in values and env.get("KUBECONFIG"):
            values["kubeconfig"] = env["KUBECONFIG"]
        try:
            cls(**values)
        except ValidationError as exc:
            error = exc.errors()[0]
            name = str(error["loc"][0])
            raise SettingsError(f"${cls.ENV_PREFIX}{name.upper()}={values.get(name)!r}: {error['msg']}") from None
        return cls(**{**values, **overrides})

    def resolved_in_cluster(self) -> bool:
        if self.in_cluster is not None:
            return self.in_cluster
        return bool(ControlPlaneSettings.from_env().kubernetes.get("KUBERNETES_SERVICE_HOST")) and not self.kubeconfig

    def resolved_addressing(self) -> str:
        return self.addressing or ("service-dns" if self.resolved_in_cluster() else "api-proxy")

    def manifest_settings(self) -> ManifestSettings:
        from .kubernetes.manifests import ManifestSettings

        return ManifestSettings(
            instance=self.instance, image_pull_policy=self.image_pull_policy,
            image_pull_secrets=tuple(self.image_pull_secrets), readiness_period_seconds=self.readiness_period_seconds,
            pod_disruption_budget=self.pod_disruption_budget, extra_env=tuple(sorted(self.extra_env.items())),
            pause_image=self.pause_image)

    def build(self) -> KubernetesBackend:
        from .kubernetes import KubernetesBackend

        return KubernetesBackend(self)


BackendConfig = Annotated[LocalBackendConfig | KubernetesBackendConfig, Field(discriminator="type")]
