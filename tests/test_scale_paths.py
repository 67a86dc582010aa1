"""Paths of the local backend whose cost must not grow with the number of live sandboxes, or that
every live sandbox pays all the time, counted in system calls (strace): a launch's unmounts
(``layer_mounts.py``), a look at one sandbox, a lease monitor's look at its lease (``lease.py``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.backends.local import LocalBackend, mounts
from sandbox_server.polling import wait_until
from tests.local_helpers import LoopThread, loop_thread, spec, start_backend, stop_backend

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (bubblewrap sandboxes, mounts)")
needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="counts system calls with strace")

LIVE = 300  # stand-ins for live sandboxes' layers


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    yield from loop_thread()


@pytest.fixture
def backend(loop: LoopThread, tmp_path: Path) -> Iterator[LocalBackend]:
    b = start_backend(loop, tmp_path / "state", delete_timeout=12)
    yield b
    if b.launcher is not None:  # a test may close it itself
        stop_backend(loop, b)


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as fh:
        return [line.split(" ", 5)[4] for line in fh]  # (no escaped characters in these tests' paths)


def _traced(pid: int) -> bool:
    """Whether every thread of ``pid`` is being traced."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue
        if "TracerPid:\t0\n" in status:
            return False
    return True


@contextlib.contextmanager
def _syscalls(name: str, out: Path, pid: int | None = None) -> Iterator[list[str]]:
    """The calls of ``name`` process ``pid`` (this one; every thread, and their children) makes
    in the block, strace's lines."""
    calls: list[str] = []
    pid = pid or os.getpid()
    strace = subprocess.Popen(["strace", "-f", "-qq", "-e", f"trace={name}", "-o", str(out), "-p", str(pid)],
                              stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: _traced(pid), 10), "strace did not attach"
        yield calls
    finally:
        strace.send_signal(signal.SIGINT)
        strace.wait(10)
    calls += [line for line in out.read_text().splitlines() if f"{name}(" in line]


