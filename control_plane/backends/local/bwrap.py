"""Starting a sandbox's server in bubblewrap (see ``backend.py`` for what a sandbox is).

Runs on one of the backend's launch threads: it gives itself a private mount namespace, mounts the
sandbox's root there (``rootfs.mount_root``), starts bwrap (which inherits that namespace),
writes the new user namespace's id maps while bwrap waits for them, and returns to its own
namespace. The server's readiness is reported on a pipe (``readiness.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_server import procfs

from ...appuser import APPUSER
from ..base import BackendError
from . import cgroups, layer_mounts, mounts, priority, usernet
from .handle_data import LocalHandleData, required
from .hostconfig import MOUNT as HOST_CONFIG_MOUNT
from .image_trees import HOSTNAME
from .layout import MEMORY_EVENTS_INSIDE, RUN_INSIDE, SOCKET_NAME, TOOL_CGROUPS_INSIDE, Plan
from .rootfs import mount_root
from .runtime import INSIDE, Runtime
from .server_kinds import ServerKindEntry, sandbox_server_args, stage_task

ID_MAP = "0 0 65536\n"  # uids/gids 0-65535 are themselves inside: files keep their owners
# The init of a sandbox whose server comes from the zygote (bwrap --as-pid-1): it reads its stdin
# until the server, the write end's only holder, is gone; then it exits and the sandbox ends.
PLACEHOLDER = ("/usr/bin/cat",)


@dataclass
class BwrapHost:
    """What every bwrap launch of one backend shares."""

    state_dir: Path
    usr_links: list[str]
    tmp_bytes: int
    shm_bytes: int


def tmp_size(plan: Plan, host: BwrapHost) -> int:
    """``/tmp`` (RAM): the backend's size, or less when the sandbox asked for less storage."""
    storage = plan.limits.storage_bytes
    return min(storage, host.tmp_bytes) if storage else host.tmp_bytes


def server_args(plan: Plan, runtime: Runtime, kind: ServerKindEntry, *, ready_fd: int,
                tool_cgroups: dict[str, str], forget_task: bool = False) -> list[str]:
    """The arguments of ``kind``'s ``main(argv)`` in the sandbox of ``plan``."""
    args = sandbox_server_args(plan, runtime.tool_env, plan.image.project_dir, ready_fd,
                               f"{RUN_INSIDE}/{SOCKET_NAME}")
    args += ["--overlay-lower", f"{INSIDE}/image/project", "--overlay-layer", f"{INSIDE}/layer"]
    if not plan.run_as_root:
        # tools run as appuser, and a request's `user` can never make them root
        args += ["--tool-user", APPUSER.name, "--no-root-tools"]
    if "memory" in tool_cgroups:
        args += ["--memory-events", MEMORY_EVENTS_INSIDE]  # bash results say when the OOM killer struck
    if tool_cgroups:
        args += ["--tool-cgroups", TOOL_CGROUPS_INSIDE]
    return kind.server_args(args, f"{RUN_INSIDE}/oe", forget_task=forget_task)


def server_env(plan: Plan, runtime: Runtime, kind: ServerKindEntry) -> dict[str, str]:
    env = dict(runtime.server_env)
    if kind.image_env:
        env.update(plan.env)
    return env


