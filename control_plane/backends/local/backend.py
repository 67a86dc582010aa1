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
  it, by sharing the host's network namespace. CAVEAT: such a sandbox can then reach every
  service listening on the host's loopback and abstract Unix sockets; allow it for trusted images.
* **endpoint**: the server listens on ``/run/idegym/server.sock`` (a per-sandbox host directory);
  once it is ready the socket is hard-linked to ``<run root>/<name>.sock``, outside the sandbox's
  reach, so root inside cannot redirect the control plane to another sandbox's socket.

Sandboxes outlive the control plane: no ``--die-with-parent``, their own session, and every pid
recorded with its start time in ``SandboxHandle.data`` (and ``sandbox.json`` in the sandbox
directory, for the orphan sweep).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...models import ServerKind
from ..base import (
    Backend,
    BackendError,
    Endpoint,
    ImageNotFound,
    Limits,
    Observation,
    SandboxHandle,
    SandboxSpec,
    SnapshotInfo,
)
from . import linux
from .cgroups import Cgroups
from .images import (
    APPUSER,
    BUILTIN_IMAGE,
    HOSTNAME,
    TREES,
    ImageError,
    ImageStore,
    ResolvedImage,
    copy_tree,
)
from .runtime import INSIDE, Runtime, detect, sync_package

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
PROJECT_INSIDE = "/home/appuser/work"
SOCKET_NAME = "server.sock"
RUN_INSIDE = "/run/idegym"
MEMORY_EVENTS_INSIDE = "/run/idegym-cgroup/memory.oom_control"
DEFAULT_PIDS_MAX = 1024
DEFAULT_TMP_BYTES = 1 << 30
DEFAULT_SHM_BYTES = 64 << 20
MERGED_USR_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
ISOLATIONS = ("auto", "bwrap", "none")

_said: set[str] = set()


def state_key(state_dir: Path) -> str:
    """The short key this backend names a state directory's cgroups and socket directory by."""
    return hashlib.sha1(str(Path(state_dir).absolute()).encode()).hexdigest()[:10]


def _say_once(key: str, level: int, message: str, *args: Any) -> None:
    if key not in _said:
        _said.add(key)
        log.log(level, message, *args)


@dataclass
class _Space:
    """Where one family of sandboxes lives: served sandboxes, or image-build sandboxes."""

    root: Path
    cgroups: Cgroups


@dataclass
class _Plan:
    name: str
    space: _Space
    sb: Path
    run: Path
    image: ResolvedImage
    project_lower: str
    run_as_root: bool
    network: bool
    limits: Limits
    pids_max: int | None
    env: dict[str, str]
    snapshot: Path | None = None
    export: Path | None = None
    lowers: dict[str, list[str]] = field(default_factory=dict)
    openenv: bool = False  # [openenv] the OpenEnv server runs in the sandbox, in front of sandbox_server

    @property
    def layers(self) -> Path:
        return self.sb / "layers"

    @property
    def log(self) -> Path:
        return self.sb / "layers" / "server.log"


