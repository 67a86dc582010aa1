"""Control-plane configuration: what ``idegym control-plane serve``'s flags (``cli.py``), whose
defaults are the variables of ``settings.py``, say."""

from __future__ import annotations

import os
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from . import constants
from .backends.config import BackendConfig, LocalBackendConfig
from .settings import ControlPlaneSettings


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/idegym``, else ``~/.local/state/idegym``."""
    return constants.default_state_dir(ControlPlaneSettings.from_env().xdg_state_home)


def flag(default: Any, text: str, *, name: str | None = None, size: bool = False) -> Any:
    """A field that ``idegym control-plane serve`` has a flag for: ``--<field-name>`` (or ``name``),
    typed as its default (``size``: a byte count such as ``20Gi``), with ``text`` as its help."""
    return field(default=default, metadata={"help": text, "flag": name, "size": size})


def flags(config: type) -> list[tuple[str, Field[Any]]]:
    """The flags of a configuration dataclass's fields made with :func:`flag`, and those fields."""
    return [(f.metadata["flag"] or "--" + f.name.replace("_", "-"), f) for f in fields(config) if "help" in f.metadata]


@dataclass
class WatcherConfig:
    interval: float = flag(5.0, "seconds between watcher passes", name="--watch-interval")
    inactive_timeout: float = flag(600.0, "reap ALIVE servers idle this many seconds (keepalive extends)")
    finished_timeout: float = flag(300.0, "reap FINISHED servers not reused within this many seconds")
    heartbeat_timeout: float = flag(600.0, "reap clients silent this many seconds")
    operation_retention: float = flag(14 * 86400.0, "seconds of request history kept")
    stale_operation: float = 86400.0  # an operation in progress this long is failed


@dataclass
class SharingConfig:
    """Sharing one control plane (``admission.py``, ``uploads.py``); a limit of 0 is no limit."""

    tenant_max_servers: int = flag(
        0, "live servers of one tenant (0: no limit of its own); more of its starts wait their turn")
    client_max_servers: int = flag(0, "live servers of one client (a trainer, an env; 0: no limit of its own)")
    tenant_max_builds: int = flag(0, "image builds of one tenant running at once (0: no limit); more wait their turn")
    client_max_builds: int = flag(0, "image builds of one client running at once (0: no limit)")
    tenant_upload_bytes: int = flag(
        0, "bytes of uploads one tenant holds, e.g. 20Gi (0: no limit); more are refused with 413", size=True)
    client_upload_bytes: int = flag(
        0, "bytes one client may upload in its life (0: no limit); more are refused with 413", size=True)
    max_upload_bytes: int = flag(
        2 << 30, "bytes of one upload (a task's project or build context, packed), e.g. 2Gi", size=True)
    max_upload_files: int = flag(200_000, "entries of one upload")
    upload_retention: float = flag(7 * 86400.0, "seconds an upload no build used is kept")
    start_rate: float = flag(
        0.0, "sandboxes made per second, all tenants together (0: as fast as asked); more wait their turn")
    start_burst: int = flag(8, "sandboxes made at once before --start-rate applies")
    queue_timeout: float = flag(
        600.0, "seconds a start waits for its turn (or its own start timeout, if shorter), then 429")


@dataclass
class ControlPlaneConfig:
    state_dir: Path = field(default_factory=default_state_dir)
    host: str = constants.DEFAULT_HOST
    port: int = constants.DEFAULT_PORT
    unix_socket: Path | None = None
    auth: tuple[str, str] | None = None  # HTTP Basic credentials; None = the state directory's token (auth.py)
    no_auth: bool = False  # --auth none: every route open to anyone who can connect (warned loudly)
    tenants: Path | None = None  # --tenants FILE: one tenant per line (tenants.py); replaces --auth
    tenant_host_builds: bool = False  # tenants may build what runs as the host's root (Dockerfiles, buildah)
    build_roots: list[Path] = field(default_factory=list)  # host directories build sources may come from
    # where sandboxes live, with that backend's settings (a local one without a state directory
    # keeps its state in the control plane's)
    backend: BackendConfig = field(default_factory=LocalBackendConfig)
    warm_pool: int = 2  # spare sandboxes kept ready per image in use (upper bound learned from demand)
    warm_pool_max: int = 8
    # Pool sandboxes made at once. Starts mostly wait in the kernel (cgroup moves, mounts), not on a
    # CPU: env_step's RESTART resets on 2 CPUs, reset p95 117 ms with 2 at once, 30-31 with 4, 25-35 with 6.
    # A kind whose claims outrun its fills makes up to its target at once (pool.py).
    warm_pool_parallel: int = 4
    pool_images: list[str] = field(default_factory=list)  # images to keep warm from start-up
    max_servers: int = 200  # sandboxes at once for any route (admission.py); more wait their turn, then 429
    max_snapshots: int = 1000  # snapshots kept (snapshot_caps.py); more fail with 429
    max_snapshot_bytes: int = 64 << 30  # what snapshots may take on disk, where the backend can tell
    client_request_timeout: float = 3600.0  # read timeout control plane → sandbox
    max_body_bytes: int = 256 << 20
    body_budget_bytes: int | None = None  # request bodies held at once (body_budget.py); None: 3 × max_body_bytes
    body_wait: float = 120.0  # a large body waits this long for room in the budget, then 503
    header_timeout: float = 15.0  # a request's head must arrive this soon after connecting or the last answer
    inline_result_limit: int = 256 << 10  # results answered inline (Prefer: wait) are stored up to this
    runner_image: str = "idegym/builtin:latest"  # image of the code runner's sandboxes (POST /execute)
    # two per core: a run waits part of its time (its start, the hops of its request and answer)
    runner_concurrency: int = field(default_factory=lambda: max(2 * (os.cpu_count() or 1), 2))
    ephemeral: bool = False  # delete every sandbox and the state on shutdown (embedded mode)
    pod_name: str | None = field(default_factory=lambda: ControlPlaneSettings.from_env().pod_name)
    watcher: WatcherConfig = field(default_factory=WatcherConfig)
    sharing: SharingConfig = field(default_factory=SharingConfig)

    def __post_init__(self) -> None:
        if isinstance(self.backend, LocalBackendConfig) and self.backend.state_dir is None:
            self.backend = self.backend.model_copy(update={"state_dir": self.state_dir})

    @property
    def db_path(self) -> Path:
        return self.state_dir / "control-plane.db"
