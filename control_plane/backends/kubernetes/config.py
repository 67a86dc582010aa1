"""The Kubernetes backend's settings (flags, ``IDEGYM_K8S_*`` variables) and its API client."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from kubernetes import client
from kubernetes import config as kube_config

from ...settings import ControlPlaneSettings
from ..base import BackendError
from .manifests import ManifestSettings

ADDRESSING = ("service-dns", "api-proxy", "pod-ip")


@dataclass
class KubernetesConfig:
    """Settings of the Kubernetes backend; ``from_env`` / ``add_arguments`` map them to
    ``IDEGYM_K8S_*`` variables and ``--k8s-*`` flags."""

    namespace: str = "idegym"
    extra_namespaces: tuple[str, ...] = ()  # a request's namespace is honoured only if listed here
    kubeconfig: str | None = None  # default: $KUBECONFIG, ~/.kube/config
    context: str | None = None
    in_cluster: bool | None = None  # None: in-cluster when $KUBERNETES_SERVICE_HOST is set and no kubeconfig
    addressing: str | None = None  # service-dns | api-proxy | pod-ip; None: service-dns in a cluster, else api-proxy
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
    extra_env: dict[str, str] = field(default_factory=dict)

    ENV_PREFIX = "IDEGYM_K8S_"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> KubernetesConfig:
        """Fields from ``IDEGYM_K8S_<FIELD>`` (tuples comma-separated, booleans true/1/yes) of ``env``
        (default: the control plane's settings, ``control_plane/settings.py``)."""
        env = dict(ControlPlaneSettings.from_env().kubernetes if env is None else env)
        values: dict[str, Any] = {}
        defaults = cls()
        for f in fields(cls):
            raw = env.get(cls.ENV_PREFIX + f.name.upper())
            if raw is None:
                continue
            default = getattr(defaults, f.name)
            if isinstance(default, bool) or f.name == "in_cluster":
                values[f.name] = raw.strip().lower() in ("1", "true", "yes", "on")
            elif isinstance(default, tuple):
                values[f.name] = tuple(x.strip() for x in raw.split(",") if x.strip())
            elif isinstance(default, dict):
                values[f.name] = dict(kv.split("=", 1) for kv in raw.split(",") if "=" in kv)
            elif isinstance(default, float):
                values[f.name] = float(raw)
            elif isinstance(default, int):
                values[f.name] = int(raw)
            else:
                values[f.name] = raw
        if "kubeconfig" not in values and env.get("KUBECONFIG"):
            values["kubeconfig"] = env["KUBECONFIG"]
        values.update(overrides)
        return cls(**values)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
        """``--k8s-<field>`` flags whose defaults come from the environment (``from_env``)."""
        base = cls.from_env(env)
        group = parser.add_argument_group("kubernetes backend", "environment fallback: IDEGYM_K8S_<FIELD>")
        for f in fields(cls):
            flag = "--k8s-" + f.name.replace("_", "-")
            default = getattr(base, f.name)
            if isinstance(default, bool):
                group.add_argument(flag, dest=f"k8s_{f.name}", action=argparse.BooleanOptionalAction, default=default)
            elif isinstance(default, (tuple, dict)):
                group.add_argument(flag, dest=f"k8s_{f.name}", default=",".join(
                    default if isinstance(default, tuple) else (f"{k}={v}" for k, v in default.items())))
            elif isinstance(default, (int, float)):
                group.add_argument(flag, dest=f"k8s_{f.name}", default=default, type=type(default))
            else:
                group.add_argument(flag, dest=f"k8s_{f.name}", default=default)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> KubernetesConfig:
        env = {cls.ENV_PREFIX + f.name.upper(): str(getattr(args, f"k8s_{f.name}")) for f in fields(cls)
               if getattr(args, f"k8s_{f.name}", None) not in (None, "")}
        return cls.from_env(env)

    def resolved_in_cluster(self) -> bool:
        if self.in_cluster is not None:
            return self.in_cluster
        return bool(ControlPlaneSettings.from_env().kubernetes.get("KUBERNETES_SERVICE_HOST")) and not self.kubeconfig

    def resolved_addressing(self) -> str:
        mode = self.addressing or ("service-dns" if self.resolved_in_cluster() else "api-proxy")
        if mode not in ADDRESSING:
            raise ValueError(f"addressing {mode!r}: choose one of {', '.join(ADDRESSING)}")
        return mode

    def manifest_settings(self) -> ManifestSettings:
        return ManifestSettings(
            instance=self.instance, image_pull_policy=self.image_pull_policy,
            image_pull_secrets=tuple(self.image_pull_secrets), readiness_period_seconds=self.readiness_period_seconds,
            pod_disruption_budget=self.pod_disruption_budget, extra_env=tuple(sorted(self.extra_env.items())),
            pause_image=self.pause_image)


def load_api_client(cfg: KubernetesConfig) -> client.ApiClient:
    """An ApiClient of its own (the global default configuration is left alone)."""
    configuration = client.Configuration()
    try:
        if cfg.resolved_in_cluster():
            kube_config.load_incluster_config(client_configuration=configuration)
        else:
            kube_config.load_kube_config(config_file=cfg.kubeconfig, context=cfg.context,
                                         client_configuration=configuration, persist_config=False)
    except kube_config.ConfigException as exc:
        raise BackendError(f"cannot load the Kubernetes configuration: {exc}") from exc
    configuration.connection_pool_maxsize = 64  # one per concurrent call plus the watch streams
    return client.ApiClient(configuration)