class LocalBackend(Backend):
    """Sandboxes on this host (see the module docstring).

    ``state_dir`` holds images, sandboxes, snapshots; ``isolation`` is ``auto`` (bubblewrap when
    it can work here, else ``none``), ``bwrap`` or ``none`` (plain child processes: NOT isolated);
    ``network`` lets every sandbox use the host network (images can ask with ``network: true``);
    ``pids_max`` caps the processes of one sandbox even without a request; ``cgroup_parent`` is
    the group (in every v1 controller) the sandboxes' groups go under.
    """

    name = "local"

    def __init__(self, state_dir: str | os.PathLike, *, isolation: str = "auto", network: bool = False,
                 pids_max: int | None = DEFAULT_PIDS_MAX, cgroup_parent: str = "idegym",
                 tmp_bytes: int = DEFAULT_TMP_BYTES, shm_bytes: int = DEFAULT_SHM_BYTES) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, not {isolation!r}")
        self.state_dir = Path(state_dir).absolute()
        if re.search(r"[,:\\\s]", str(self.state_dir)):
            raise ValueError(f"state directory {self.state_dir} must not contain ',', ':', '\\' or spaces "
                             "(they are separators in overlayfs mount options)")
        self.requested_isolation = isolation
        self.isolation = isolation
        self.network = network
        self.pids_max = pids_max
        self.tmp_bytes = tmp_bytes
        self.shm_bytes = shm_bytes
        self.store = ImageStore(self.state_dir / "images")
        self.snapshots_dir = self.state_dir / "snapshots"
        key = state_key(self.state_dir)
        self._cgroup_parent = f"{cgroup_parent.strip('/')}/{key}"
        self._run_root = self._pick_run_root(key)
        self.runtime: Runtime | None = None
        self.sandboxes: _Space | None = None
        self.builds: _Space | None = None
        self._launcher: concurrent.futures.ThreadPoolExecutor | None = None
        self._children: dict[int, subprocess.Popen] = {}
        self._creating: set[str] = set()  # in flight here: never reported as orphans
        self._settling: set[asyncio.Task] = set()  # cancelled creates, being undone
        self._launches: set[asyncio.Future] = set()  # creates in flight
        self._usr_links: list[str] = []
        self._started = False
        self._openenv_rt: Runtime | None = None  # [openenv] see _openenv_runtime

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._start_sync)
        self._started = True

    def _start_sync(self) -> None:
        for path in (self.state_dir, self.snapshots_dir, self.state_dir / "sandboxes",
                     self.state_dir / "builds" / "sandboxes"):
            path.mkdir(parents=True, exist_ok=True)
        # Sandbox layers hold files owned by (sandbox) root, set-uid ones included: host users
        # other than root must not reach them.
        os.chmod(self.state_dir, 0o700)
        self.isolation = self._choose_isolation()
        self.store.ensure()
        self.runtime = detect(self.state_dir)
        cg = Cgroups(self._cgroup_parent)
        build_cg = Cgroups(self._cgroup_parent + "-build")
        if not cg.available:
            _say_once("cgroups", logging.WARNING,
                      "local backend: cgroups unavailable (%s); sandboxes run WITHOUT memory, pid and cpu limits",
                      cg.reason)
        self.sandboxes = _Space(self.state_dir / "sandboxes", cg)
        self.builds = _Space(self.state_dir / "builds" / "sandboxes", build_cg)
        self._usr_links = [name for name in MERGED_USR_LINKS if os.path.isdir(f"/usr/{name}")]
        self._launcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="idegym-launch")

    def _choose_isolation(self) -> str:
        reason = None
        if self.requested_isolation != "none":
            if shutil.which("bwrap") is None:
                reason = "bubblewrap (bwrap) is not installed"
            elif os.geteuid() != 0:
                reason = "the control plane does not run as root (needed for overlay root filesystems)"
            elif "overlay" not in Path("/proc/filesystems").read_text():
                reason = "the kernel has no overlayfs"
            if reason is None:
                return "bwrap"
            if self.requested_isolation == "bwrap":
                raise BackendError(f"local backend: isolation 'bwrap' is not possible here: {reason}")
        _say_once("isolation", logging.WARNING,
                  "\n%s\nLOCAL BACKEND: SANDBOXES ARE NOT ISOLATED (%s). Each sandbox server runs as a plain "
                  "child process with this process's user and full view of the host: files, network, other "
                  "sandboxes. Only a per-sandbox project copy separates them. Install bubblewrap and run as "
                  "root for isolation.\n%s", "!" * 78, reason or "isolation='none' requested", "!" * 78)
        return "none"

    async def settle(self) -> None:
        # Launches run in threads that cannot be interrupted; cancelled ones are then undone.
        while self._launches or self._settling:
            await asyncio.gather(*self._launches, *self._settling, return_exceptions=True)

    async def close(self) -> None:
        await self.settle()
        if self._launcher is not None:
            self._launcher.shutdown(wait=True)
            self._launcher = None
        for space in (self.sandboxes, self.builds):
            if space is not None:
                self._tidy(space)
        self._started = False

    def _check_started(self) -> None:
        if not self._started:
            raise BackendError("the local backend is not started (call start() first)")

    def _pick_run_root(self, key: str) -> Path:
        """Unix socket paths are limited to 107 bytes: keep sockets under a short directory."""
        preferred = self.state_dir / "run"
        if len(str(preferred)) + 1 + 24 + 1 + len(SOCKET_NAME) <= 100:
            return preferred
        if os.geteuid() == 0 and os.access("/run", os.W_OK):
            return Path(f"/run/idegym-{key}")
        return Path(tempfile.gettempdir()) / f"idegym-{os.getuid()}-{key}"

    def run_dir(self, name: str, space: _Space | None = None) -> Path:
        prefix = "b-" if space is not None and space is self.builds else ""
        short = name if len(name) <= 24 else hashlib.sha1(name.encode()).hexdigest()[:24]
        return self._run_root / f"{prefix}{short}"

    # -- images -------------------------------------------------------------------------------

    def register_project(self, tag: str, directory: str | os.PathLike, base: str = BUILTIN_IMAGE) -> str:
        """Register a project folder as image ``tag`` (copied into the store); returns the tag."""
        self.store.ensure()
        try:
            return self.store.register_project(tag, Path(directory), base)
        except ImageError as exc:
            raise BackendError(str(exc), 400) from exc

    def image_builder(self):
        from .builder import LocalImageBuilder

        return LocalImageBuilder(self)

    def _resolve(self, tag: str) -> ResolvedImage:
        image = self.store.resolve(tag)
        if image is None:
            raise ImageNotFound(
                f"image {tag!r} is not in the local image store ({self.store.root}). Build it from a YAML "
                f"definition (POST /api/build-push-images, or LocalImageBuilder), register a project folder "
                f"with LocalBackend.register_project({tag!r}, '<dir>'), or use the built-in image "
                f"{BUILTIN_IMAGE!r} (the host's toolchains and an empty project). Known images: "
                f"{', '.join(self.store.tags())}"
            )
        return image

    # -- create -------------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec, timeout: float) -> SandboxHandle:
        self._check_started()
        if spec.server_kind not in (ServerKind.IDEGYM, ServerKind.OPENENV):
            raise BackendError(f"the local backend runs idegym and openenv servers, not {spec.server_kind.value!r}",
                               400)
        snapshot = None
        if spec.snapshot_source:
            snapshot = self._snapshot_dir(spec.snapshot_source)
            meta = self._snapshot_meta(snapshot)
            try:
                image = self.store.resolve_id(meta["image_id"], meta.get("image"))
            except ImageError as exc:
                raise BackendError(f"snapshot {spec.snapshot_source}: {exc}", 404) from exc
        else:
            image = self._resolve(spec.image_tag)
        assert self.sandboxes is not None
        return await self._create(spec.generated_name, self.sandboxes, image, run_as_root=spec.run_as_root,
                                  network=self.network or image.network, limits=spec.limits, env=dict(image.env),
                                  snapshot=snapshot, timeout=timeout,
                                  openenv=spec.server_kind == ServerKind.OPENENV)

    async def _create(self, name: str, space: _Space, image: ResolvedImage, *, run_as_root: bool, network: bool,
                      limits: Limits, env: dict[str, str], timeout: float, snapshot: Path | None = None,
                      project_lower: str | None = None, export: Path | None = None,
                      openenv: bool = False) -> SandboxHandle:
        if not NAME_RE.match(name):
            raise BackendError(f"invalid sandbox name {name!r}: use letters, digits, '-', '_', '.'", 400)
        sb = space.root / name
        if sb.exists() or name in self._creating:
            raise BackendError(f"a sandbox named {name!r} already exists in {space.root}", 409)
        plan = _Plan(name=name, space=space, sb=sb, run=self.run_dir(name, space), image=image,
                     project_lower=project_lower or image.project, run_as_root=run_as_root, network=network,
                     limits=limits, pids_max=self.pids_max, env=env, snapshot=snapshot, export=export,
                     openenv=openenv)
        data: dict[str, Any] = {
            "v": 1, "isolation": self.isolation, "dir": str(sb), "run_dir": str(plan.run),
            "socket": str(plan.run / SOCKET_NAME), "log": str(plan.log), "image": image.tag,
            "image_id": image.id, "run_as_root": run_as_root, "network": network, "cgroups": {},
            "snapshot": snapshot.name if snapshot else None,
            "space": "builds" if space is self.builds else "sandboxes",
        }
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        deadline = time.monotonic() + timeout
        self._creating.add(name)
        launch = asyncio.ensure_future(self._launch(plan, data, loop, started, deadline, timeout))
        self._launches.add(launch)
        launch.add_done_callback(self._launches.discard)
        try:
            return await asyncio.shield(launch)
        except asyncio.CancelledError:
            # The launch runs in threads that cannot be interrupted: cancelling it half-way left a
            # directory and cgroups behind (a shutdown during a warm-pool fill did). It settles
            # instead, and what it made is deleted; close() waits for that.
            task = asyncio.ensure_future(self._drop_when_settled(launch, name, space))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)
            raise
        finally:
            if launch.done():
                self._creating.discard(name)

    async def _drop_when_settled(self, launch: asyncio.Future, name: str, space: _Space) -> None:
        try:
            handle = await launch
        except BaseException:  # noqa: BLE001 - a failed launch has cleaned up after itself
            return
        else:
            try:
                await self._delete(name, space, handle.data)
            except Exception:  # noqa: BLE001
                log.warning("deleting the sandbox %s of a cancelled create failed", name, exc_info=True)
        finally:
            self._creating.discard(name)

    async def _launch(self, plan: _Plan, data: dict[str, Any], loop: asyncio.AbstractEventLoop, started: float,
                      deadline: float, timeout: float) -> SandboxHandle:
        name, space, sb = plan.name, plan.space, plan.sb
        try:
            await loop.run_in_executor(None, self._prepare, plan, data)
            prepared = time.perf_counter()
            ready_fd = await loop.run_in_executor(self._launcher, self._spawn, plan, data)
            spawned = time.perf_counter()
            # Moving a task into a v1 cgroup costs an RCU grace period per controller (~3 ms
            # each): do it while the server imports, before it can start any tool.
            results = await asyncio.gather(
                self._wait_ready(ready_fd, max(deadline - time.monotonic(), 0.1), timeout),
                loop.run_in_executor(None, self._attach_sync, data), return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            self._publish_socket(data)
            ended = time.perf_counter()
            data["timings_ms"] = {"prepare": round((prepared - started) * 1e3, 2),
                                  "spawn": round((spawned - prepared) * 1e3, 2),
                                  "server_start": round((ended - spawned) * 1e3, 2),
                                  "total": round((ended - started) * 1e3, 2)}
            _write_meta(sb, name, data)
        except BaseException as exc:
            detail = linux.tail(plan.log, 30).strip()
            if data.get("owned"):  # never clean up a same-named sandbox we did not make
                cleanup = asyncio.ensure_future(loop.run_in_executor(None, self._destroy_sync, name, space, data))
                try:
                    await asyncio.shield(cleanup)
                except BaseException:  # noqa: BLE001 - cancelled again, or cleanup trouble: it was tried
                    log.warning("cleaning up the failed sandbox %s left something behind", name, exc_info=True)
            if not isinstance(exc, Exception):
                raise
            message = exc.message if isinstance(exc, BackendError) else f"{type(exc).__name__}: {exc}"
            if detail:
                message += f"\n--- sandbox server log (last lines) ---\n{detail}"
            raise BackendError(f"sandbox {name!r} failed to start: {message}",
                               exc.status if isinstance(exc, BackendError) else 500) from exc
        return SandboxHandle(self.name, name, Endpoint("http://sandbox", data["socket"]), data)

    def _prepare(self, plan: _Plan, data: dict[str, Any]) -> None:
        """Directories, layers (size-bounded when storage is limited), cgroups: all on the host."""
        plan.space.root.mkdir(parents=True, exist_ok=True)
        try:
            plan.sb.mkdir(mode=0o700)
        except FileExistsError:
            raise BackendError(f"a sandbox named {plan.name!r} already exists", 409) from None
        data["owned"] = True
        _write_meta(plan.sb, plan.name, data)
        for attempt in range(3):  # a concurrent delete may remove an empty run root meanwhile
            self._run_root.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                plan.run.mkdir(mode=0o700, exist_ok=True)
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        (plan.run / ".name").write_text(plan.name)
        layers = plan.layers
        layers.mkdir(mode=0o700)
        if plan.limits.storage_bytes and self.isolation == "bwrap":
            linux.mount("idegym-layers", layers, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV,
                        f"size={plan.limits.storage_bytes},mode=0700")
            data["layers_tmpfs"] = True
        elif plan.limits.storage_bytes:
            _say_once("storage-ignored", logging.WARNING,
                      "local backend: ephemeral-storage limits are not enforced without isolation")
        plan.log.touch(mode=0o600)
        if self.isolation == "bwrap":
            for tree in (*TREES, "project"):
                (layers / tree / "upper").mkdir(parents=True)
                (layers / tree / "work").mkdir()
            os.chmod(layers / "project", 0o700)
            lower = os.stat(plan.project_lower)
            # The overlay's root directory takes its owner and mode from the upper directory.
            os.chown(layers / "project" / "upper", lower.st_uid, lower.st_gid)
            os.chmod(layers / "project" / "upper", lower.st_mode & 0o7777)
            os.utime(layers / "project" / "upper", ns=(lower.st_atime_ns, lower.st_mtime_ns))
            (plan.sb / "root").mkdir()
            plan.lowers = {tree: list(plan.image.lowers[tree]) for tree in TREES}
            if plan.snapshot is not None:
                self._stage_snapshot(plan)
        else:
            project = plan.sb / "project"
            if plan.snapshot is not None and (plan.snapshot / "project").is_dir():
                copy_tree(plan.snapshot / "project", project)
            else:
                project.mkdir()
        cg = plan.space.cgroups
        if cg.available:
            data["cgroups"] = cg.paths(plan.name)
            cg.create(plan.name, memory=plan.limits.memory_bytes, pids=plan.pids_max,
                      cpu_millicores=plan.limits.cpu_millicores)
        elif plan.limits.memory_bytes or plan.limits.cpu_millicores:
            _say_once("limits-ignored", logging.WARNING,
                      "local backend: resource limits requested but cgroups are unavailable (%s): not enforced",
                      cg.reason)
        _write_meta(plan.sb, plan.name, data)

    def _stage_snapshot(self, plan: _Plan) -> None:
        """Snapshot layers become extra lower layers (hard-linked: nothing is copied but names)."""
        snap = plan.snapshot
        assert snap is not None
        levels = sorted((int(p.name) for p in (snap / "levels").iterdir() if p.name.isdigit()),
                        reverse=False) if (snap / "levels").is_dir() else []
        for level in levels:
            for tree in TREES:
                src = snap / "levels" / str(level) / tree
                if src.is_dir():
                    dst = plan.sb / "snap" / str(level) / tree
                    copy_tree(src, dst, hardlink=True)
        for tree in TREES:
            extra = [str(plan.sb / "snap" / str(level) / tree) for level in levels
                     if (plan.sb / "snap" / str(level) / tree).is_dir()]
            plan.lowers[tree] = extra + plan.lowers[tree]
        if (snap / "project").is_dir():
            copy_tree(snap / "project", plan.layers / "project" / "upper")

    def _server_args(self, plan: _Plan, project: str, ready_fd: int, socket: str) -> list[str]:
        assert self.runtime is not None
        args = ["serve", "--unix-socket", socket, "--project", project, "--no-inherit-env",
                "--ready-fd", str(ready_fd)]
        tool_env = dict(self.runtime.tool_env) if self.isolation == "bwrap" else {
            "PATH": os.environ.get("PATH", os.defpath), "LANG": os.environ.get("LANG", "C.UTF-8")}
        tool_env["IDEGYM_PROJECT_ROOT"] = project
        tool_env.update(plan.env)
        for key, value in tool_env.items():
            args += ["--tool-env", f"{key}={value}"]
        return args

    def _spawn(self, plan: _Plan, data: dict[str, Any]) -> int:
        if self.isolation == "bwrap":
            return self._spawn_bwrap(plan, data)
        return self._spawn_plain(plan, data)

    def _spawn_bwrap(self, plan: _Plan, data: dict[str, Any]) -> int:
        """Runs on the launcher thread: private mount namespace, mounts, bwrap; returns the ready fd."""
        assert self.runtime is not None
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        ready_r, ready_w = os.pipe()
        storage = plan.limits.storage_bytes
        tmp_size = min(storage, self.tmp_bytes) if storage else self.tmp_bytes
        shm_size = min(tmp_size, self.shm_bytes)
        args = self._server_args(plan, PROJECT_INSIDE, ready_w, f"{RUN_INSIDE}/{SOCKET_NAME}")
        args += ["--overlay-lower", f"{INSIDE}/image/project", "--overlay-layer", f"{INSIDE}/layer"]
        if not plan.run_as_root:
            # tools run as appuser, and a request's `user` can never make them root
            args += ["--tool-user", APPUSER[0], "--no-root-tools"]
        if self._memory_cgroup(plan):
            args += ["--memory-events", MEMORY_EVENTS_INSIDE]  # bash results say when the OOM killer struck
        runtime = self.runtime
        if plan.openenv:  # [openenv]
            args, runtime = _openenv_args(args, f"{RUN_INSIDE}/oe"), self._openenv_runtime()
        argv = ["bwrap", "--unshare-user", "--userns-block-fd", str(block_r), "--info-fd", str(info_w),
                "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if not plan.network:
            argv.append("--unshare-net")
        # Root in the sandbox is uid 0 of the host's kernel for file ownership: the global sysctls
        # (/proc/sys: core_pattern runs a program as host root) must be read-only. The server's
        # root tools cannot unmount this (they have no CAP_SYS_ADMIN).
        argv += ["--hostname", HOSTNAME, "--bind", str(plan.sb / "root"), "/", "--proc", "/proc",
                 "--ro-bind", "/proc/sys", "/proc/sys", "--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger",
                 "--dev", "/dev",
                 "--perms", "1777", "--size", str(tmp_size), "--tmpfs", "/tmp",
                 "--perms", "1777", "--size", str(shm_size), "--tmpfs", "/dev/shm",
                 "--new-session", "--chdir", "/", "--clearenv"]
        for key, value in runtime.server_env.items():
            argv += ["--setenv", key, value]
        if plan.openenv:  # [openenv] the image's env reaches the OpenEnv server (it names the task)
            for key, value in plan.env.items():
                argv += ["--setenv", key, value]
        argv += ["--", *runtime.argv(), *args]
        logf = open(plan.log, "ab")
        try:
            own_ns = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            try:
                linux.unshare_mount_namespace()
                try:
                    self._build_root(plan)
                    popen = subprocess.Popen(argv, pass_fds=(info_w, block_r, ready_w), stdin=subprocess.DEVNULL,
                                             stdout=logf, stderr=logf, start_new_session=True, cwd="/",
                                             env={"PATH": os.environ.get("PATH", os.defpath)})
                finally:
                    linux.enter_mount_namespace(own_ns)
            finally:
                os.close(own_ns)
        except BaseException:
            for fd in (info_r, block_w, ready_r):
                os.close(fd)
            raise
        finally:
            logf.close()
            for fd in (info_w, block_r, ready_w):
                os.close(fd)
        self._children[popen.pid] = popen
        data["monitor"] = linux.record(popen.pid)
        try:
            info = _read_info(info_r)
            child = int(info["child-pid"])
            data["init"] = linux.record(child)
            for map_file in ("uid_map", "gid_map"):
                with open(f"/proc/{child}/{map_file}", "w") as fh:
                    fh.write("0 0 65536\n")
            os.write(block_w, b"1")
        except BaseException:
            os.close(ready_r)
            raise
        finally:
            os.close(info_r)
            os.close(block_w)
        return ready_r

    def _build_root(self, plan: _Plan) -> None:
        """The sandbox's root tree, mounted in the launcher thread's private mount namespace."""
        assert self.runtime is not None
        root = plan.sb / "root"
        r = str(root)
        linux.mount("idegym-root", root, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "size=8m,mode=0755")
        for name in (*TREES, "proc", "dev", "tmp", "run", "run/idegym", "run/lock", "mnt", "srv"):
            os.mkdir(f"{r}/{name}")
        os.chmod(f"{r}/run/lock", 0o1777)
        for name in self._usr_links:
            os.symlink(f"usr/{name}", f"{r}/{name}")
        # Paths relative to the state directory (this thread's cwd is private after unshare):
        # shorter mount options, and /proc/mounts inside shows no host paths.
        os.chdir(self.state_dir)
        state = str(self.state_dir) + "/"

        def rel(path: str) -> str:
            return path[len(state):] if path.startswith(state) else path

        layers = rel(str(plan.layers))
        for tree in TREES:
            options = (f"lowerdir={':'.join(rel(p) for p in plan.lowers[tree])},upperdir={layers}/{tree}/upper,"
                       f"workdir={layers}/{tree}/work")
            if len(options) > 4000:
                raise BackendError(f"too many layers for /{tree} ({len(plan.lowers[tree])}): the overlay "
                                   "options exceed a page; rebuild the image from fewer bases or snapshots")
            linux.mount("overlay", f"{r}/{tree}", "overlay", 0, options)
        runtime = self._openenv_runtime() if plan.openenv else self.runtime  # [openenv]
        binds = [(host, inside, True) for host, inside in runtime.binds]
        binds += [(plan.project_lower, f"{INSIDE}/image/project", True),
                  (str(plan.layers / "project"), f"{INSIDE}/layer", False),
                  (str(plan.run), RUN_INSIDE, False)]
        if plan.export is not None:
            binds.append((str(plan.export), f"{INSIDE}/export", False))
        for host, inside, readonly in binds:
            target = r + inside
            if not os.path.isdir(target):
                os.makedirs(target)
            linux.bind(host, target, readonly=readonly)
        memory = self._memory_cgroup(plan)
        if memory:  # the sandbox's OOM-kill counter, read-only
            target = r + MEMORY_EVENTS_INSIDE
            os.makedirs(os.path.dirname(target), exist_ok=True)
            Path(target).touch()
            linux.bind(os.path.join(memory, "memory.oom_control"), target, readonly=True)

    @staticmethod
    def _memory_cgroup(plan: _Plan) -> str | None:
        cg = plan.space.cgroups
        return cg.paths(plan.name).get("memory") if cg.available else None

    # -- [openenv] -------------------------------------------------------------------------------
    # A sandbox of an `openenv` server runs the OpenEnv server (`python -m idegym_env.openenv.server
    # --in-sandbox`) where sandbox_server would run, listening on the same socket and reporting
    # ready on the same fd; the arguments sandbox_server would have had go after `--`, and the
    # OpenEnv server starts its own private sandbox_server with them. The sandbox also needs our
    # Python packages (idegym_env imports control_plane and sandbox_server); those not inside a
    # bound site-packages directory (an editable install) are copied and bound like sandbox_server.

    def _openenv_runtime(self) -> Runtime:
        assert self.runtime is not None
        if self._openenv_rt is None:
            import importlib.util
            import site

            site_dirs = [Path(p).resolve() for p in site.getsitepackages() if Path(p).is_dir()]  # as detect()
            binds, paths = list(self.runtime.binds), []
            for index, name in enumerate(("idegym_env", "control_plane", "sandbox_server")):
                found = importlib.util.find_spec(name)
                if found is None or not found.submodule_search_locations:
                    raise BackendError(f"openenv servers need the {name} package installed next to the control "
                                       "plane (pip install 'idegym[openenv]')", 500)
                package = Path(next(iter(found.submodule_search_locations))).resolve()
                if any(package.is_relative_to(d) for d in site_dirs):
                    continue  # importable from a bound site-packages directory already
                copy = sync_package(package, self.state_dir / "runtime" / "openenv")
                binds.append((str(copy), f"{INSIDE}/openenv/{index}"))
                paths.append(f"{INSIDE}/openenv/{index}")
            # The bound site-packages (a virtualenv's) go before the interpreter's own, which the
            # runtime's bootstrap leaves first on sys.path: there, e.g. an old typing_extensions
            # would shadow the one openenv-core needs.
            paths += [inside for _, inside in self.runtime.binds if inside.startswith(f"{INSIDE}/site/")]
            entry = "from sandbox_server.cli import main\n"
            if entry not in self.runtime.bootstrap:
                raise BackendError("the sandbox runtime's bootstrap has changed: cannot start openenv servers", 500)
            bootstrap = (f"import sys\nsys.path[:0] = {paths!r}\n"
                         + self.runtime.bootstrap.replace(entry, f"from {OPENENV_MODULE} import main\n"))
            # The OpenEnv server makes HTTP clients (httpx), which load the CA store: keep the real one.
            server_env = {k: v for k, v in self.runtime.server_env.items() if not k.startswith("SSL_CERT_")}
            self._openenv_rt = replace(self.runtime, binds=binds, bootstrap=bootstrap, server_env=server_env)
        return self._openenv_rt

    def _spawn_plain(self, plan: _Plan, data: dict[str, Any]) -> int:
        """isolation='none': the server as a plain child process with a per-sandbox project copy."""
        ready_r, ready_w = os.pipe()
        args = self._server_args(plan, str(plan.sb / "project"), ready_w, str(plan.run / SOCKET_NAME))
        args += ["--project-source", plan.project_lower, "--state-dir", str(plan.sb / "server-state")]
        env = {k: v for k, v in os.environ.items() if not k.startswith("IDEGYM_")}
        argv = [sys.executable, "-m", "sandbox_server", *args]
        if plan.openenv:  # [openenv] the OpenEnv server, with the image's env (it names the task)
            argv = [sys.executable, "-m", OPENENV_MODULE, *_openenv_args(args, str(plan.run / "oe"))]
            env.update(plan.env)
        logf = open(plan.log, "ab")
        try:
            popen = subprocess.Popen(argv, pass_fds=(ready_w,),
                                     stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                                     cwd=str(plan.sb), env=env)
        except BaseException:
            os.close(ready_r)
            raise
        finally:
            logf.close()
            os.close(ready_w)
        self._children[popen.pid] = popen
        data["server"] = linux.record(popen.pid)
        return ready_r

    @staticmethod
    def _publish_socket(data: dict[str, Any]) -> None:
        """Hard-link the server's socket to a path outside the sandbox's reach.

        The run directory is writable inside (the server creates its socket there), so root in
        the sandbox could later swap ``server.sock`` for a symlink to another sandbox's socket.
        The link made here, while only the server has run, keeps pointing at the genuine one.
        """
        src = Path(data["run_dir"]) / SOCKET_NAME
        if not stat.S_ISSOCK(os.lstat(src).st_mode):
            raise BackendError(f"the sandbox server did not create its socket {src}")
        dst = Path(data["run_dir"] + ".sock")
        if os.path.lexists(dst):
            dst.unlink()
        os.link(src, dst, follow_symlinks=False)
        data["socket"] = str(dst)

    async def _wait_ready(self, fd: int, remaining: float, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bytes] = loop.create_future()
        buf = bytearray()

        def readable() -> None:
            try:
                chunk = os.read(fd, 64)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            buf.extend(chunk)
            if (not chunk or b"\n" in buf) and not done.done():
                done.set_result(bytes(buf))

        os.set_blocking(fd, False)
        loop.add_reader(fd, readable)
        try:
            line = await asyncio.wait_for(done, remaining)
        except TimeoutError:
            raise BackendError(f"the sandbox server did not become ready within {timeout:g} s", 504) from None
        finally:
            loop.remove_reader(fd)
            os.close(fd)
        if line.strip() != b"ready":
            raise BackendError("the sandbox server exited before it was ready")

    def _attach_sync(self, data: dict[str, Any]) -> None:
        """Record the server's pid and put the sandbox's processes into its cgroups.

        In a bwrap sandbox the server is the only child of the namespace's init; until it is
        ready it starts nothing, so every later process inherits the groups.
        """
        if data["isolation"] == "bwrap":
            init = data["init"]
            deadline = time.monotonic() + 30
            kids: list[int] = []
            while time.monotonic() < deadline and linux.recorded_alive(init):
                kids = linux.children(init[0])
                if kids:
                    break
                time.sleep(0.0005)
            if not kids:
                raise BackendError("the sandbox's init process exited before starting the server")
            data["server"] = linux.record(kids[0])
            pids = [init[0], kids[0]]
        else:
            pids = [data["server"][0]]
        if data["cgroups"]:
            for pid in pids:
                Cgroups.attach(data["cgroups"], pid)

    # -- observe / delete -------------------------------------------------------------------------

    async def observe(self, handle: SandboxHandle) -> Observation:
        data = handle.data
        self._reap()
        server = data.get("server")
        if linux.recorded_alive(server):
            return Observation(exists=True, running=True, ready=os.path.exists(data["socket"]), phase="Running")
        exists = os.path.isdir(data.get("dir", ""))
        if not exists:
            return Observation(exists=False, running=False, ready=False, phase=None,
                               reason="the sandbox does not exist (deleted)")
        reason = f"the sandbox server (pid {server[0] if server else '?'}) is gone"
        if data.get("cgroups") and Cgroups.oom_kills(data["cgroups"]):
            reason += "; processes were killed by the sandbox's memory limit (OOM)"
        last = linux.tail(Path(data["log"]), 5).strip()
        if last:
            reason += f"; last log lines: {last}"
        return Observation(exists=True, running=False, ready=False, phase="Failed", reason=reason)

    async def delete(self, handle: SandboxHandle) -> None:
        space = self.builds if handle.data.get("space") == "builds" else self.sandboxes
        await self._delete(handle.name, space, handle.data)

    async def _delete(self, name: str, space: _Space | None, data: dict[str, Any] | None) -> None:
        self._check_started()
        assert space is not None
        await asyncio.get_running_loop().run_in_executor(None, self._destroy_sync, name, space, data)

    def _destroy_sync(self, name: str, space: _Space, data: dict[str, Any] | None) -> None:
        """Kill, unmount, remove: every step works from what is left (idempotent, half-created ok)."""
        sb, run, cgroups, problems = self._kill_sync(name, space, data)
        if cgroups:
            stuck = Cgroups.remove(cgroups)
            if stuck:
                problems.append(f"cgroups {stuck} could not be removed")
        for base in (sb, run):
            for point in linux.mounts_under(base):
                try:
                    linux.umount(point, detach=True)
                except OSError as exc:
                    problems.append(str(exc))
        socket_link = Path(str(run) + ".sock")
        if os.path.lexists(socket_link):
            socket_link.unlink()
        for base in (sb, run):
            shutil.rmtree(base, ignore_errors=True)
            if base.exists():
                problems.append(f"{base} could not be removed")
        self._tidy(space)
        if problems:
            raise BackendError(f"deleting sandbox {name!r} left something behind: {'; '.join(problems)}")

    def _tidy(self, space: _Space) -> None:
        """Remove shared parents once empty (cgroup parents, a socket directory outside the state)."""
        space.cgroups.remove_parent_if_empty()
        if not self._run_root.is_relative_to(self.state_dir):
            try:
                self._run_root.rmdir()
            except OSError:
                pass

    def _kill_sync(self, name: str, space: _Space, data: dict[str, Any] | None
                   ) -> tuple[Path, Path, dict[str, str], list[str]]:
        """End every process of a sandbox (its whole pid namespace); files and groups stay."""
        if not NAME_RE.match(name):
            raise BackendError(f"invalid sandbox name {name!r}", 400)
        sb = space.root / name
        if data is None:
            data = _read_meta(sb) or {}
        sb = Path(data.get("dir") or sb)
        run = Path(data.get("run_dir") or self.run_dir(name, space))
        cgroups = {c: p for c, p in (data.get("cgroups") or space.cgroups.paths(name)).items() if os.path.isdir(p)}
        matches = set(linux.pids_with_cmdline(f"{sb}/")) | set(linux.pids_with_cmdline(f"{run}/"))
        for key in ("init", "server", "monitor"):
            rec = data.get(key)
            if linux.recorded_alive(rec):
                matches.add(rec[0])
        # Processes whose command line names the sandbox directory: bwrap's launcher ("monitor")
        # and the namespace's init (even when the control plane died before recording them), or a
        # plain server. The monitor is left to reap init, so that no zombie lingers.
        monitors: set[int] = set()
        if data.get("isolation", self.isolation) == "bwrap":
            parents = {pid: (linux.proc_stat(pid) or ("", 0, 0))[1] for pid in matches}
            monitors = {pid for pid, ppid in parents.items() if ppid not in matches}
            monitors -= {data["init"][0]} if data.get("init") else set()
        victims = matches - monitors
        if victims:
            tree = linux.process_tree()
            family = set(victims)
            for pid in victims:
                family.update(linux.descendants(pid, tree))
            if not cgroups.get("freezer"):
                # No freezer: stop them first so that nothing forks or re-parents meanwhile.
                # (Never combined with the freezer: a stopped task keeps a group FREEZING.)
                for pid in family:
                    linux.kill(pid, signal.SIGSTOP)
            victims = family
        if cgroups:
            victims |= Cgroups.procs(cgroups)
            Cgroups.kill_all(cgroups, extra=victims)  # frozen, killed, thawed
        for pid in victims:
            linux.kill(pid, signal.SIGKILL)
        left = linux.wait_gone(victims, 10.0)
        if monitors:  # they exit once init has; force them if they do not
            left += linux.wait_gone(monitors, 1.0)
            for pid in monitors:
                linux.kill(pid, signal.SIGKILL)
            left = [p for p in left if p not in monitors] + linux.wait_gone(monitors, 5.0)
        self._reap()
        problems = [f"processes {left} did not die"] if left else []
        return sb, run, cgroups, problems

    def _reap(self) -> None:
        for pid, popen in list(self._children.items()):
            if popen.poll() is not None:
                self._children.pop(pid, None)  # deletes run in several threads at once

    async def list_names(self) -> set[str]:
        self._check_started()
        assert self.sandboxes is not None
        return await asyncio.get_running_loop().run_in_executor(None, self._names, self.sandboxes)

    def _names(self, space: _Space) -> set[str]:
        return self._all_names(space) - self._creating

    def _all_names(self, space: _Space) -> set[str]:
        names = {e.name for e in os.scandir(space.root) if e.is_dir() and NAME_RE.match(e.name)}
        names |= {n for n in space.cgroups.names() if NAME_RE.match(n)}
        prefix = str(space.root) + "/"
        for point in linux.mounts_under(space.root):
            rest = point[len(prefix):].split("/", 1)[0]
            if NAME_RE.match(rest):
                names.add(rest)
        if space is self.sandboxes and self._run_root.is_dir() and self._run_root != space.root:
            for entry in os.scandir(self._run_root):
                short = entry.name.removesuffix(".sock")
                if short.startswith("b-"):
                    continue
                try:
                    names.add(Path(self._run_root, short, ".name").read_text().strip())
                except OSError:
                    if NAME_RE.match(short) and len(short) <= 24:
                        names.add(short)
        return names

    async def delete_name(self, name: str) -> None:
        await self._delete(name, self.sandboxes, None)

    # -- snapshots --------------------------------------------------------------------------------

    def supports_snapshots(self) -> bool:
        return True

    def _snapshot_dir(self, snapshot_id: str) -> Path:
        if not re.match(r"^[A-Za-z0-9_.-]+$", snapshot_id) or snapshot_id.startswith("."):
            raise BackendError(f"invalid snapshot id {snapshot_id!r}", 400)
        return self.snapshots_dir / snapshot_id

    def _snapshot_meta(self, snap: Path) -> dict[str, Any]:
        try:
            return json.loads((snap / "snapshot.json").read_text())
        except (OSError, ValueError):
            raise BackendError(f"snapshot {snap.name!r} does not exist", 404) from None

    async def snapshot(self, handle: SandboxHandle, group: str) -> SnapshotInfo:
        self._check_started()
        data = handle.data
        if not linux.recorded_alive(data.get("server")):
            raise BackendError(f"sandbox {handle.name!r} is not running: nothing to snapshot", 409)
        safe_group = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(group))[:40] or "snapshot"
        snapshot_id = f"{safe_group}-{secrets.token_hex(6)}"
        return await asyncio.get_running_loop().run_in_executor(None, self._snapshot_sync, data, snapshot_id,
                                                                str(group))

    def _snapshot_sync(self, data: dict[str, Any], snapshot_id: str, group: str) -> SnapshotInfo:
        sb = Path(data["dir"])
        tmp = self.snapshots_dir / f".tmp-{snapshot_id}"
        tmp.mkdir(parents=True)
        freezing = Cgroups.freeze(data["cgroups"]) if data.get("cgroups") else None
        frozen = bool(freezing)
        try:
            if data["isolation"] == "bwrap":
                for tree in TREES:
                    upper = sb / "layers" / tree / "upper"
                    if upper.is_dir() and any(upper.iterdir()):
                        copy_tree(upper, tmp / "levels" / "0" / tree)
                snap = sb / "snap"
                if snap.is_dir():  # the sandbox itself came from a snapshot: keep those layers below
                    for level in sorted(int(p.name) for p in snap.iterdir() if p.name.isdigit()):
                        copy_tree(snap / str(level), tmp / "levels" / str(level + 1), hardlink=True)
                copy_tree(sb / "layers" / "project" / "upper", tmp / "project")
            else:
                copy_tree(sb / "project", tmp / "project")
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, ImageError):
                raise BackendError(f"snapshot of {data['dir']} failed: {exc}", 409) from exc
            raise
        finally:
            if freezing is not None:  # thawed even when freezing did not complete in time
                Cgroups.thaw(data["cgroups"])
        size = sum(e.stat(follow_symlinks=False).st_size for e in tmp.rglob("*"))
        meta = {"id": snapshot_id, "group": group, "image": data["image"], "image_id": data["image_id"],
                "isolation": data["isolation"], "created": time.time(), "frozen": frozen, "size_bytes": size}
        (tmp / "snapshot.json").write_text(json.dumps(meta, indent=1))
        tmp.rename(self.snapshots_dir / snapshot_id)
        return SnapshotInfo(snapshot_id, data["image"], size)

    async def snapshot_exists(self, snapshot_id: str) -> bool:
        try:
            return (self._snapshot_dir(snapshot_id) / "snapshot.json").exists()
        except BackendError:
            return False

    async def delete_snapshot(self, snapshot_id: str) -> None:
        snap = self._snapshot_dir(snapshot_id)
        if snap.exists():
            trash = self.snapshots_dir / f".del-{snapshot_id}-{secrets.token_hex(3)}"
            snap.rename(trash)  # atomically gone for snapshot_exists; sandboxes hold hard links
            await asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, trash, True)


