"""Sandbox servers forked from the template process (``sandbox_server/zygote.py``): they share
its memory, and are otherwise exactly what bubblewrap would have started — the same namespaces,
capabilities, cgroups and environment, none of the zygote's descriptors — and the zygote is
replaced when it dies and ends with its control plane."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.backends.base import SandboxHandle
from control_plane.backends.local import LocalBackend
from control_plane.backends.local.layout import state_key
from control_plane.backends.local.zygote import NAMESPACES
from tests.helpers import wait_until
from tests.local_helpers import LoopThread, delete_sandboxes, loop_thread, ok, spec, start_backend

pytestmark = [pytest.mark.security, pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                                      reason="needs root and bubblewrap")]
REPO = Path(__file__).resolve().parent.parent
MARKER = "IDEGYM_TEST_CONTROL_PLANE_SECRET"
STATUS_FIELDS = ("Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    yield from loop_thread()


@pytest.fixture(scope="module")
def backend(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    os.environ[MARKER] = "must-not-reach-a-sandbox"
    try:
        b = start_backend(loop, tmp_path_factory.mktemp("zygote"))
        yield b
        delete_sandboxes(loop, b)
        loop.run(b.close())
    finally:
        os.environ.pop(MARKER, None)


def _status(pid: int) -> dict[str, str]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {k: fields[k].strip() for k in STATUS_FIELDS}


def _rollup(pid: int) -> dict[str, int]:
    lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
    return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in lines)}


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _zygote_pid(backend: LocalBackend) -> int:
    zygotes = [z.pid for z in backend.launcher._zygote_of.values() if z.pid is not None]
    assert len(zygotes) == 1, zygotes
    return zygotes[0]


def _server(h: SandboxHandle) -> int:
    return h.data["server"][0]


def test_a_forked_server_is_what_bubblewrap_would_have_started(loop: LoopThread, backend: LocalBackend,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Same namespaces as its init, same capabilities, credentials and cgroups as a server
    bubblewrap starts afresh; it shares the zygote's pages, and holds none of its descriptors.

    Can fail: before the capabilities were limited after joining the user namespace, the
    forked server held CAP_SYS_RESOURCE, which bubblewrap gives no sandbox here."""
    forked = loop.run(backend.create(spec("zy-forked"), 60))
    monkeypatch.setattr(backend.launcher, "zygotes", False)
    fresh = loop.run(backend.create(spec("zy-fresh"), 60))
    try:
        assert not fresh.data.get("forked") and forked.data.get("forked")
        server, init = _server(forked), forked.data["init"][0]
        zygote = _zygote_pid(backend)
        assert _ppid(server) == zygote  # the zygote is the subreaper of the servers it made
        # It forked the server into the sandbox's pid namespace and is back in its own for the next.
        assert os.readlink(f"/proc/{zygote}/ns/pid_for_children") == os.readlink(f"/proc/{zygote}/ns/pid")
        for name in NAMESPACES:
            assert os.readlink(f"/proc/{server}/ns/{name}") == os.readlink(f"/proc/{init}/ns/{name}"), name
        assert os.readlink(f"/proc/{server}/ns/user") != os.readlink(f"/proc/{zygote}/ns/mnt")
        assert _status(server) == _status(_server(fresh))
        # It moved itself by its one thread (``tasks``), its init was born there; every thread the
        # server has made since is in the sandbox's groups (tools run on threads in ``tools``).
        for controller, path in forked.data["cgroups"].items():
            procs = Path(path, "server", "cgroup.procs").read_text().split()
            assert str(server) in procs and str(init) in procs, controller
        for thread in os.listdir(f"/proc/{server}/task"):
            groups = Path(f"/proc/{server}/task/{thread}/cgroup").read_text().splitlines()
            for controller in forked.data["cgroups"]:
                line = next(g for g in groups if controller in g.split(":")[1].split(","))
                assert f"/{forked.name}/" in line + "/", (thread, line)
        # The zygote's (and the control plane's) environment reaches no server.
        for pid in (server, zygote):
            assert MARKER.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
        # Memory: most of its resident pages are the zygote's (a fresh interpreter shares none).
        mem = _rollup(server)
        assert mem["Rss"] - mem["Private_Clean"] - mem["Private_Dirty"] > 8 << 10, mem
        # Descriptors: none of the namespaces, cgroup files or the zygote's socket it was given.
        zygote_fds = {os.readlink(f"/proc/{zygote}/fd/{fd}") for fd in os.listdir(f"/proc/{zygote}/fd")}
        for fd in os.listdir(f"/proc/{server}/fd"):
            target = os.readlink(f"/proc/{server}/fd/{fd}")
            assert not any(target.startswith(f"{name}:[") for name in NAMESPACES), (fd, target)
            assert not target.endswith(("/cgroup.procs", "/tasks")), (fd, target)
            assert not (target.startswith("socket:") and target in zygote_fds), (fd, target)
        assert ok(forked, "echo $((6 * 7))").strip() == "42"
    finally:
        loop.run(backend.delete(forked))
        loop.run(backend.delete(fresh))


def test_a_dead_zygote_is_replaced_and_its_servers_live_on(loop: LoopThread, backend: LocalBackend) -> None:
    """SIGKILL the zygote: its sandboxes keep answering, the next start forks from a new one;
    a server that dies ends its sandbox (its init, the placeholder, sees it go)."""
    first = loop.run(backend.create(spec("zy-first"), 60))
    try:
        old = _zygote_pid(backend)
        os.kill(old, signal.SIGKILL)
        assert wait_until(lambda: not Path(f"/proc/{old}").exists() or _state(old) == "Z", 10)
        assert ok(first, "echo still").strip() == "still"
        second = loop.run(backend.create(spec("zy-second"), 60))
        try:
            assert _zygote_pid(backend) != old and _ppid(_server(second)) == _zygote_pid(backend)
            assert ok(second, "echo new").strip() == "new"
        finally:
            loop.run(backend.delete(second))
        init = first.data["init"][0]
        os.kill(_server(first), signal.SIGKILL)
        assert wait_until(lambda: not Path(f"/proc/{init}").exists() or _state(init) == "Z", 10), \
            "the sandbox's init outlived its server"
    finally:
        loop.run(backend.delete(first))


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


KILLED = """
import asyncio, os, signal, sys
from control_plane.backends.local import LocalBackend
from tests.local_helpers import spec

async def main():
    backend = LocalBackend(sys.argv[1], isolation="bwrap", orphan_ttl=2)
    await backend.start()
    h = await backend.create(spec("zy-orphan"), 60)
    zygote = next(z.pid for z in backend.launcher._zygote_of.values())
    print(zygote, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


def test_the_zygote_ends_with_its_control_plane(tmp_path: Path) -> None:
    """A SIGKILLed control plane leaves no zygote (bubblewrap's --die-with-parent) and, once
    its lease runs out, nothing of the sandbox whose server the zygote forked."""
    died = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path / "state")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert died.returncode == -signal.SIGKILL, died.stderr[-3000:]
    zygote = int(died.stdout.split()[0])
    assert wait_until(lambda: _state(zygote) in ("gone", "Z"), 10), f"zygote {zygote} outlived its control plane"
    state, key = tmp_path / "state", state_key(tmp_path / "state")

    def left() -> list[str]:
        mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(state) in line]
        return mounts + [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/idegym/{key}/*") if p.is_dir()]

    assert wait_until(lambda: not left(), 30), left()