def argv(plan: Plan, host: BwrapHost, command: list[str], env: dict[str, str], *, info_fd: int, block_fd: int,
         resolv_fd: int | None = None, as_pid_1: bool = False) -> list[str]:
    """bwrap's command line for ``plan`` running ``command`` (as the namespace's init itself with
    ``as_pid_1``); ``resolv_fd`` (a networked sandbox) holds its resolv.conf."""
    shm_size = min(tmp_size(plan, host), host.shm_bytes)
    # Always a network namespace of its own; with network, user-mode networking (usernet.py) gives it a way out.
    out = ["bwrap", "--unshare-user", "--userns-block-fd", str(block_fd), "--info-fd", str(info_fd),
           "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if plan.network_peer is None:  # else it is started in its peer's network namespace (spawn)
        out.append("--unshare-net")
    # Root in the sandbox is uid 0 of the host's kernel for file ownership: the global sysctls
    # (/proc/sys: core_pattern runs a program as host root) must be read-only. The server's
    # root tools cannot unmount this (they have no CAP_SYS_ADMIN).
    out += ["--hostname", HOSTNAME, "--bind", str(plan.sb / "root"), "/", "--proc", "/proc",
            "--ro-bind", "/proc/sys", "/proc/sys", "--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger",
            "--dev", "/dev",
            "--perms", "1777", "--size", str(shm_size), "--tmpfs", "/dev/shm",
            "--new-session", "--chdir", "/", "--clearenv"]
    if resolv_fd is not None:
        out += ["--perms", "0644", "--ro-bind-data", str(resolv_fd), "/etc/resolv.conf"]
    if plan.host_config is not None:
        out += ["--ro-bind", str(plan.host_config), HOST_CONFIG_MOUNT]
    if as_pid_1:  # the placeholder: root without a single capability, as bwrap's own init is
        out += ["--as-pid-1", "--cap-drop", "ALL"]
    for key, value in env.items():
        out += ["--setenv", key, value]
    return [*out, "--", *command]


@dataclass
class PendingSandbox:
    """A sandbox whose server the zygote is to fork (``zygote.fork_server``): its init is
    ``PLACEHOLDER``, which ends the sandbox when the server, the only holder of ``keep_w``, has."""

    argv: list[str]
    env: dict[str, str]
    ready_w: int
    keep_w: int
    log_fd: int

    def close(self) -> None:
        for fd in (self.ready_w, self.keep_w, self.log_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def _peer_network_namespace(peer: LocalHandleData) -> int:
    """A descriptor of the network namespace of the sandbox ``peer`` records (its init's, checked
    to be that process still); ports below 1024 are opened to its users (they are in a user
    namespace of their own, which does not own that network namespace)."""
    init = peer.init
    if init is None or not procfs.recorded_alive(init):
        raise BackendError(f"the sandbox whose network is to be joined ({peer.dir}) is not running", 409)
    fd = os.open(f"/proc/{init[0]}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        mounts.enter_network_namespace(fd)
        with open("/proc/sys/net/ipv4/ip_unprivileged_port_start", "w") as fh:
            fh.write("0")
    finally:
        mounts.enter_network_namespace(own)
        os.close(own)
    return fd


def spawn(plan: Plan, data: LocalHandleData, host: BwrapHost, runtime: Runtime, kind: ServerKindEntry,
          tool_cgroups: dict[str, str], track: Callable[[subprocess.Popen], None], *, forked: bool = False,
          nice: int = priority.NORMAL_NICE) -> tuple[int, PendingSandbox | None]:
    """Start bwrap for ``plan``; records ``monitor`` (bwrap) and ``init`` (the namespace's first
    process) in ``data`` and hands bwrap's Popen to ``track``. Returns the fd the server reports
    ready on, and with ``forked`` (and an image that has the placeholder) what the zygote needs to
    fork the server: bwrap then runs only the placeholder. Both run at ``nice`` before init sets
    the sandbox up (what they start inherits it)."""
    # A sandbox that joins another's network namespace has that one's network: no slirp4netns of its own.
    slirp = usernet.require() if plan.network and plan.network_peer is None else None
    staged = stage_task(plan, kind)  # (before any descriptor is opened: nothing to close if it fails)
    peer_net = _peer_network_namespace(plan.network_peer) if plan.network_peer is not None else None
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    ready_r, ready_w = os.pipe()
    keep_r, keep_w = os.pipe() if forked else (-1, -1)
    # A networked sandbox: slirp4netns ends once nobody holds exit_w (bwrap and the namespace do).
    exit_r, exit_w = os.pipe() if slirp else (-1, -1)
    resolv = usernet.resolv_conf_fd() if plan.network else None
    args = server_args(plan, runtime, kind, ready_fd=ready_w, tool_cgroups=tool_cgroups, forget_task=bool(staged))
    server_groups = cgroups.sub(data.cgroups, cgroups.SERVER) if data.cgroups else {}
    env = {**server_env(plan, runtime, kind), **staged}
    pending: PendingSandbox | None = None
    inherited: tuple[int, ...]
    logf = open(plan.log, "ab")
    try:
        own_ns = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        try:
            mounts.unshare_mount_namespace()
            try:
                # bwrap's monitor lives on in this private copy of the host's mounts: without this,
                # it would hold every other sandbox's layers (and their disk space) until it ends.
                layer_mounts.drop_other_layers(plan.layers)
                mount_root(plan, state_dir=host.state_dir, links=host.usr_links, binds=runtime.binds,
                           tool_cgroups=tool_cgroups, tmp_bytes=tmp_size(plan, host),
                           skeletons=tuple(runtime.skeletons))
                if forked and os.access(f"{plan.sb}/root{PLACEHOLDER[0]}", os.X_OK):
                    pending = PendingSandbox(args, env, ready_w, keep_w, os.dup(logf.fileno()))
                    # The placeholder runs on the image's own libraries: none of the server's
                    # environment (an OCI image's server has LD_LIBRARY_PATH on the host's).
                    command, command_env, stdin, inherited = list(PLACEHOLDER), {}, keep_r, (info_w, block_r)
                else:  # an image without the placeholder: its server starts the long way
                    command, command_env, stdin = [*runtime.argv(kind.module), *args], env, subprocess.DEVNULL
                    inherited = (info_w, block_r, ready_w)
                inherited += (exit_w,) if slirp else ()
                inherited += (resolv,) if resolv is not None else ()
                own_net = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC) if peer_net else -1
                try:
                    if peer_net is not None:
                        mounts.enter_network_namespace(peer_net)
                    # Born in the server's groups: its init (and a server started the long way) never moved.
                    with cgroups.born_in(server_groups):
                        popen = subprocess.Popen(argv(plan, host, command, command_env, info_fd=info_w,
                                                      block_fd=block_r, resolv_fd=resolv,
                                                      as_pid_1=pending is not None),
                                                 pass_fds=inherited, stdin=stdin, stdout=logf, stderr=logf,
                                                 start_new_session=True, cwd="/",
                                                 env={"PATH": os.environ.get("PATH", os.defpath)})
                finally:
                    if own_net >= 0:
                        mounts.enter_network_namespace(own_net)
                        os.close(own_net)
            finally:
                mounts.enter_mount_namespace(own_ns)
        finally:
            os.close(own_ns)
    except BaseException:
        if pending is not None:
            pending.close()
        for fd in (info_r, block_w, ready_r, *((exit_r,) if slirp else ())):
            os.close(fd)
        logf.close()
        raise
    finally:
        for fd in (info_w, block_r, keep_r, *((exit_w,) if slirp else ()), *((resolv,) if resolv is not None else ()),
                   *((peer_net,) if peer_net is not None else ())):
            if fd >= 0:
                os.close(fd)
        if pending is None:
            for fd in (ready_w, keep_w):
                if fd >= 0:
                    os.close(fd)
    try:
        track(popen)
        data.monitor = procfs.record(popen.pid)
        child = int(_read_info(info_r)["child-pid"])
        data.init = procfs.record(child)
        track(popen)  # with init recorded
        for map_file in ("uid_map", "gid_map"):
            with open(f"/proc/{child}/{map_file}", "w") as fh:
                fh.write(ID_MAP)
        if nice != priority.NORMAL_NICE:
            priority.set_tasks((popen.pid, child), nice)
        os.write(block_w, b"1")
        if slirp:  # once bwrap has set up the namespace's loopback (it fails if lo is up already)
            init = required(data.init, "init")
            usernet.start(slirp, init, exit_r, data, logf, track, lambda: set_up(init, placeholder=pending is not None),
                          server_groups)
    except BaseException:
        os.close(ready_r)
        if pending is not None:
            pending.close()
        raise
    finally:
        os.close(info_r)
        os.close(block_w)
        logf.close()
        if slirp:
            os.close(exit_r)
    return ready_r, pending


def set_up(init: list[int], *, placeholder: bool) -> bool:
    """Whether bwrap has made the sandbox (its mounts, its loopback): once init runs the
    placeholder, or has started the server as its child."""
    if not placeholder:
        return bool(procfs.children(init[0]))
    try:
        return os.readlink(f"/proc/{init[0]}/exe") == PLACEHOLDER[0]
    except OSError:
        return False


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
