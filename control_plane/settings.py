"""What the environment says to the control plane (and to ``idegym images`` / ``idegym sandboxes``,
which work on its state): the defaults of ``idegym control-plane serve``'s flags
(``$IDEGYM_CONTROL_PLANE_<FLAG>``, ``cli.py``) and what has no flag (caches, a Debian mirror, the
Kubernetes backend's ``$IDEGYM_K8S_<FIELD>``). Read in one place, ``ControlPlaneSettings.from_env()``
(``sandbox_server/env_settings.py`` says how); nothing below reads ``os.environ`` for its
configuration.

A flag's variable here has no default of its own (``None``: unset): the flag's default is
``ControlPlaneConfig``'s, and ``--help`` and ``docs/configuration.md`` show it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator

from sandbox_server.env_settings import EnvSettings, split_list, variable

from .constants import default_state_dir
from .quantities import memory_bytes


def parse_bytes(text: Any) -> Any:
    """``8Gi``, ``512Mi``, ``1000000``: a size as Kubernetes writes quantities (other values unchanged)."""
    if not isinstance(text, str):
        return text
    if text.strip() == "0":
        return 0
    try:
        return memory_bytes(text.strip())
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a size (e.g. 8Gi, 512Mi, 1000000): {exc}") from None


def _paths(value: Any) -> Any:
    return tuple(Path(p) for p in value.split(":") if p) if isinstance(value, str) else value


Bytes = Annotated[int, BeforeValidator(parse_bytes)]
Names = Annotated[tuple[str, ...], BeforeValidator(split_list)]
Paths = Annotated[tuple[Path, ...], BeforeValidator(_paths)]


def _flag(name: str, flag: str) -> Any:
    """The variable of a flag of ``idegym control-plane serve``: its text and default are the flag's."""
    return variable(name, "", flag=flag)


