"""The Kubernetes backend's API client, made from its settings (``backends/config.py``)."""

from __future__ import annotations

from kubernetes import client
from kubernetes import config as kube_config

from ..base import BackendError
from ..config import KubernetesBackendConfig


def load_api_client(cfg: KubernetesBackendConfig) -> client.ApiClient:
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
