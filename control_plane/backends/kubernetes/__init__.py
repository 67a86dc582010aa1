"""The Kubernetes backend: every server of the control plane as pods on a cluster.

    manifests   StartServerRequest/SandboxSpec → Deployment (or Pod), Service, PodDisruptionBudget
    backend     KubernetesBackend (the ``Backend`` contract)
    api_client  the API client, from the backend's settings (``backends/config.py``)
    podstate    readiness, restarts and failure reasons read from a pod
    informer    one pod list+watch per namespace, shared by every wait and observation
    relay       in-process ``kubectl proxy`` for the api-proxy addressing mode
    snapshots   GKE pod snapshots (podsnapshot.gke.io/v1 custom resources)
    builds      image builds as Jobs running an in-cluster builder (Kaniko)

Needs the ``kubernetes`` extra (``pip install idegym[kubernetes]``).
"""

from ..config import KubernetesBackendConfig
from .backend import KubernetesBackend
from .builds import BuildStatus, KubernetesImageBuilder, parse_build_yaml
from .manifests import ManifestSettings, ServerManifests, build_server_manifests, deep_merge

__all__ = [
    "BuildStatus", "KubernetesBackend", "KubernetesBackendConfig", "KubernetesImageBuilder",
    "ManifestSettings", "ServerManifests", "build_server_manifests", "deep_merge", "parse_build_yaml",
]
