"""``LocalBackend``: sandboxes as namespaced processes on this host, without a container engine.

One sandbox = one ``sandbox_server`` process (plus the tools it starts) inside bubblewrap:

* **user namespace** with uids/gids 0-65535 mapped to themselves: the server runs as root of
  that namespace (capabilities there only) and tools as ``appuser`` (1000). bwrap creates the
  namespace and waits (``--userns-block-fd``) while we write the map from outside.
* **root filesystem from an allow-list**: a small tmpfs with one writable overlay per tree
  (``/usr /etc /var /opt /root /home``; lower = the image's layers, upper = the sandbox's own
  layer under ``<state>/sandboxes/<name>/layers/``), the server's runtime bound read-only under
  ``/opt/idegym``, a fresh ``/tmp``, ``/dev/shm``, ``/proc`` and ``/dev``, no ``/sys``. The mounts are
  made in a private mount namespace of the launching *thread* (``unshare(CLONE_NEWNS)`` is
  per-thread), which bwrap inherits: nothing reaches the host mount table and everything goes
  away with the sandbox. Because that namespace belongs to the initial user namespace, every
  mount is *locked* in the sandbox: root inside cannot remount the read-only ones writable.
* **project** at ``/home/appuser/work``: an overlay the server mounts itself (``userxattr``) over
  the image's project, so a reset is an in-sandbox remount.
* **pid, ipc, uts, cgroup and network namespaces**; cgroup v1 limits (memory, pids — 1024 by
  default —, cpu), ``ephemeral-storage`` as a size-bounded tmpfs under the layers and ``/tmp``.
* **network** only when the backend (``network=True``) or the image (``network: true``) allows
  it, and then still in its own network namespace, through user-mode networking (slirp4netns,
  ``usernet.py``): the outside is reachable, the host's loopback and other sandboxes are not.
* **endpoint**: the server listens on ``/run/idegym/server.sock`` (a per-sandbox host directory);
  once it is ready the socket is hard-linked to ``<run root>/<name>.sock``, outside the sandbox's
  reach, so root inside cannot redirect the control plane to another sandbox's socket.

Sandboxes outlive the control plane: no ``--die-with-parent``, their own session, and every pid
recorded with its start time in ``SandboxHandle.data`` (and ``sandbox.json`` in the sandbox
directory, for the orphan sweep): one ``LocalHandleData`` (``handle_data.py``).

Where each part lives: ``launcher.py`` (a launch, start to ready), ``rootfs.py`` (layers and
mounts), ``bwrap.py`` / ``plain.py`` (starting the server), ``server_kinds.py`` (which server),
``readiness.py``, ``teardown.py`` (kill, unmount, remove), ``removals.py`` (a retired sandbox: killed
at once, the rest removed off the hot path), ``inventory.py`` (what exists, for the
orphan sweep), ``snapshots.py``, ``fork.py`` (fork into N: ``fork_layers.py``, ``adopt.py``),
``cgroups.py``, ``images.py`` (the image store; ``builtin_image.py``, ``image_trees.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox_server import procfs

from ...constants import DEFAULT_DELETE_TIMEOUT
from ...images import BUILTIN_IMAGE
from ..base import (
    Backend,
    BackendError,
    Capabilities,
    ForkChild,
    ImageNotFound,
    Observation,
    SandboxHandle,
    SandboxSpec,
    SnapshotInfo,
)
from . import cgroups, fork, hostconfig, inventory, priority, teardown
from .cgroups import DEFAULT_SERVER_MEMORY_RESERVE, Cgroups
from .fork_layers import DEFAULT_MAX_STACK
from .handle_data import LocalHandleData
from .image_trees import ImageError
from .images import ImageStore, ResolvedImage
from .isolation import ISOLATIONS, choose_isolation, say_once
from .launcher import BACKEND_NAME, Launcher
from .layout import Space, pick_run_root, register_state, state_key, states_in_use, tail
from .lease import DEFAULT_ORPHAN_TTL, Lease
from .oci.settings import OciSettings
from .runtime import Runtime, detect
from .snapshots import Snapshots
from .storage import DEFAULT_STORAGE_BYTES, DEFAULT_STORAGE_INODES, LayerStorage

if TYPE_CHECKING:
    from .builder import LocalImageBuilder

log = logging.getLogger(__name__)

DEFAULT_PIDS_MAX = 1024
DEFAULT_TMP_BYTES = 1 << 30
DEFAULT_SHM_BYTES = 64 << 20
HOST_CONFIG_TTL = 30.0


class LocalBackend(Backend):
    """Sandboxes on this host (see the module docstring).

    ``state_dir`` holds images, sandboxes, snapshots; ``isolation`` is ``auto`` (bubblewrap when
    it can work here, else ``none``), ``bwrap`` or ``none`` (plain child processes: NOT isolated);
    ``network`` lets every sandbox reach the network (images can ask with ``network: true``);
    ``pids_max`` caps the processes of one sandbox even without a request; ``cgroup_parent`` is
    the group (in every v1 controller) the sandboxes' groups go under; ``server_memory_reserve``
    is the memory the tools can never take from their sandbox server (cgroups.py); a delete that
    takes longer than ``delete_timeout`` seconds fails (and goes on in the background);
    ``storage_bytes`` and ``storage_inodes`` bound a sandbox's writes when its request does not
    (``ephemeral-storage``), 0 or None for no bound (storage.py); a sandbox whose lease this
    backend has not renewed for ``orphan_ttl`` seconds ends itself (lease.py; None: never);
    a fork's child stands on at most ``max_fork_stack`` fork layers (deeper: merged, fork_layers.py).
    ``host_package_config`` gives builds with network and networked sandboxes this host's package
    sources (hostconfig.py).
    """

    name = BACKEND_NAME

    def __init__(self, state_dir: str | os.PathLike, *, isolation: str = "auto", network: bool = False,
                 pids_max: int | None = DEFAULT_PIDS_MAX, cgroup_parent: str = "idegym",
                 tmp_bytes: int = DEFAULT_TMP_BYTES, shm_bytes: int = DEFAULT_SHM_BYTES,
                 server_memory_reserve: int = DEFAULT_SERVER_MEMORY_RESERVE,
                 delete_timeout: float = DEFAULT_DELETE_TIMEOUT, storage_bytes: int | None = DEFAULT_STORAGE_BYTES,
                 storage_inodes: int | None = DEFAULT_STORAGE_INODES, orphan_ttl: float | None = DEFAULT_ORPHAN_TTL,
                 oci: OciSettings | None = None, max_fork_stack: int = DEFAULT_MAX_STACK,
                 host_package_config: bool = True) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, not {isolation!r}")
        self.state_dir = Path(state_dir).absolute()
        if re.search(r"[,:\\\s]", str(self.state_dir)):
            raise ValueError(f"state directory {self.state_dir} must not contain ',', ':', '\\' or spaces "
                             "(they are separators in overlayfs mount options)")
        self.requested_isolation = isolation
        self.isolation = isolation
        self.network = network
        self._pids_max = pids_max
        self.tmp_bytes = tmp_bytes
        self.shm_bytes = shm_bytes
        self.server_memory_reserve = server_memory_reserve
        self.delete_timeout = delete_timeout
        self.storage_bytes = storage_bytes or None
        self.storage_inodes = storage_inodes or None
        self.lease = Lease(self.state_dir, orphan_ttl) if orphan_ttl else None
        self.store = ImageStore(self.state_dir / "images")
        self.oci_settings = oci or OciSettings.from_env()  # OCI builds: the bases' cache, a registry mirror
        self.host_package_config = host_package_config
        self._host_config: tuple[float, hostconfig.HostConfig] | None = None
        self.snapshots = Snapshots(self.state_dir / "snapshots")
        self.fork_layers = self.snapshots.layers
        self.fork_layers.max_stack = max(max_fork_stack, 1)
        key = state_key(self.state_dir)
        self._cgroup_top = cgroup_parent.strip("/")
        self._cgroup_parent = f"{self._cgroup_top}/{key}"
        self._run_root = pick_run_root(self.state_dir, key)
        self.sandboxes: Space | None = None
        self.builds: Space | None = None
        self.launcher: Launcher | None = None

    @property
    def capabilities(self) -> Capabilities:
        # fork stacks overlay layers: bubblewrap sandboxes only (known once start() chose)
        return Capabilities(snapshots=True, fork=self.isolation == "bwrap")

    @property
    def runtime(self) -> Runtime | None:
        return self.launcher.runtime if self.launcher is not None else None

    @property
    def pids_max(self) -> int | None:
        return self._pids_max

    @pids_max.setter
    def pids_max(self, value: int | None) -> None:  # takes effect for the next sandbox
        self._pids_max = value
        if self.launcher is not None:
            self.launcher.pids_max = value

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.launcher is None:
            await asyncio.get_running_loop().run_in_executor(None, self._start_sync)

    def _start_sync(self) -> None:
        for path in (self.state_dir, self.snapshots.root, self.state_dir / "sandboxes",
                     self.state_dir / "builds" / "sandboxes"):
            path.mkdir(parents=True, exist_ok=True)
        # Sandbox layers hold files owned by (sandbox) root, set-uid ones included: host users
        # other than root must not reach them.
        os.chmod(self.state_dir, 0o700)
        self.isolation = choose_isolation(self.requested_isolation)
        key = state_key(self.state_dir)
        self.store.ensure()
        cg = Cgroups(self._cgroup_parent, self.server_memory_reserve)
        if not cg.available:
            say_once("cgroups", logging.WARNING,
                     "local backend: cgroups unavailable (%s); sandboxes run WITHOUT memory, pid and cpu limits",
                     cg.reason)
        self.sandboxes = Space("sandboxes", self.state_dir / "sandboxes", cg, self.state_dir, self._run_root)
        self.builds = Space("builds", self.state_dir / "builds" / "sandboxes", Cgroups(self._cgroup_parent + "-build"),
                            self.state_dir, self._run_root)
        storage = None
        if self.isolation == "bwrap" and (self.storage_bytes or self.storage_inodes):
            reason = LayerStorage.unavailable()
            if reason is None:
                storage = LayerStorage(self.state_dir)
            else:
                say_once("storage", logging.WARNING, "local backend: sandbox storage is NOT bounded by default (%s); "
                         "a sandbox can fill this host's disk", reason)
        self.launcher = Launcher(state_dir=self.state_dir, isolation=self.isolation, runtime=detect(),
                                 pids_max=self.pids_max, tmp_bytes=self.tmp_bytes, shm_bytes=self.shm_bytes,
                                 delete_timeout=self.delete_timeout, storage=storage,
                                 storage_bytes=self.storage_bytes if storage else None,
                                 storage_inodes=self.storage_inodes if storage else None, lease=self.lease)
        if self.host_package_config:
            self.launcher.host_config = self.host_config
        if self.lease is not None:
            self.lease.start()
        register_state(self.state_dir, key)
        if cg.available:
            stale = cgroups.remove_stale(self._cgroup_top, states_in_use())
            if stale:
                log.info("removed %d empty cgroups of state directories that are gone", len(stale))
        self._sweep_fork_layers()

    @property
    def host_config_root(self) -> Path:
        return self.state_dir / "host-config"

    def host_config(self) -> hostconfig.HostConfig:
        """The host's package configuration, read again at most every ``HOST_CONFIG_TTL`` seconds."""
        now = time.monotonic()
        if self._host_config is None or now - self._host_config[0] > HOST_CONFIG_TTL:
            self._host_config = (now, hostconfig.collect(self.host_config_root))
        return self._host_config[1]

    def require_started(self) -> Launcher:
        """The launcher; ``BackendError`` before ``start()``."""
        if self.launcher is None:
            raise BackendError("the local backend is not started (call start() first)")
        return self.launcher

    async def settle(self) -> None:
        if self.launcher is not None:
            await self.launcher.settle()

    async def close(self) -> None:
        if self.launcher is None:
            return
        await self.launcher.close()
        self.launcher = None
        await fork.settle()
        await asyncio.get_running_loop().run_in_executor(None, self.fork_layers.drop_spares)
        if self.lease is not None:
            self.lease.stop()  # what is left lives on until the lease lapses (or a next run renews it)
        for space in (self.sandboxes, self.builds):
            if space is not None:
                # lease monitors killed a moment ago may still hold the space's bind: on a loaded
                # host they took more than 2 s to go once
                teardown.tidy(space, wait=10.0)

    # -- images -------------------------------------------------------------------------------

    def register_project(self, tag: str, directory: str | os.PathLike, base: str = BUILTIN_IMAGE) -> str:
        """Register a project folder as image ``tag`` (copied into the store); returns the tag."""
        self.store.ensure()
        try:
            return self.store.register_project(tag, Path(directory), base)
        except ImageError as exc:
            raise BackendError(str(exc), 400) from exc

    def image_builder(self) -> LocalImageBuilder:
        from .builder import LocalImageBuilder

        return LocalImageBuilder(self)

    def resolve(self, tag: str) -> ResolvedImage:
        """The stored image ``tag``; ``ImageNotFound`` saying how to make it."""
        try:
            image = self.store.resolve(tag)
        except ImageError as exc:  # e.g. an OCI image whose layers (in the shared cache) are gone
            raise BackendError(str(exc), 409) from exc
        if image is None:
            raise ImageNotFound(
                f"image {tag!r} is not in the local image store ({self.store.root}). Build it from a YAML "
                f"definition (POST /api/build-push-images, or LocalImageBuilder), register a project folder "
                f"with LocalBackend.register_project({tag!r}, '<dir>'), or use the built-in image "
                f"{BUILTIN_IMAGE!r} (the host's toolchains and an empty project); `idegym images list` on this "
                "host lists the images"
            )
        return image

    # -- sandboxes --------------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec, timeout: float, *, background: bool = False) -> SandboxHandle:
        launcher = self.require_started()
        snapshot = None
        fork_ids: list[str] = []
        if spec.snapshot_source:
            snapshot = self.snapshots.path(spec.snapshot_source)
            meta = self.snapshots.meta(snapshot)
            try:
                image = self.store.resolve_id(meta["image_id"], meta.get("image"))
            except ImageError as exc:
                raise BackendError(f"snapshot {spec.snapshot_source}: {exc}", 404) from exc
            fork_ids = meta.get("forks") or []  # taken of a fork's child: it stands on the same fork layers
        else:
            image = self.resolve(spec.image_tag)
        assert self.sandboxes is not None
        with self.fork_layers.reachable(fork_ids) as forks:
            return await launcher.launch(self.sandboxes, spec.generated_name, image, run_as_root=spec.run_as_root,
                                         network=self.network or image.network, limits=spec.limits,
                                         env=dict(image.env), snapshot=snapshot, timeout=timeout,
                                         kind=spec.server_kind.value, isolated_runs=spec.isolated_runs,
                                         forks=forks if fork_ids else None, background=background,
                                         network_peer=LocalHandleData.of(spec.network_peer.data)
                                         if spec.network_peer else None)

    def claim(self, handle: SandboxHandle) -> None:
        priority.restore(LocalHandleData.of(handle.data))  # made in the background: the normal priority for all of it
        if self.launcher is not None:
            self.launcher.removals.touch()  # its first calls come now

    def hurry(self, name: str) -> None:
        if self.launcher is not None:
            self.launcher.hurry(name)

    async def observe(self, handle: SandboxHandle) -> Observation:
        data = LocalHandleData.of(handle.data)
        if self.launcher is not None:
            self.launcher.reap(data)
        server = data.server
        if procfs.recorded_alive(server):
            return Observation(exists=True, running=True, ready=os.path.exists(data.socket), phase="Running")
        if not data.dir or not os.path.isdir(data.dir):
            return Observation(exists=False, running=False, ready=False, phase=None,
                               reason="the sandbox does not exist (deleted)")
        reason = f"the sandbox server (pid {server[0] if server else '?'}) is gone"
        if data.cgroups and Cgroups.oom_kills(data.cgroups):
            reason += "; processes were killed by the sandbox's memory limit (OOM)"
        last = tail(Path(data.log), 5).strip()
        if last:
            reason += f"; last log lines: {last}"
        return Observation(exists=True, running=False, ready=False, phase="Failed", reason=reason)

    def _space(self, data: LocalHandleData) -> Space:
        space = self.builds if data.space == "builds" else self.sandboxes
        assert space is not None
        return space

    async def delete(self, handle: SandboxHandle) -> None:
        data = LocalHandleData.of(handle.data)
        await fork.record_written(handle.name)  # a fork child's, written after the fork answered
        await self.require_started().remove(self._space(data), handle.name, data)

    async def retire(self, handle: SandboxHandle) -> None:
        data = LocalHandleData.of(handle.data)
        await fork.record_written(handle.name)
        await self.require_started().retire(self._space(data), handle.name, data)

    async def list_names(self) -> set[str]:
        launcher = self.require_started()
        assert self.sandboxes is not None
        launcher.reap()  # every exited process of every sandbox, once per watcher pass (its sweep asks)
        found = await asyncio.get_running_loop().run_in_executor(None, inventory.names, self.sandboxes)
        return found - launcher.creating - launcher.removals.names(self.sandboxes.kind)

    async def delete_name(self, name: str) -> None:
        launcher = self.require_started()
        assert self.sandboxes is not None
        await fork.record_written(name)
        await launcher.remove(self.sandboxes, name, None)

    # -- snapshots --------------------------------------------------------------------------------

    async def snapshot(self, handle: SandboxHandle, group: str) -> SnapshotInfo:
        self.require_started()
        data = LocalHandleData.of(handle.data)
        if not procfs.recorded_alive(data.server):
            raise BackendError(f"sandbox {handle.name!r} is not running: nothing to snapshot", 409)
        return await asyncio.get_running_loop().run_in_executor(
            None, self.snapshots.take, data, self.snapshots.new_id(group), str(group))

    async def snapshot_exists(self, snapshot_id: str) -> bool:
        return self.snapshots.exists(snapshot_id)

    async def snapshot_bytes(self) -> int | None:
        return await asyncio.get_running_loop().run_in_executor(None, self.snapshots.total_bytes)

    # -- forks (fork.py) -----------------------------------------------------------------------------

    async def fork(self, parent: SandboxHandle, children: list[ForkChild], timeout: float) -> list[SandboxHandle]:
        assert self.sandboxes is not None
        site = fork.LocalForkSite(launcher=self.require_started(), space=self.sandboxes, layers=self.fork_layers,
                                  images=self.store, state_dir=self.state_dir, delete=self.delete)
        return await fork.fork(site, parent, children, timeout)

    def _sweep_fork_layers(self) -> None:
        """Let go of holders a previous run left behind (forks cut off, sandboxes and snapshots
        removed while it was down) and remove the layers nobody holds."""
        roots = {"s": self.state_dir / "sandboxes", "p": self.snapshots.root}

        def alive(holder: str) -> bool:
            kind, _, name = holder.partition("-")
            if kind == "o":  # a fork in progress, in the process named
                return os.path.isdir(f"/proc/{name.partition('-')[0]}")
            return kind in roots and bool(name) and (roots[kind] / name).is_dir()

        freed = self.fork_layers.sweep(alive)
        if freed:
            log.info("removed %d fork layers nobody uses any more", len(freed))

    async def delete_snapshot(self, snapshot_id: str) -> None:
        trash = self.snapshots.retire(snapshot_id)
        if trash is not None:
            await asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, trash, True)
