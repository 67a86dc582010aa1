"""The private sandbox server of an OpenEnv server that runs inside its own sandbox.

In an ``openenv`` sandbox the backend starts ``python -m idegym_env.openenv.server --in-sandbox
... -- SANDBOX_SERVER_ARGS`` where it would otherwise start ``sandbox_server``, with exactly the
arguments it would have given ``sandbox_server`` (project, overlay, tool user, tool environment,
``--no-root-tools``…) after ``--``. :class:`InnerSandbox` runs that ``sandbox_server`` as a child
process on a Unix socket in a private directory (mode 0700, so tools running as another user
cannot reach it; the backend names one that goes away with the sandbox, else it is a new temporary
directory), and the episode talks to it with ``Sandbox.connect(unix_socket=...)``.

The child starts on first use, not with the OpenEnv server: the backend moves the server into the
sandbox's cgroups while the server starts up, and only processes forked *after* that inherit the
limits. The first use is a ``reset``, which can only come once the backend has handed out the
sandbox, i.e. after the move. It costs the first reset the child's start-up (a few hundred ms).

If the child dies, the OpenEnv server shuts down, so the control plane sees a crashed sandbox
(and restarts it within ``max_restarts``) instead of a server that answers but cannot act.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from ..client import Sandbox
from ..ready_pipe import read_ready

log = logging.getLogger(__name__)

START_TIMEOUT = 60.0
BOOTSTRAP = (
    "import sys\n"
    "sys.path[:0] = {path!r}\n"
    "from sandbox_server.cli import main\n"
    "main(sys.argv[1:])\n"
)


class InnerSandbox:
    """``sandbox_server`` started (once, lazily) with ``server_args``; ``lease`` marks the session
    that uses it. ``on_exit`` runs if the server dies on its own."""

    def __init__(self, server_args: list[str], *, directory: str | None = None, on_exit=None,
                 start_timeout: float = START_TIMEOUT) -> None:
        if not server_args or server_args[0] != "serve":
            server_args = ["serve", *server_args]
        for flag in ("--unix-socket", "--port", "--ready-fd"):
            if flag in server_args:
                raise ValueError(f"{flag} is chosen by the OpenEnv server for its sandbox server; leave it out")
        self.server_args = list(server_args)
        self.start_timeout = start_timeout
        self.on_exit = on_exit
        self.directory = directory
        self.lease = threading.Lock()
        self.socket: str | None = None
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._dir: str | None = None
        self._stopping = False

    def ensure_started(self) -> str:
        """The sandbox server's socket, starting the server on first call."""
        with self._lock:
            if self._stopping:
                raise RuntimeError("the OpenEnv server is shutting down")
            if self._proc is not None:
                if self._proc.poll() is not None:
                    raise RuntimeError(f"the sandbox server exited (status {self._proc.returncode})")
                assert self.socket is not None
                return self.socket
            if self.directory is None:
                self._dir = tempfile.mkdtemp(prefix="idegym-openenv-")  # 0700
            else:
                os.makedirs(self.directory, mode=0o700, exist_ok=True)
                os.chmod(self.directory, 0o700)
                self._dir = self.directory
            socket = os.path.join(self._dir, "sandbox.sock")
            read_fd, write_fd = os.pipe()
            path = [p for p in sys.path if p]
            argv = [sys.executable, "-I", "-c", BOOTSTRAP.format(path=path), self.server_args[0],
                    "--unix-socket", socket, "--ready-fd", str(write_fd), *self.server_args[1:]]
            started = time.perf_counter()
            try:
                self._proc = subprocess.Popen(argv, pass_fds=(write_fd,), stdin=subprocess.DEVNULL)
            finally:
                os.close(write_fd)
            line = read_ready(read_fd, self.start_timeout)
            if line.strip() != b"ready":
                self._kill()
                if self.on_exit is not None:  # nothing else can serve this sandbox: let it be seen as failed
                    self.on_exit()
                raise RuntimeError(f"the sandbox server did not start within {self.start_timeout:g} s "
                                   "(its output is in the sandbox's log)")
            self.socket = socket
            log.info("sandbox server ready on %s in %.0f ms", socket, (time.perf_counter() - started) * 1e3)
            threading.Thread(target=self._watch, args=(self._proc,), name="idegym-inner-watch", daemon=True).start()
            return socket

    def connect(self) -> Sandbox:
        return Sandbox.connect(unix_socket=self.ensure_started())

    def _watch(self, proc: subprocess.Popen) -> None:
        status = proc.wait()
        if not self._stopping:
            log.error("the sandbox server exited on its own (status %s): shutting down", status)
            if self.on_exit is not None:
                self.on_exit()

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop(self) -> None:
        """End the sandbox server (SIGTERM, then SIGKILL after 10 s) and remove its directory."""
        with self._lock:
            self._stopping = True
            self._kill()
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None


def terminate_self() -> None:
    """``on_exit`` for the server: a graceful shutdown of this process."""
    os.kill(os.getpid(), signal.SIGTERM)


__all__ = ["InnerSandbox", "terminate_self"]
