"""Helpers for the local backend tests: a loop thread, a backend, specs, Unix-socket clients, leak checks."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

from control_plane.backends.base import Limits, SandboxHandle, SandboxSpec
from control_plane.backends.local import BUILTIN_IMAGE, LocalBackend
from control_plane.models import ServerKind
from tests.helpers import processes_mentioning, wait_until

T = TypeVar("T")


class LoopThread:
    """One event loop for a whole module, so a module-scoped backend keeps working across tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="local-backend-tests", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def loop_thread() -> Iterator[LoopThread]:
    """A ``LoopThread`` for a module's fixture (``yield from``), closed at its teardown."""
    lt = LoopThread()
    yield lt
    lt.close()


def start_backend(loop: LoopThread, state: Path, **options: Any) -> LocalBackend:
    """A started ``LocalBackend`` on ``state``, isolated with bubblewrap."""
    backend = LocalBackend(state, isolation="bwrap", **options)
    loop.run(backend.start())
    return backend


def stop_backend(loop: LoopThread, backend: LocalBackend) -> None:
    """Delete whatever sandboxes ``backend`` still has (a failed delete is left to close) and close it."""
    from control_plane.backends.base import BackendError

    for name in loop.run(backend.list_names()):
        try:
            loop.run(backend.delete_name(name))
        except BackendError:
            pass
    loop.run(backend.close())


def delete_sandboxes(loop: LoopThread, backend: LocalBackend) -> None:
    """Delete every sandbox of ``backend`` and check that none is left."""
    for name in loop.run(backend.list_names()):
        loop.run(backend.delete_name(name))
    assert loop.run(backend.list_names()) == set()


def write_calc_project(root: Path) -> Path:
    """A small project at ``root``: a module, a nested binary file, a README and an executable."""
    (root / "src" / "deep").mkdir(parents=True)
    (root / "src" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "src" / "deep" / "data.bin").write_bytes(bytes(range(256)) * 64)
    (root / "README.md").write_text("calc\n")
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(root / "run.sh", 0o755)
    return root


def spec(name: str, image: str = BUILTIN_IMAGE, *, root: bool = False, limits: Limits | None = None,
         snapshot: str | None = None) -> SandboxSpec:
    return SandboxSpec(server_id=1, generated_name=name, namespace="idegym", image_tag=image,
                       server_kind=ServerKind.IDEGYM, run_as_root=root, runtime_class_name=None,
                       container_port=8000, service_port=80, limits=limits or Limits(), snapshot_source=snapshot)


def client(handle: SandboxHandle, timeout: float = 120) -> httpx.Client:
    assert handle.endpoint.unix_socket
    return httpx.Client(transport=httpx.HTTPTransport(uds=handle.endpoint.unix_socket),
                        base_url="http://sandbox", timeout=timeout)


def bash(handle: SandboxHandle, command: str, **fields: Any) -> dict[str, Any]:
    with client(handle) as c:
        resp = c.post("/api/tools/bash", json={"command": command, **fields})
    assert resp.status_code == 200, resp.text
    return resp.json()


def ok(handle: SandboxHandle, command: str, **fields: Any) -> str:
    result = bash(handle, command, **fields)
    assert result["exit_code"] == 0, result
    return result["stdout"]


def ns_members(ns_link: str) -> list[int]:
    """Host pids of the processes in the pid namespace ``ns_link`` (e.g. ``pid:[4026532…]``)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.readlink(f"/proc/{entry.name}/ns/pid") == ns_link:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def leftovers(handle: SandboxHandle, pid_ns: str | None = None) -> list[str]:
    """Everything of a sandbox still on the host: processes, mounts, cgroups, directories."""
    data = handle.data
    found = []
    for key in ("monitor", "init", "server"):
        rec = data.get(key)
        if rec and _alive(rec[0], rec[1]):
            found.append(f"{key} process {rec[0]} alive")
    if pid_ns:
        members = ns_members(pid_ns)
        if members:
            detail = []
            for pid in members:
                try:
                    detail.append(Path(f"/proc/{pid}/stat").read_text()[:120])
                except OSError:
                    pass
            found.append(f"processes {members} still in the sandbox's pid namespace: {detail}")
    found += [f"process {pid} mentions the sandbox dir" for pid in processes_mentioning(data["dir"].encode() + b"/")]
    mountinfo = Path("/proc/self/mountinfo").read_text()
    mount_out = subprocess.run(["mount"], capture_output=True, text=True).stdout
    for where in (data["dir"], data["run_dir"]):
        if where in mountinfo:
            found.append(f"a mount under {where} in /proc/self/mountinfo")
        if where in mount_out:
            found.append(f"a mount under {where} in `mount`")
        if os.path.exists(where):
            found.append(f"{where} exists")
    for path in (data.get("cgroups") or {}).values():
        if os.path.exists(path):
            found.append(f"cgroup {path} exists")
    return found


def _alive(pid: int, started: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] not in (b"Z", b"X") and int(fields[19]) == started


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.02) -> bool:
    """``wait_until`` with these tests' shorter default timeout."""
    return bool(wait_until(predicate, timeout, interval))


def tree_digest(root: Path) -> dict[str, tuple]:
    """Every entry of a tree with its type, mode, owner and content (for byte-identity checks)."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, root)
            if os.path.islink(full):
                out[rel] = ("l", os.readlink(full))
            elif os.path.isdir(full):
                out[rel] = ("d", st.st_mode, st.st_uid)
            else:
                out[rel] = ("f", st.st_mode, st.st_uid, Path(full).read_bytes())
    return out
