"""Processes the benchmarks measure: sandbox servers, control planes, SWE-ReX's server."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
CLIENT_PYTHON = REPO / ".venv-client" / "bin" / "python"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(read_fd: int, proc: subprocess.Popen, what: str, timeout: float = 120) -> str:
    ready, _, _ = select.select([read_fd], [], [], timeout)
    line = os.read(read_fd, 64).decode() if ready else ""
    os.close(read_fd)
    if not line.startswith("ready"):
        proc.kill()
        raise RuntimeError(f"{what} did not start")
    return line


@contextlib.contextmanager
def sandbox_server(project: Path, state: Path, *, unix_socket: Path | None = None) -> Iterator[str]:
    """A bare sandbox server on a Unix socket; yields the socket path."""
    sock = unix_socket or state / "sandbox.sock"
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandbox_server", "serve", "--project", str(project), "--state-dir", str(state),
         "--unix-socket", str(sock), "--ready-fd", str(write_fd)],
        pass_fds=(write_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    os.close(write_fd)
    try:
        _wait_ready(read_fd, proc, "sandbox server")
        yield str(sock)
    finally:
        _stop(proc)


@contextlib.contextmanager
def control_plane(state: Path, extra: Sequence[str] = ()) -> Iterator[str]:
    """A control plane on a free port (local backend); yields its URL, with its token as credentials."""
    read_fd, write_fd = os.pipe()
    log = open(state.parent / f"{state.name}.log", "ab")
    roots = [f"--build-root={Path(__file__).resolve().parent.parent}", f"--build-root={tempfile.gettempdir()}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "control_plane", "--state-dir", str(state), "--port", "0", "--ephemeral",
         "--ready-fd", str(write_fd), *roots, *extra],
        pass_fds=(write_fd,), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    os.close(write_fd)
    try:
        port = int(_wait_ready(read_fd, proc, "control plane").split()[1])
        token = state / "token"  # absent with --auth none or USER:PASSWORD
        yield f"http://idegym:{token.read_text().strip()}@127.0.0.1:{port}" if token.exists() else \
            f"http://127.0.0.1:{port}"
    finally:
        _stop(proc, timeout=120)
        log.close()


# Run a command with a mount namespace of its own: a private /tmp, and every directory named in
# $IDEGYM_HIDE (':'-separated) covered by an empty read-only tmpfs.
_PRIVATE_VIEW = """set -e
mount -t tmpfs -o mode=1777 tmpfs /tmp
old_ifs=$IFS; IFS=:
for d in $IDEGYM_HIDE; do [ -d "$d" ] && mount -t tmpfs -o ro,size=4k,mode=0755 tmpfs "$d"; done
IFS=$old_ifs
unset IDEGYM_HIDE
exec "$@"
"""


def task_data_dirs() -> list[Path]:
    """What a control plane on another machine would not see: this checkout's client package
    (the shipped tasks and their data with it) and the cache of fetched task sources."""
    cache = Path(os.environ.get("IDEGYM_TASK_CACHE") or Path.home() / ".cache" / "idegym" / "tasks")
    return [REPO / "idegym_env", cache]


def private_view(argv: Sequence[str], hide: Sequence[Path]) -> tuple[list[str], dict[str, str]]:
    """``argv`` run in a mount namespace of its own (``unshare -m``): a private ``/tmp`` and
    ``hide`` covered, as another machine would see this one; and the environment it needs."""
    env = {**os.environ, "IDEGYM_HIDE": ":".join(str(p) for p in hide)}
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _PRIVATE_VIEW, "sh", *argv], env


@contextlib.contextmanager
def remote_control_plane(state: Path, extra: Sequence[str] = ()) -> Iterator[str]:
    """A control plane as on another machine (``private_view``: its own ``/tmp``, no task data
    of this checkout), no build roots, reached over TCP; yields its URL with credentials."""
    password = os.urandom(16).hex()
    read_fd, write_fd = os.pipe()
    log = open(state.parent / f"{state.name}.log", "ab")
    argv, env = private_view([sys.executable, "-m", "control_plane", "--state-dir", str(state), "--port", "0",
                              "--ephemeral", "--remove-state", "--auth", f"idegym:{password}",
                              "--ready-fd", str(write_fd), *extra], task_data_dirs())
    proc = subprocess.Popen(argv, pass_fds=(write_fd,), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)
    os.close(write_fd)
    try:
        port = int(_wait_ready(read_fd, proc, "namespaced control plane").split()[1])
        yield f"http://idegym:{password}@127.0.0.1:{port}"
    finally:
        _stop(proc, timeout=120)
        log.close()


@contextlib.contextmanager
def swerex_server() -> Iterator[tuple[int, str]]:
    """SWE-ReX's own server (``python -m swerex.server``); yields (port, auth token)."""
    port, token = free_port(), "bench-token"
    proc = subprocess.Popen([sys.executable, "-m", "swerex.server", "--port", str(port), "--auth-token", token],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/is_alive", headers={"X-API-Key": token}).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise RuntimeError("the SWE-ReX server did not start")
        yield port, token
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def make_project(root: Path, files: int = 5000) -> Path:
    """A project of ``files`` small source files in nested directories (like a mid-size repo)."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        d = root / f"pkg{i % 50:02d}" / f"mod{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"file{i}.py").write_text(f"# file {i}\n" + f"def f():\n    return {i}\n" * 4)
    return root
