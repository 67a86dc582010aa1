"""The host's side of the template process (``sandbox_server/zygote.py``): start it, ask it for
a server in a sandbox, end it.

It runs in bubblewrap as root without a user namespace of its own (it must be able to join
every sandbox's): a mount namespace whose root holds only the host's ``/usr`` and the sandbox
runtime's binds at the paths a sandbox has them, nothing of the state directory or of any
other sandbox (so it pins none of their mounts), the server's environment and nothing of the
control plane's. It dies with the control plane (``--die-with-parent``); the servers it made
live on in their sandboxes, which end as they always do (their leases, their init).

Requests come from launch threads, one at a time (a lock).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import threading
from pathlib import Path

from sandbox_server import procfs
from sandbox_server import zygote as zygote_side
from sandbox_server.polling import wait_until

from ...ephemeral_state import named
from ..base import BackendError
from .bwrap import PendingSandbox, set_up
from .cgroups import SERVER, sub
from .handle_data import LocalHandleData, required
from .readiness import INIT_CHILD_TIMEOUT
from .runtime import SERVER_MODULE, Runtime

log = logging.getLogger(__name__)

ZYGOTE_MODULE = "sandbox_server.zygote"
START_TIMEOUT = 60.0
REPLY_TIMEOUT = 10.0
NAMESPACES = tuple(zygote_side.NAMESPACES)  # in the order the zygote joins them


class ZygoteError(BackendError):
    pass


class Zygote:
    """One template process for one runtime; started on first use, again if it died."""

    def __init__(self, runtime: Runtime, usr_links: list[str], log_path: Path) -> None:
        self.runtime = runtime
        self.usr_links = usr_links
        self.log_path = log_path
        self._popen: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()  # one request at a time on the socket
        self._pid: int | None = None

    def argv(self, child_fd: int) -> list[str]:
        # /proc and /tmp for its warm-up (sandbox_server/zygote.py): a server, run once here.
        out = ["bwrap", "--die-with-parent", "--ro-bind", "/usr", "/usr", "--dev", "/dev", "--proc", "/proc",
               "--tmpfs", "/tmp", "--chdir", "/", "--clearenv"]
        for name in self.usr_links:
            out += ["--symlink", f"usr/{name}", f"/{name}"]
        for host, inside in self.runtime.binds:
            out += ["--ro-bind", host, inside]
        for key, value in self.runtime.server_env.items():
            out += ["--setenv", key, value]
        return [*out, "--", *self.runtime.argv(ZYGOTE_MODULE), "--socket-fd", str(child_fd)]

    @property
    def pid(self) -> int | None:
        """The template process's (bubblewrap's child), while it runs."""
        return self._pid if self._popen is not None and self._popen.poll() is None else None

    def ensure(self) -> None:
        """Running, or started now (and ready to fork: the imports done)."""
        if self.pid is not None:
            return
        self.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(self.log_path, "ab") as logf:
            try:
                self._popen = subprocess.Popen(self.argv(theirs.fileno()), pass_fds=(theirs.fileno(),),
                                               stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                               start_new_session=True, env={"PATH": os.environ.get("PATH", os.defpath)})
            finally:
                theirs.close()
        self._sock = ours
        # Its first reply says it imported everything: a ping is an empty namespace list.
        reply = self._ask({"ping": True}, [], START_TIMEOUT)
        if not reply.get("pong"):
            self.close()
            raise ZygoteError(f"the sandbox server zygote did not start: {reply}; see {named(self.log_path)}", 500)
        self._pid = int(reply["pong"])

    def spawn(self, *, module: str, argv: list[str], env: dict[str, str], namespaces: dict[str, int],
              cgroup_tasks: list[int], fds: dict[int, int], cloexec: tuple[int, ...] = (), nice: int = 0) -> int:
        """A server in the sandbox whose namespaces are ``namespaces`` (name -> descriptor):
        ``module``'s ``main(argv)`` with environment ``env``, descriptor ``fds[n]`` at number n.
        It joins the groups whose ``tasks`` are open in ``cgroup_tasks``, then takes the
        nice value ``nice`` (whatever the zygote's own). Returns its pid. Every descriptor stays
        the caller's to close."""
        request = {"module": module, "argv": argv, "env": env, "namespaces": list(namespaces),
                   "cgroups": len(cgroup_tasks), "targets": list(fds), "cloexec": list(cloexec), "nice": nice}
        with self._lock:
            self.ensure()
            reply = self._ask(request, [*namespaces.values(), *cgroup_tasks, *fds.values()], REPLY_TIMEOUT)
        if "pid" not in reply:
            raise ZygoteError(f"the sandbox server zygote could not start the server: {reply.get('error', reply)}",
                              500)
        return int(reply["pid"])

    def _ask(self, request: dict, fds: list[int], timeout: float) -> dict:
        assert self._sock is not None
        self._sock.settimeout(timeout)
        try:
            socket.send_fds(self._sock, [json.dumps(request).encode()], fds)
            raw = self._sock.recv(1 << 16)
        except TimeoutError:
            self.close()  # a late reply would answer the next request
            raise ZygoteError(f"the sandbox server zygote did not answer within {timeout:g} s; "
                              f"see {named(self.log_path)}", 500) from None
        except OSError as exc:
            self.close()
            raise ZygoteError(f"the sandbox server zygote is gone ({exc}); see {named(self.log_path)}", 500) from exc
        if not raw:
            self.close()
            raise ZygoteError(f"the sandbox server zygote exited; see {named(self.log_path)}", 500)
        return json.loads(raw)

    def close(self) -> None:
        """End it (closing the socket is its signal to exit); the servers it made live on."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._popen is not None:
            try:
                self._popen.wait(5)
            except subprocess.TimeoutExpired:
                self._popen.kill()
                self._popen.wait()
            self._popen = None


def fork_server(zygote: Zygote, data: LocalHandleData, pending: PendingSandbox, nice: int = 0) -> None:
    """The server of a sandbox whose init is the placeholder, forked by ``zygote`` into its
    namespaces and its server cgroups once the placeholder runs (bwrap has made the sandbox's
    root by then), at the nice value ``nice``; records ``server``. Closes ``pending``'s
    descriptors whatever happens (the server holds its own)."""
    opened: list[int] = []
    try:
        init = required(data.init, "init")
        wait_until(lambda: set_up(init, placeholder=True) or not procfs.recorded_alive(init), INIT_CHILD_TIMEOUT,
                   first=0.0005, cap=0.0005)
        if not procfs.recorded_alive(init):
            raise BackendError("the sandbox's init exited before its server was started")
        data.forked = True
        namespaces = {}
        for name in NAMESPACES:
            try:
                namespaces[name] = os.open(f"/proc/{init[0]}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:  # a kernel without cgroup namespaces
                continue
            opened.append(namespaces[name])
        cgroup_tasks = []
        for path in (sub(data.cgroups, SERVER).values() if data.cgroups else ()):
            cgroup_tasks.append(os.open(f"{path}/tasks", os.O_WRONLY | os.O_CLOEXEC))
            opened.append(cgroup_tasks[-1])
        devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        opened.append(devnull)
        fds = {0: devnull, 1: pending.log_fd, 2: pending.log_fd, pending.ready_w: pending.ready_w,
               pending.keep_w: pending.keep_w}
        pid = zygote.spawn(module=SERVER_MODULE, argv=pending.argv, env=pending.env, namespaces=namespaces,
                           cgroup_tasks=cgroup_tasks, fds=fds, cloexec=(pending.keep_w,), nice=nice)
        data.server = procfs.record(pid)
        if data.server is None:
            raise BackendError("the sandbox server exited as soon as it was forked")
    finally:
        for fd in opened:
            os.close(fd)
        pending.close()
