"""A launch drops the other sandboxes' layers from its copy of the host's mounts with a constant
number of unmounts, however many sandboxes are live (``control_plane/backends/local/layer_mounts.py``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.backends.base import BackendError
from control_plane.backends.local import LocalBackend, mounts
from sandbox_server.polling import wait_until
from tests.local_helpers import LoopThread, loop_thread, spec, start_backend

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="needs root (bubblewrap sandboxes, mounts)"),
              pytest.mark.skipif(shutil.which("strace") is None, reason="counts unmounts with strace")]

LIVE = 300  # stand-ins for live sandboxes' layers


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    yield from loop_thread()


@pytest.fixture
def backend(loop: LoopThread, tmp_path: Path) -> Iterator[LocalBackend]:
    b = start_backend(loop, tmp_path / "state", delete_timeout=12)
    yield b
    if b.launcher is not None:  # the test closes it itself unless it failed first
        for name in loop.run(b.list_names()):
            try:
                loop.run(b.delete_name(name))
            except BackendError:
                pass
        loop.run(b.close())


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as fh:
        return [line.split(" ", 5)[4] for line in fh]  # (no escaped characters in this test's paths)


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


def test_a_launch_drops_other_layers_with_a_constant_number_of_unmounts(loop: LoopThread, backend: LocalBackend,
                                                                        tmp_path: Path) -> None:
    """With 300 sandboxes' layers mounted in the space (stand-ins: a small tmpfs each, where a
    sandbox's bounded layer is), starting one more unmounts a few mounts (counted by strace),
    not 300; its bubblewrap monitor keeps the new sandbox's own layer and none of the others'.
    Once every sandbox is deleted, the space holds no mount at all.

    Can fail: on main every launch unmounted each other sandbox's layers one by one in its copy
    of the host's mounts (at 1,000 live that was 0.6 s of every start: starts slowed with every
    sandbox live, the whole ramp quadratically).
    Unmounts of other state directories' sandboxes, a neighbour test's, are not counted."""
    first = loop.run(backend.create(spec("layers-first"), 60))  # the space as the first sandbox leaves it
    space = backend.sandboxes.root
    stand_ins = [space / f"stand-in-{i}" / "layers" for i in range(LIVE)]
    trace = tmp_path / "umounts.trace"
    try:
        for point in stand_ins:
            point.mkdir(parents=True)
            mounts.mount("stand-in", point, "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV, "size=64k")
        strace = subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=umount2", "-o", str(trace),
                                  "-p", str(os.getpid())], stderr=subprocess.DEVNULL)
        try:
            assert wait_until(lambda: _traced(os.getpid()), 10), "strace did not attach"
            second = loop.run(backend.create(spec("layers-second"), 60))
        finally:
            strace.send_signal(signal.SIGINT)
            strace.wait(10)
        # (other control planes' sandboxes on this host, if any, are not this test's to count)
        unmounts = [line for line in trace.read_text().splitlines() if f'umount2("{space}' in line]
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
