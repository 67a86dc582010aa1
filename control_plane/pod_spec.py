"""Kubernetes shapes a start request carries (``specs/control-plane-api.yaml``): the label and annotation
rules, resources, and the pod-spec pass-through models (snake_case or camelCase in, camelCase
out). The local backend reads resources and ignores the rest; the Kubernetes backend builds pods
from them."""

from __future__ import annotations

import re
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from .quantities import cpu_millicores, format_cpu, format_memory, memory_bytes

# -- scalar rules --------------------------------------------------------------------------------

K8S_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[a-zA-Z0-9]([a-zA-Z0-9._-]{0,61}[a-zA-Z0-9])?$"
)
LABEL_VALUE = re.compile(r"^([a-zA-Z0-9]([a-zA-Z0-9._-]*[a-zA-Z0-9])?)?$")
RESERVED_LABELS = ("app", "app.kubernetes.io/", "idegym.jetbrains.com/")
RESERVED_ANNOTATIONS = ("cluster-autoscaler.kubernetes.io/safe-to-evict", "podsnapshot.gke.io/", "prometheus.io/")
MAX_ANNOTATION_BYTES = 262_144


def check_label_key(key: str, what: str) -> None:
    prefix = key.rsplit("/", 1)[0] if "/" in key else ""
    if not 1 <= len(key) <= 317 or len(prefix) > 253 or not LABEL_KEY.match(key):
        raise ValueError(f"{what} key {key!r} is not a valid Kubernetes label key")


def reserved(key: str, reserved: tuple[str, ...]) -> bool:
    return any(key == r or (r.endswith("/") and key.startswith(r)) for r in reserved)


class K8sModel(BaseModel):
    """Pod-spec pass-through: snake_case or camelCase in, extra keys kept."""

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