class ControlPlaneSettings(EnvSettings):
    """The control plane's variables (see the module docstring)."""

    state_dir: Path | None = _flag("IDEGYM_CONTROL_PLANE_STATE_DIR", "--state-dir")
    host: str | None = _flag("IDEGYM_CONTROL_PLANE_HOST", "--host")
    port: int | None = _flag("IDEGYM_CONTROL_PLANE_PORT", "--port")
    unix_socket: Path | None = _flag("IDEGYM_CONTROL_PLANE_UNIX_SOCKET", "--unix-socket")
    auth: str | None = variable("IDEGYM_CONTROL_PLANE_AUTH", "", flag="--auth", secret=True)
    tenants: Path | None = _flag("IDEGYM_CONTROL_PLANE_TENANTS", "--tenants")
    tenant_host_builds: bool | None = _flag("IDEGYM_CONTROL_PLANE_TENANT_HOST_BUILDS", "--tenant-host-builds")
    build_roots: Paths | None = _flag("IDEGYM_CONTROL_PLANE_BUILD_ROOTS", "--build-root")
    backend: str | None = _flag("IDEGYM_CONTROL_PLANE_BACKEND", "--backend")
    isolation: str | None = _flag("IDEGYM_CONTROL_PLANE_ISOLATION", "--isolation")
    network: bool | None = _flag("IDEGYM_CONTROL_PLANE_NETWORK", "--network")
    host_package_config: bool | None = _flag("IDEGYM_CONTROL_PLANE_HOST_PACKAGE_CONFIG", "--host-package-config")
    sandbox_storage: Bytes | None = _flag("IDEGYM_CONTROL_PLANE_SANDBOX_STORAGE", "--sandbox-storage")
    sandbox_inodes: int | None = _flag("IDEGYM_CONTROL_PLANE_SANDBOX_INODES", "--sandbox-inodes")
    orphan_ttl: float | None = _flag("IDEGYM_CONTROL_PLANE_ORPHAN_TTL", "--orphan-ttl")
    delete_timeout: float | None = _flag("IDEGYM_CONTROL_PLANE_DELETE_TIMEOUT", "--delete-timeout")
    image_registry: str | None = _flag("IDEGYM_IMAGE_REGISTRY", "--image-registry")
    image_registry_insecure: bool = variable(
        "IDEGYM_IMAGE_REGISTRY_INSECURE", "plain HTTP, no TLS check, for `--image-registry` (an `http://` "
        "registry is so anyway)", False)
    image_cache: Path | None = _flag("IDEGYM_IMAGE_CACHE", "--image-cache")
    build_cache: bool | None = _flag("IDEGYM_BUILD_CACHE", "--build-cache")
    build_cache_dir: Path | None = variable(
        "IDEGYM_BUILD_CACHE_DIR", "where the host's build cache keeps the images control planes built (with "
        "`--build-cache`)", shown="`<image cache>/builds`")
    debian_mirror: str | None = variable(
        "IDEGYM_DEBIAN_MIRROR", "the Debian archive OCI bases are made from", shown="the one apt uses on this host")
    ubuntu_mirror: str | None = variable(
        "IDEGYM_UBUNTU_MIRROR", "the Ubuntu archive `ubuntu:*` bases are made from (`none`: never Ubuntu's own, "
        "the nearest Debian release instead)", shown="Ubuntu's own when it answers")
    runtime_cache: Path | None = variable(
        "IDEGYM_RUNTIME_CACHE", "where the sandbox servers' Python closures are kept, shared by every control plane "
        "of the user", shown="~/.cache/idegym/runtime")
    builtin_cache: Path | None = variable(
        "IDEGYM_BUILTIN_CACHE", "where the built-in image's builds are kept", shown="~/.cache/idegym/builtin")
    harness_cache: Path | None = variable(
        "IDEGYM_HARNESS_CACHE", "where agent harnesses' layers are kept", shown="~/.cache/idegym/harness")
    warm_pool: int | None = _flag("IDEGYM_CONTROL_PLANE_WARM_POOL", "--warm-pool")
    warm_pool_max: int | None = _flag("IDEGYM_CONTROL_PLANE_WARM_POOL_MAX", "--warm-pool-max")
    warm_pool_parallel: int | None = _flag("IDEGYM_CONTROL_PLANE_WARM_POOL_PARALLEL", "--warm-pool-parallel")
    pool_image: Names | None = _flag("IDEGYM_CONTROL_PLANE_POOL_IMAGE", "--pool-image")
    max_servers: int | None = _flag("IDEGYM_CONTROL_PLANE_MAX_SERVERS", "--max-servers")
    max_snapshots: int | None = _flag("IDEGYM_CONTROL_PLANE_MAX_SNAPSHOTS", "--max-snapshots")
    max_snapshot_bytes: Bytes | None = _flag("IDEGYM_CONTROL_PLANE_MAX_SNAPSHOT_BYTES", "--max-snapshot-bytes")
    tenant_max_servers: int | None = _flag("IDEGYM_CONTROL_PLANE_TENANT_MAX_SERVERS", "--tenant-max-servers")
    client_max_servers: int | None = _flag("IDEGYM_CONTROL_PLANE_CLIENT_MAX_SERVERS", "--client-max-servers")
    tenant_max_builds: int | None = _flag("IDEGYM_CONTROL_PLANE_TENANT_MAX_BUILDS", "--tenant-max-builds")
    client_max_builds: int | None = _flag("IDEGYM_CONTROL_PLANE_CLIENT_MAX_BUILDS", "--client-max-builds")
    tenant_upload_bytes: Bytes | None = _flag("IDEGYM_CONTROL_PLANE_TENANT_UPLOAD_BYTES", "--tenant-upload-bytes")
    client_upload_bytes: Bytes | None = _flag("IDEGYM_CONTROL_PLANE_CLIENT_UPLOAD_BYTES", "--client-upload-bytes")
    max_upload_bytes: Bytes | None = _flag("IDEGYM_CONTROL_PLANE_MAX_UPLOAD_BYTES", "--max-upload-bytes")
    max_upload_files: int | None = _flag("IDEGYM_CONTROL_PLANE_MAX_UPLOAD_FILES", "--max-upload-files")
    upload_retention: float | None = _flag("IDEGYM_CONTROL_PLANE_UPLOAD_RETENTION", "--upload-retention")
    start_rate: float | None = _flag("IDEGYM_CONTROL_PLANE_START_RATE", "--start-rate")
    start_burst: int | None = _flag("IDEGYM_CONTROL_PLANE_START_BURST", "--start-burst")
    queue_timeout: float | None = _flag("IDEGYM_CONTROL_PLANE_QUEUE_TIMEOUT", "--queue-timeout")
    body_budget: int | None = _flag("IDEGYM_CONTROL_PLANE_BODY_BUDGET", "--body-budget")
    header_timeout: float | None = _flag("IDEGYM_CONTROL_PLANE_HEADER_TIMEOUT", "--header-timeout")
    watch_interval: float | None = _flag("IDEGYM_CONTROL_PLANE_WATCH_INTERVAL", "--watch-interval")
    inactive_timeout: float | None = _flag("IDEGYM_CONTROL_PLANE_INACTIVE_TIMEOUT", "--inactive-timeout")
    finished_timeout: float | None = _flag("IDEGYM_CONTROL_PLANE_FINISHED_TIMEOUT", "--finished-timeout")
    heartbeat_timeout: float | None = _flag("IDEGYM_CONTROL_PLANE_HEARTBEAT_TIMEOUT", "--heartbeat-timeout")
    operation_retention: float | None = _flag("IDEGYM_CONTROL_PLANE_RETENTION", "--operation-retention")
    ephemeral: bool | None = _flag("IDEGYM_CONTROL_PLANE_EPHEMERAL", "--ephemeral")
    log_json: bool | None = _flag("IDEGYM_LOG_JSON", "--log-json")
    log_level: str | None = _flag("IDEGYM_LOG_LEVEL", "--log-level")
    tool_spawner: str | None = variable(
        "IDEGYM_TOOL_SPAWNER", "passed on to every sandbox server of a local control plane (its "
        "`--[no-]tool-spawner`)", shown="the servers' default: on")
    pod_name: str | None = variable(("POD_NAME", "HOSTNAME"), "the control plane's pod, recorded with the "
                                    "operations it runs", shown="the host name")
    xdg_state_home: str | None = variable("XDG_STATE_HOME", "the default state directory is `$XDG_STATE_HOME/idegym`",
                                          shown="~/.local/state")
    xdg_cache_home: str | None = variable("XDG_CACHE_HOME", "the shared caches are under `$XDG_CACHE_HOME/idegym`",
                                          shown="~/.cache")
    rustup_home: Path | None = variable("RUSTUP_HOME", "a Rust toolchain the built-in image offers sandboxes",
                                        shown="~/.rustup")
    cargo_home: Path | None = variable("CARGO_HOME", "…and its cargo", shown="~/.cargo")
    kubernetes: dict[str, str] = variable(
        ("IDEGYM_K8S_*", "KUBECONFIG", "KUBERNETES_SERVICE_HOST"), "the Kubernetes backend's settings, one "
        "`IDEGYM_K8S_<FIELD>` per field of `KubernetesBackendConfig` (docs/kubernetes.md lists them); `KUBECONFIG` and "
        "`KUBERNETES_SERVICE_HOST` as kubectl reads them", {}, shown="–")

    def default_state_dir(self) -> Path:
        """``$IDEGYM_CONTROL_PLANE_STATE_DIR``, else ``$XDG_STATE_HOME/idegym`` (``~/.local/state/idegym``)."""
        return self.state_dir or default_state_dir(self.xdg_state_home)

    def user_cache_dir(self, name: str) -> Path:
        """``$XDG_CACHE_HOME/idegym/<name>`` (``~/.cache/idegym/<name>``)."""
        base = Path(self.xdg_cache_home) if self.xdg_cache_home else Path.home() / ".cache"
        return base / "idegym" / name
