"""Warm-pool fills are background work: made at a low CPU priority, given the normal one when
claimed (control_plane/backends/local/priority.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.backends.base import ForkChild
from control_plane.backends.local import LocalBackend
from control_plane.backends.local.handle_data import LocalHandleData
from control_plane.backends.local.layout import read_meta
from control_plane.backends.local.priority import BACKGROUND_NICE

from .cp_helpers import ControlPlaneProcess
from .local_helpers import LoopThread, delete_sandboxes, loop_thread, ok, spec, start_backend, wait_for

# Every task's nice value, read by the sandbox's own tool (awk reads its own stat: field 19).
OWN_NICE = "awk '{print $19}' /proc/self/stat"


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def _sandbox_tasks(data: dict) -> list[int]:
    tids: list[int] = []
    for directory, _, _ in os.walk(data["cgroups"]["cpu"]):
        with open(os.path.join(directory, "tasks")) as fh:
            tids += [int(t) for t in fh.read().split()]
    return tids


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    yield from loop_thread()


@pytest.fixture
def backend(loop: LoopThread, tmp_path: Path) -> Iterator[LocalBackend]:
    b = start_backend(loop, tmp_path / "state")
    yield b
    delete_sandboxes(loop, b)
    loop.run(b.close())


def test_a_background_sandbox_runs_at_a_low_priority_until_it_is_claimed(loop: LoopThread,
                                                                         backend: LocalBackend) -> None:
    """Can fail: without ``background`` its server runs at nice 0; without the claim's restore the
    tools it starts inherit nice 19 (and so would a whole episode)."""
    if not backend.launcher or not (backend.sandboxes and backend.sandboxes.cgroups.available):
        pytest.skip("needs cgroups")
    filled = loop.run(backend.create(spec("bg-fill"), 60, background=True))
    tasks = _sandbox_tasks(filled.data)
    assert filled.data["server"][0] in tasks
    assert {_nice(t) for t in tasks} == {BACKGROUND_NICE}
    backend.claim(filled)
    assert {_nice(t) for t in _sandbox_tasks(filled.data)} == {0}
    assert ok(filled, OWN_NICE).strip() == "0"

    served = loop.run(backend.create(spec("fg-start"), 60))  # on the path of a start: normal throughout
    assert {_nice(t) for t in _sandbox_tasks(served.data)} == {0}
    assert ok(served, OWN_NICE).strip() == "0"
    # The zygote that forked both stays at the normal priority (every server inherits from it).
    zygotes = [z.pid for z in backend.launcher._zygote_of.values() if z.pid]
    assert zygotes and all(_nice(z) == 0 for z in zygotes)


def test_the_warm_pool_fills_in_the_background_and_a_claim_serves_at_normal_priority(tmp_path: Path) -> None:
    """Through a control plane: its pool's member runs at nice 19; the server that claims it runs
    its tools at 0. Can fail: a pool that does not fill in the background, or forgets the claim."""
    cp = ControlPlaneProcess(tmp_path / "state", ["--warm-pool", "1", "--ephemeral"])
    try:
        members = tmp_path / "state" / "sandboxes"

        def pool_member() -> LocalHandleData | None:
            """The member, once the pool holds it ready (its socket is there earlier: it answers a
            call before it is handed out, readiness.warm_up)."""
            ready = [line for line in cp.http.get("/metrics").text.splitlines()
                     if line.startswith("idegym_warm_pool_ready{")]
            if not ready or float(ready[0].rsplit(" ", 1)[1]) < 1:
                return None
            for sb in members.glob("pool-*") if members.is_dir() else []:
                data = read_meta(sb)
                if data and data.server and os.path.exists(data.socket):
                    return data
            return None

        client = cp.register()
        cp.start_server(client, reuse_strategy="NONE")  # the image is in use: the pool keeps one ready
        assert wait_for(lambda: pool_member() is not None, timeout=60), "the pool was never filled"
        member = pool_member()
        assert member is not None
        assert member.server is not None and _nice(member.server[0]) == BACKGROUND_NICE
        started = cp.start_server(client, reuse_strategy="NONE")
        assert cp.bash(client, started["server_id"], OWN_NICE)["stdout"].strip() == "0"
        assert _nice(member.server[0]) == 0  # the one member was claimed, and restored
    finally:
        cp.stop()


def test_a_pool_member_a_fork_takes_is_claimed_by_the_fork(loop: LoopThread, backend: LocalBackend) -> None:
    """The pool hands a fork its members unclaimed; the backend's fork claims each it makes a
    child (on its own threads, not the control plane's event loop), so the child serves at the
    normal priority. Can fail: on main the fork left that to the pool's ``take`` and a member
    handed to ``Backend.fork`` as it is stayed at nice 19, and so did every tool its child ran."""
    if not backend.launcher or not (backend.sandboxes and backend.sandboxes.cgroups.available):
        pytest.skip("needs cgroups")
    parent = loop.run(backend.create(spec("p-claim"), 60))
    member = loop.run(backend.create(spec("pool-claim"), 60, background=True))
    assert {_nice(t) for t in _sandbox_tasks(member.data)} == {BACKGROUND_NICE}
    (child,) = loop.run(backend.fork(parent, [ForkChild(spec("c-claim"), member)], 60))
    assert child.name == "pool-claim" and child.data.get("adopted")
    assert {_nice(t) for t in _sandbox_tasks(child.data)} == {0}
    assert ok(child, OWN_NICE).strip() == "0"
