"""Test helpers: real server processes on real sockets, and leak checks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.forked import ForkedProcess, Template, forkable, popen

REPO = Path(__file__).resolve().parent.parent
SEEDS = REPO / "specs"  # the published API specs, vendored
SERVER_MODULES = ("sandbox_server.cli", "sandbox_server.app", "sandbox_server.web")  # a sandbox server's imports


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SandboxProcess:
    """``python -m sandbox_server serve`` in its own process group, ready when it says so: forked
    from the tests' template unless given an environment of its own beyond IdeGym's variables."""

    def __init__(self, project: Path, transport: str, tmp: Path, extra: Sequence[str] = (),
                 env: dict[str, str] | None = None) -> None:
        self.project = project
        self.transport = transport
        self.socket_path = tmp / "sandbox.sock"
        self.port = free_port()
        self.log_path = tmp / "server.log"
        where = ["--unix-socket", str(self.socket_path)] if transport == "unix" else ["--port", str(self.port)]
        args = ["serve", "--project", str(project), "--state-dir", str(tmp / "state"), *where, *extra]
        self._log = open(self.log_path, "wb")
        self.proc: subprocess.Popen | ForkedProcess
        if forkable(env):  # the template's child (tests/forked.py): its imports
            self.proc = ForkedProcess("sandbox_server.cli", args, self.log_path, SERVER_MODULES, Template.BARE, env)
            line = self.proc.ready_line(30)
        else:
            self.proc, line = popen([sys.executable, "-m", "sandbox_server", *args], self._log, env, 30)
        if line != "ready\n":
            self.stop()
            raise RuntimeError(f"sandbox server did not start: {self.log_path.read_text()}")
        if transport == "unix":
            self.client = httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket_path)),
                                       base_url="http://sandbox", timeout=120)
        else:
            self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=120)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def post(self, path: str, body: dict | None = None, **kw) -> httpx.Response:
        return self.client.post(path, json=body if body is not None else {}, **kw)

    def bash(self, command: str, **fields) -> dict:
        resp = self.post("/api/tools/bash", {"command": command, **fields})
        assert resp.status_code == 200, resp.text
        return resp.json()

    def stop(self) -> None:
        if getattr(self, "client", None) is not None:
            self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._log.close()


def processes_mentioning(marker: bytes) -> dict[int, bytes]:
    """Live processes whose command line contains ``marker``, with that command line."""
    from sandbox_server.procfs import pids_with_cmdline

    found = {}
    for pid in pids_with_cmdline(marker.decode()):
        try:
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # ended meanwhile
            continue
    return found


def process_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):  # gone, or being reaped while read (ESRCH)
        return False
    return state not in ("Z", "X")


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until true or ``timeout``; a bounded wait on an observable condition."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def rss_peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


# -- env and vector-env tests ------------------------------------------------------------------------


def embedded_control_plane(warm_pool: int) -> Iterator[Any]:
    """An ``EmbeddedControlPlane`` for a fixture (``yield from``), closed at its teardown."""
    from idegym_env.embedded import EmbeddedControlPlane

    with EmbeddedControlPlane(warm_pool=warm_pool) as cp:
        yield cp


def local_ray_session() -> Iterator[None]:
    """A local Ray for a module's fixture (``yield from``); the module calls ``use_loopback()``
    before it imports ray."""
    import ray

    from idegym_env.vector.local_ray import init_local

    init_local(num_cpus=2, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def bash_action(command: str) -> dict:
    """An IdeGym env's bash tool call."""
    return {"tool": "bash", "arguments": {"command": command}}


def object_actions(*calls: dict) -> Any:
    """One action per sub-env, as the object array a vector env takes."""
    import numpy as np

    out = np.empty(len(calls), dtype=object)
    for i, call in enumerate(calls):
        out[i] = call
    return out
