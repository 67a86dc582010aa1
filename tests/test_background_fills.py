"""Warm-pool fills are background work: made at a low CPU priority (their group's least CPU
weight), given the normal one when claimed (control_plane/backends/local/priority.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.backends.base import ForkChild, SandboxHandle
from control_plane.backends.local import LocalBackend
from control_plane.backends.local.cgroups import BACKGROUND_SHARES, CPU_SHARES_PER_CORE
from control_plane.backends.local.handle_data import LocalHandleData
from control_plane.backends.local.layout import read_meta
from control_plane.backends.local.priority import BACKGROUND_NICE
from sandbox_server import procfs

from .cp_helpers import ControlPlaneProcess
from .local_helpers import LoopThread, delete_sandboxes, loop_thread, ok, spec, start_backend, wait_for

# Every task's nice value, read by the sandbox's own tool (awk reads its own stat: field 19).
OWN_NICE = "awk '{print $19}' /proc/self/stat"


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def _shares(data: dict) -> int:
    with open(os.path.join(data["cgroups"]["cpu"], "cpu.shares")) as fh:
        return int(fh.read())


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
    """Can fail: without ``background`` its group weighs as much as any sandbox's; without the
    claim's restore it keeps the least weight (and so would a whole episode); a fill that leaves
    its tasks at nice 19 has its tools inherit that nice after the claim (a claim that only writes
    the weight does not reset them)."""
    if not backend.launcher or not (backend.sandboxes and backend.sandboxes.cgroups.available):
        pytest.skip("needs cgroups")
    filled = loop.run(backend.create(spec("bg-fill"), 60, background=True))
    tasks = _sandbox_tasks(filled.data)
    assert filled.data["server"][0] in tasks
    assert _shares(filled.data) == BACKGROUND_SHARES
    assert {_nice(t) for t in tasks} == {0}  # the weight ranks it: a task's nice only does inside its group
    backend.claim(filled)
    assert _shares(filled.data) == CPU_SHARES_PER_CORE
    assert {_nice(t) for t in _sandbox_tasks(filled.data)} == {0}
    assert ok(filled, OWN_NICE).strip() == "0"

    served = loop.run(backend.create(spec("fg-start"), 60))  # on the path of a start: normal throughout
    assert _shares(served.data) == CPU_SHARES_PER_CORE
    assert {_nice(t) for t in _sandbox_tasks(served.data)} == {0}
    assert ok(served, OWN_NICE).strip() == "0"
    # The zygote that forked both stays at the normal priority (every server inherits from it).
    zygotes = [z.pid for z in backend.launcher._zygote_of.values() if z.pid]
    assert zygotes and all(_nice(z) == 0 for z in zygotes)


# A loop on CPU 0 (both sandboxes' loops share it) from ``at + 1.5`` to ``at + 2.1`` (host
# wall-clock time; it sleeps until then, so a late call is not held up by the other loop); prints
# the CPU seconds it got in ``at + 1.6 .. at + 2.0`` and whether it began before the loops did.
SPIN = ("taskset -c 0 python3 -c 'import time\nat = {at}\nbegan = time.time() < at + 1.5\n"
        "time.sleep(max(at + 1.5 - time.time(), 0))\nwhile time.time() < at + 1.6: pass\n"
        "t0 = time.process_time()\nwhile time.time() < at + 2.0: pass\nt1 = time.process_time()\n"
        "while time.time() < at + 2.1: pass\nprint(t1 - t0, began)'")


def _cpu_side_by_side(handles: list) -> list[float]:
    """The CPU seconds each of ``handles``' sandboxes got in the same half second, its loop on
    the same core as the others'."""
    at = time.time()
    with concurrent.futures.ThreadPoolExecutor(len(handles)) as threads:
        outs = list(threads.map(lambda h: ok(h, SPIN.format(at=at)).split(), handles))
    assert all(began == "True" for _, began in outs), f"a loop began after the window opened: {outs}"
    return [float(cpu) for cpu, _ in outs]