# -- helpers -------------------------------------------------------------------------------------------


OPENENV_MODULE = "idegym_env.openenv.server"  # [openenv]


def _openenv_args(server_args: list[str], inner_dir: str) -> list[str]:
    """[openenv] sandbox_server's arguments -> the OpenEnv server's: it takes the socket and the
    ready fd, and passes the rest to the sandbox server it starts, whose socket goes in
    ``inner_dir`` (in the run directory: short, private, removed with the sandbox)."""
    own, rest, items = [], [], iter(server_args)
    for item in items:
        if item in ("--unix-socket", "--ready-fd"):
            own += [item, next(items)]
        else:
            rest.append(item)
    return ["--in-sandbox", *own, "--inner-dir", inner_dir, "--", *rest]


def _read_info(fd: int) -> dict[str, Any]:
    buf = b""
    while True:
        chunk = os.read(fd, 4096)
        if chunk:
            buf += chunk
            try:
                return json.loads(buf)
            except ValueError:
                continue
        raise BackendError("bubblewrap exited before setting up the sandbox")


def _write_meta(sb: Path, name: str, data: dict[str, Any]) -> None:
    if not sb.is_dir():
        return
    tmp = sb / f".sandbox.json.{secrets.token_hex(3)}"
    tmp.write_text(json.dumps({"name": name, **data}, indent=1))
    tmp.replace(sb / "sandbox.json")


def _read_meta(sb: Path) -> dict[str, Any] | None:
    try:
        return json.loads((sb / "sandbox.json").read_text())
    except (OSError, ValueError):
        return None