@needs_strace
def test_a_launch_drops_other_layers_with_a_constant_number_of_unmounts(loop: LoopThread, backend: LocalBackend,
                                                                        tmp_path: Path) -> None:
    """With 300 sandboxes' layers mounted in the space (stand-ins: a small tmpfs each, where a
    sandbox's bounded layer is), starting one more unmounts a few mounts (counted by strace),
    not 300; its bubblewrap monitor keeps the new sandbox's own layer and none of the others'.
    Once every sandbox is deleted, the space holds no mount at all.

    Can fail: on main every launch unmounted each other sandbox's layers one by one in its copy
    of the host's mounts (at 1,000 live that was 0.6 s of every start: starts slowed with every
    sandbox live, the whole ramp quadratically). Unmounts of other state directories' sandboxes,
    a neighbour test's, are not counted."""
    first = loop.run(backend.create(spec("layers-first"), 60))  # the space as the first sandbox leaves it
    space = backend.sandboxes.root
    stand_ins = [space / f"stand-in-{i}" / "layers" for i in range(LIVE)]
    try:
        for point in stand_ins:
            point.mkdir(parents=True)
            mounts.mount("stand-in", point, "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV, "size=64k")
        with _syscalls("umount2", tmp_path / "umounts.trace") as calls:
            second = loop.run(backend.create(spec("layers-second"), 60))
        unmounts = [line for line in calls if f'umount2("{space}' in line]
        assert len(unmounts) <= 2, f"{len(unmounts)} unmounts for one launch: {unmounts[:5]}…"
        monitor = second.data["monitor"][0]
        held = Path(f"/proc/{monitor}/mountinfo").read_text()
        assert "stand-in-" not in held
        assert f"{second.data['dir']}/layers " in held
        assert f"{first.data['dir']}/layers " not in held
    finally:
        for point in stand_ins:
            mounts.umount(point, detach=True)
            shutil.rmtree(point.parent, ignore_errors=True)
    for name in loop.run(backend.list_names()):
        loop.run(backend.delete_name(name))
    loop.run(backend.close())
    assert [p for p in _mount_points() if p == str(space) or p.startswith(f"{space}/")] == []


@needs_strace
def test_a_look_at_one_sandbox_waits_on_its_own_processes_only(loop: LoopThread, backend: LocalBackend,
                                                              tmp_path: Path) -> None:
    """With 12 sandboxes live, observing one (what the watcher does to every live sandbox on each
    pass) collects the exited processes of that sandbox only: a few ``wait4`` calls, not two per
    live sandbox; the watcher's pass still collects every one once (``list_names``).

    Can fail: on main each look polled every process the launcher had started (each sandbox's
    bubblewrap and lease monitor), so a watcher pass cost O(N²): at 1,000 live, 2 million
    ``waitpid`` calls every 5 s."""
    handles = [loop.run(backend.create(spec(f"look-{i}"), 60)) for i in range(12)]
    with _syscalls("wait4", tmp_path / "waits.trace") as calls:
        seen = loop.run(backend.observe(handles[0]))
    assert seen.running
    assert len(calls) <= 3, f"{len(calls)} waits for one look: {calls[:5]}…"
    with _syscalls("wait4", tmp_path / "sweep.trace") as sweep:
        loop.run(backend.list_names())
    assert len(sweep) >= 2 * len(handles)  # the pass's own collection: each bwrap and lease monitor


@needs_strace
def test_a_lease_monitor_runs_one_process_per_look(loop: LoopThread, tmp_path: Path) -> None:
    """A sandbox's lease monitor (``lease.py``) starts one process per look at its lease (the
    ``sleep`` between looks), so 1,000 idle sandboxes cost the host little CPU.

    Can fail: on main each look started five (sleep, readlink, date, stat, cat): 1,000 idle
    sandboxes used 36 % of a core in the 1,000-live benchmark."""
    backend = start_backend(loop, tmp_path / "state", orphan_ttl=2)  # a look every 0.5 s
    try:
        handle = loop.run(backend.create(spec("lease-looks"), 60))
        monitor = handle.data["lease_monitor"][0]
        with _syscalls("execve", tmp_path / "looks.trace", monitor) as calls:
            assert wait_until(lambda: sum("sleep" in c for c in calls_so_far(tmp_path / "looks.trace")) >= 4, 10)
        sleeps = [c for c in calls if '"sleep"' in c or "/sleep" in c]
        assert len(sleeps) >= 4
        assert len(calls) - len(sleeps) <= 1, f"{len(calls)} programs for {len(sleeps)} looks: {calls[:8]}"
        assert loop.run(backend.observe(handle)).running  # the lease, renewed, holds
    finally:
        for name in loop.run(backend.list_names()):
            loop.run(backend.delete_name(name))
        loop.run(backend.close())


@needs_strace
def test_a_start_reads_the_state_index_entries_of_the_groups_it_judges_only(loop: LoopThread,
                                                                           tmp_path: Path) -> None:
    """A start removes the empty cgroups of state directories that are gone, judged by the host's
    index of state directories (``layout.states_in_use``), which grows by every backend started
    until reboot: it reads the entries of the keys that have groups, none of the others.

    Can fail: on main every start read the whole index (1,508 files, 50 ms of CPU on this host)."""
    from control_plane.backends.local.cgroups import controller_mounts
    from control_plane.backends.local.layout import INDEX

    if not controller_mounts():
        pytest.skip("no cgroup v1 controller")
    INDEX.mkdir(mode=0o700, exist_ok=True)
    stand_ins = [INDEX / f"scale-test-{os.getpid()}-{n}" for n in range(LIVE)]  # gone, their registrar too
    for n, entry in enumerate(stand_ins):
        entry.write_text(f"{tmp_path / f'gone-{n}'}\n1 1 pid:[0]\n")
    backend = None
    try:
        with _syscalls("openat", tmp_path / "opens.trace") as calls:
            backend = start_backend(loop, tmp_path / "state")
        read = [call for call in calls if any(f'"{entry}"' in call for entry in stand_ins)]
        assert not read, f"{len(read)} of {LIVE} entries of other state directories read: {read[:3]}"
    finally:
        if backend is not None:
            stop_backend(loop, backend)
        for entry in stand_ins:
            entry.unlink(missing_ok=True)


def calls_so_far(trace: Path) -> list[str]:
    try:
        return trace.read_text().splitlines()
    except FileNotFoundError:
        return []


def test_layers_mounted_before_the_space_had_its_bind_stay_reachable(loop: LoopThread, backend: LocalBackend) -> None:
    """A sandbox's layer mounted the earlier way, straight below the space's directory (a sandbox
    of a control plane of an earlier version, adopted), is not hidden by the space's bind: the
    next launch leaves it where it is, and unmounting it by its path still finds it."""
    space = backend.sandboxes.root
    old = space / "earlier-version" / "layers"
    old.mkdir(parents=True)
    mounts.mount("earlier", old, "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV, "size=64k")
    try:
        (old / "mark").write_text("here")
        loop.run(backend.create(spec("after-upgrade"), 60))
        assert (old / "mark").read_text() == "here"
    finally:
        assert mounts.umount(old, detach=True)
        shutil.rmtree(old.parent, ignore_errors=True)


_PRIVATE_TMP_LAUNCH = """
import asyncio, sys
from control_plane.backends.local import LocalBackend
from tests.local_helpers import ok, spec

async def main():
    backend = LocalBackend(sys.argv[1], isolation="bwrap", orphan_ttl=None)
    await backend.start()
    try:
        handle = await backend.create(spec("private-tmp"), 120)
        print(await asyncio.to_thread(ok, handle, "echo started"), end="")
        await backend.delete(handle)
    finally:
        await backend.close()

asyncio.run(main())
"""


def test_a_control_plane_with_a_private_tmp_launches_beside_one_under_the_hosts_tmp(
        loop: LoopThread, backend: LocalBackend) -> None:
    """A control plane whose ``/tmp`` is its own (a container, another machine's view) lists the
    spaces of control planes under the host's ``/tmp`` in its mount table without reaching them:
    its launches drop their layers without failing.

    Can fail: a launch cloned every listed space by its path and failed with
    'FileNotFoundError: open_tree(/tmp/.../sandboxes)' beside a live sandbox under the host's /tmp."""
    live = loop.run(backend.create(spec("host-tmp-live"), 120))
    other = Path(tempfile.mkdtemp(prefix="idegym-private-tmp-", dir="/var/tmp"))
    try:
        assert str(backend.state_dir).startswith("/tmp/")  # the live space is out of the other's reach
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               'mount -t tmpfs idegym-test /tmp && exec "$@"', "sh",
                               sys.executable, "-c", _PRIVATE_TMP_LAUNCH, str(other / "state")],
                              capture_output=True, text=True, timeout=180, cwd=Path(__file__).resolve().parent.parent)
        assert proc.returncode == 0 and proc.stdout == "started\n", proc.stderr[-3000:]
    finally:
        shutil.rmtree(other, ignore_errors=True)
        loop.run(backend.delete(live))


def test_the_last_delete_releases_the_space_when_a_holder_leaves_a_moment_later(loop: LoopThread,
                                                                               backend: LocalBackend) -> None:
    """The delete of the last sandbox removes the space's bind even if something still holds it
    for a moment (the sandbox's lease monitor, killed just before, on a loaded host), without the
    backend's close.

    Can fail: the delete tried the unmount once and gave up on EBUSY; a delete that finished after
    the backend's close had released the space (a teardown left in the background) left the bind
    mounted for good (CI: ``test_nothing_is_left_when_everything_stops``)."""
    handle = loop.run(backend.create(spec("last-one"), 60))
    space = str(backend.sandboxes.root)
    assert space in _mount_points()
    holder = subprocess.Popen(["sleep", "0.7"], cwd=space)  # pins the bind, as a dying monitor's cwd does
    try:
        loop.run(backend.delete(handle))
        assert wait_until(lambda: holder.poll() is not None, 5)
        assert space not in _mount_points()
    finally:
        holder.kill()
        holder.wait()