@pytest.mark.security
def test_an_unclaimed_background_sandbox_yields_the_cpu_to_a_serving_one(loop: LoopThread,
                                                                          backend: LocalBackend) -> None:
    """A warm-pool member busy on the CPU a serving sandbox needs gets a small share of it, not
    half. Can fail: on main its tasks ran at nice 19 in a group weighing as much as the serving
    sandbox's, and nice only ranks tasks inside their own group: the two loops got about the
    same CPU time."""
    if not backend.launcher or not (backend.sandboxes and backend.sandboxes.cgroups.available):
        pytest.skip("needs cgroups")
    member = loop.run(backend.create(spec("bg-spin"), 60, background=True))
    serving = loop.run(backend.create(spec("fg-spin"), 60))
    ok(serving, "true")  # its first call's costs paid
    background, foreground = _cpu_side_by_side([member, serving])
    assert background < foreground / 4, f"the member got {background:.3f} s of CPU, the serving one {foreground:.3f} s"
    backend.claim(member)  # the normal weight: now it gets its share
    background, foreground = _cpu_side_by_side([member, serving])
    assert background > foreground / 4, f"the claimed member got {background:.3f} s, the serving one {foreground:.3f} s"


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
        assert _shares(member.model_dump()) == BACKGROUND_SHARES
        started = cp.start_server(client, reuse_strategy="NONE")
        assert cp.bash(client, started["server_id"], OWN_NICE)["stdout"].strip() == "0"
        assert _shares(member.model_dump()) == CPU_SHARES_PER_CORE  # the one member was claimed, and restored
        served = {line.split('how="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                  for line in cp.http.get("/metrics").text.splitlines()
                  if line.startswith("idegym_warm_pool_starts_total{")}
        assert served == {"own": 1, "ready": 1}  # the first start made its own, the second took the member
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
    assert _shares(member.data) == BACKGROUND_SHARES
    (child,) = loop.run(backend.fork(parent, [ForkChild(spec("c-claim"), member)], 60))
    assert child.name == "pool-claim" and child.data.get("adopted")
    assert _shares(child.data) == CPU_SHARES_PER_CORE
    assert {_nice(t) for t in _sandbox_tasks(child.data)} == {0}
    assert ok(child, OWN_NICE).strip() == "0"


def test_a_background_sandbox_a_start_waits_for_is_made_at_the_normal_priority(loop: LoopThread,
                                                                               backend: LocalBackend) -> None:
    """A claim that finds the warm pool empty waits for the fill under way (pool.py); at the
    background priority under load it waited a whole slow start. Hurried, its group weighs as a
    serving sandbox's and the rest of it is made at nice 0, before any claim.

    Can fail: it did: without ``hurry`` the fill's group has the least weight when it is ready."""
    if not backend.launcher or not (backend.sandboxes and backend.sandboxes.cgroups.available):
        pytest.skip("needs cgroups")
    root = backend.sandboxes.root

    async def hurried() -> dict:
        made = asyncio.ensure_future(backend.create(spec("bg-hurried"), 60, background=True))
        deadline = time.monotonic() + 30
        while not (root / "bg-hurried").exists() and not made.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        assert not made.done(), "the launch ended before it could be hurried"
        backend.hurry("bg-hurried")
        return (await made).data

    data = loop.run(hurried())
    tasks = _sandbox_tasks(data)
    assert data["server"][0] in tasks
    assert _shares(data) == CPU_SHARES_PER_CORE
    assert {_nice(t) for t in tasks} == {0}


def _tools_run(data: dict) -> int:
    """Minor faults of the tools the sandbox's spawner has run and reaped (none ran: 0). The
    server starts its spawner in the background as it starts: waited for. The spawner says a
    tool ended before it reaps it (``waitid`` with ``WNOWAIT``), so the count may come a moment
    after the call's answer: a test waits for a count above 0."""
    assert wait_for(lambda: procfs.children(data["server"][0]), 10)
    spawner = procfs.children(data["server"][0])[0]
    return int(Path(f"/proc/{spawner}/stat").read_text().rsplit(")", 1)[1].split()[8])


def test_a_hurried_background_sandbox_is_handed_out_without_the_warm_up_call(loop: LoopThread,
                                                                            backend: LocalBackend) -> None:
    """A sandbox made ahead of demand answers one tool call before it is handed out (its pages
    then copied at the background weight); a hurried one does not: a start waits for it, and the
    call's round trip and tool cost that start more wall time (8.6 ms p50, 17.7 p90 under load)
    than the ~1.5 ms of CPU it saves the start's first call.

    Can fail: on main a hurried launch still made the warm-up call (its spawner had run a tool)."""
    if not backend.launcher:
        pytest.skip("needs the local backend")

    async def hurried_at_once() -> SandboxHandle:
        made = asyncio.ensure_future(backend.create(spec("bg-no-warm-up"), 60, background=True))
        await asyncio.sleep(0)  # the create has asked for its launch, which has not run yet
        backend.hurry("bg-no-warm-up")
        return await made

    warmed = loop.run(backend.create(spec("bg-warm-up"), 60, background=True))
    assert wait_for(lambda: _tools_run(warmed.data) > 0, 10)
    hurried = loop.run(hurried_at_once())
    assert _tools_run(hurried.data) == 0
    assert ok(hurried, "echo served") == "served\n"
    assert wait_for(lambda: _tools_run(hurried.data) > 0, 10)  # (what the count shows: a tool the spawner ran)


def test_a_hurry_as_soon_as_a_background_create_is_asked_is_not_lost(loop: LoopThread,
                                                                      backend: LocalBackend) -> None:
    """The warm pool hurries a fill as soon as the fill's create is asked (a claim that takes the
    last member hurries the oldest fill, which may have just taken its slot): before the launch
    had run a step, the hurry found nothing to lift and the fill was made in the background,
    with the least weight when a claim waited for it.

    Can fail: it did: the hurried sandbox's group had the background weight."""
    if not backend.launcher or not (backend.sandboxes and backend.sandboxes.cgroups.available):
        pytest.skip("needs cgroups")

    async def hurried_at_once() -> dict:
        made = asyncio.ensure_future(backend.create(spec("bg-at-once"), 60, background=True))
        await asyncio.sleep(0)  # the create has asked for its launch, which has not run yet
        assert not made.done()
        backend.hurry("bg-at-once")
        return (await made).data

    data = loop.run(hurried_at_once())
    assert _shares(data) == CPU_SHARES_PER_CORE
    assert {_nice(t) for t in _sandbox_tasks(data)} == {0}


def test_a_fill_s_host_side_steps_run_at_the_normal_priority_and_its_processes_at_the_background_one(
        loop: LoopThread, backend: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fill's host-side steps run on the control plane's threads, which take the GIL its event
    loop needs: at nice 19 on a loaded host one was preempted holding it, and the loop (every
    call and reset) waited. Its processes, bubblewrap and what it starts, still start at nice 19.

    Can fail: on main the steps ran on threads at nice 19."""
    launcher = backend.launcher
    if launcher is None or launcher.isolation != "bwrap":
        pytest.skip("needs bubblewrap")
    seen: dict[str, object] = {}
    record = launcher._record

    def recording(plan: object, data: LocalHandleData) -> None:  # a host-side step, after the spawn
        seen["thread"] = _nice(threading.get_native_id())
        seen["processes"] = {_nice(data.monitor[0]), _nice(data.init[0])}  # bwrap and the namespace's init
        record(plan, data)  # type: ignore[arg-type]

    monkeypatch.setattr(launcher, "_record", recording)
    loop.run(backend.create(spec("bg-nice"), 60, background=True))
    assert seen == {"thread": 0, "processes": {BACKGROUND_NICE}}
