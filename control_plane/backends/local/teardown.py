"""Ending a local sandbox: kill its processes, unmount, remove its files and cgroups.

Every step works from what is left, so a half-created sandbox, one whose control plane died,
or one deleted twice ends the same way.

A kill waits for the processes it signalled through their pidfds (``procfs.wait_gone``: it wakes
as each exits) and then reads the sandbox's groups once more (``Cgroups.kill_all``), as it waits
for bubblewrap's monitor. It used to read every group of every controller (16 ``cgroup.procs``,
0.4 ms of CPU a read) every 1-10 ms until they were empty, and ``/proc`` for the monitor every
0.5-20 ms. ``benchmarks/stop.py`` alternated with that (12 sandboxes each leaving a ``sleep`` and
a 64 MiB ``python3``, 3 rounds a run, 2 cores): at load 3-4, 4 runs each, the control plane's
CPU per stop one at a time 10.8 10.0 10.0 9.7 -> 8.1 6.7 6.7 6.9 ms, 12 at once 13.6 15.8 13.9
12.5 -> 8.3 8.1 8.9 7.2 ms; a stop's p50 32 28 26 32 -> 22 23 20 21 ms, 12 at once until the last
ended 331 264 245 269 -> 199 166 185 192 ms. At load 20 falling to 7 (3 runs each), a stop's p95
157 121 83 -> 90 41 32 ms.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

from sandbox_server import procfs
from sandbox_server.trees import freeze_trees

from ..base import BackendError
from . import layer_mounts, mounts
from .cgroups import Cgroups
from .fork_layers import ForkLayers, sandbox_holder
from .handle_data import LocalHandleData
from .layout import NAME_RE, Space, read_meta

Progress = Callable[[str], None] | None  # told each step, for a timeout's message


# For the sandbox's processes to end once killed, where the caller sets no longer wait (the
# launcher's teardowns wait until just before their bound: a process in the kernel under heavy disk
# load, state D, took more than 5 s to end at load 100).
KILL_TIMEOUT = 5.0
MONITOR_TIMEOUT = 2.0  # for bwrap's monitor to exit once the namespace's init has
RELEASE_WAIT = 2.0  # for what holds an emptied space's bind (a killed lease monitor) to let go


def kill(name: str, space: Space, data: LocalHandleData | None, isolation: str, progress: Progress = None,
         timeout: float = KILL_TIMEOUT) -> tuple[Path, Path, dict[str, str], list[str]]:
    """End every process of a sandbox, waiting ``timeout`` seconds at most for them to be gone;
    files and groups stay. Returns its directory, run directory, existing cgroups and what went wrong.

    The processes are found from the sandbox's own records only: its cgroups (the whole tree)
    and the pids recorded with their start times (bwrap's monitor, the namespace's init, the
    server, slirp4netns). Killing init ends its whole pid namespace. Nothing reads other processes' ``/proc``
    files: one of them stuck in the kernel must not hang this sandbox's delete, nor another's.
    Every wait is bounded; what is left is named with its state."""
    step = progress or (lambda _: None)
    sb, run, cgroups, monitor, victims = _found(name, space, data, isolation)
    left: list[int] = []
    deadline = time.monotonic() + timeout
    if cgroups:
        step("killing the processes in the sandbox's cgroups")
        # bubblewrap's monitor, born in the groups, is left to reap init (else init, a zombie, would
        # be nobody's): it exits once init has, and is killed below if it does not
        left = Cgroups.kill_all(cgroups, timeout, extra=victims, spare={monitor} if monitor else frozenset())
    for pid in victims:  # init first among them: the kernel then ends the rest of its namespace
        procfs.kill(pid, signal.SIGKILL)
    step("waiting for the sandbox's processes to end")
    left = sorted(set(left) | set(procfs.wait_gone(victims, max(deadline - time.monotonic(), 0.05))))
    if monitor is not None:  # bwrap's monitor exits once init has; forced if it does not
        step("waiting for bubblewrap's monitor process to exit")
        if procfs.wait_gone([monitor], MONITOR_TIMEOUT if not left else 0.05):
            procfs.kill(monitor, signal.SIGKILL)
            left += procfs.wait_gone([monitor], 0.5)
    problems = [f"processes {describe(left)} did not end within {timeout:g} s"] if left else []
    return sb, run, cgroups, problems


def signal_all(name: str, space: Space, data: LocalHandleData | None, isolation: str) -> None:
    """SIGKILL every process of a sandbox (those ``kill`` ends) without waiting for them to be
    gone: ``kill`` waits, when the rest of the sandbox is removed (``removals.py``)."""
    _, _, cgroups, monitor, victims = _found(name, space, data, isolation)
    if cgroups:
        Cgroups.signal_all(cgroups, extra=victims, spare={monitor} if monitor else frozenset())
    for pid in victims:
        procfs.kill(pid, signal.SIGKILL)


def _found(name: str, space: Space, data: LocalHandleData | None, isolation: str
           ) -> tuple[Path, Path, dict[str, str], int | None, set[int]]:
    """A sandbox's directory, run directory, existing cgroups, bubblewrap's monitor (None: not
    bwrap, or gone) and the other recorded processes alive (plain servers without cgroups: with
    their trees, stopped)."""
    if not NAME_RE.match(name):
        raise BackendError(f"invalid sandbox name {name!r}", 400)
    sb = space.root / name
    if data is None:
        data = read_meta(sb) or LocalHandleData()
    sb = Path(data.dir or sb)
    run = Path(data.run_dir or space.run_dir(name))
    cgroups = {c: p for c, p in (data.cgroups or space.cgroups.paths(name)).items() if os.path.isdir(p)}
    recorded = {key: record[0] for key, record in data.processes().items() if procfs.recorded_alive(record)}
    bwrap = (data.isolation or isolation) == "bwrap"
    monitor = recorded.pop("monitor", None) if bwrap else None
    victims = set(recorded.values())
    if not cgroups and not bwrap and "server" in recorded:
        # A plain server without cgroups: its tree, from its own children, stopped first so that
        # nothing forks or re-parents meanwhile.
        victims |= freeze_trees({recorded["server"]}, include_roots=True, children_of=procfs.children)
    return sb, run, cgroups, monitor, victims


def end_lease_monitor(data: LocalHandleData | None) -> None:
    """End the sandbox's lease monitor (lease.py). Only once nothing of the sandbox is left to
    end: a control plane that dies half-way through a teardown (a shutdown out of budget did)
    leaves the rest to it."""
    lease = data.lease_monitor if data is not None else None
    if lease and procfs.recorded_alive(lease):
        try:  # its session: the monitor and the sleep it waits in
            os.killpg(lease[0], signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def describe(pids: list[int]) -> str:
    """``[pid (state, parent, where it waits), …]``: a process in state D is stuck in the kernel, T
    stopped or frozen; one in S after a SIGKILL waits for something else (such as a namespace's
    init in ``zap_pid_ns_processes``, which waits until every process of its namespace is reaped)."""
    out = []
    for pid in pids:
        st = procfs.stat(pid)
        if st is None:
            out.append(str(pid))
            continue
        try:
            with open(f"/proc/{pid}/wchan") as fh:
                waits = fh.read().strip()
        except OSError:
            waits = ""
        out.append(f"{pid} ({st.state}, parent {st.ppid}{f', in {waits}' if waits not in ('', '0') else ''})")
    return "[" + ", ".join(out) + "]"


def destroy(name: str, space: Space, data: LocalHandleData | None, isolation: str, progress: Progress = None,
            kill_timeout: float = KILL_TIMEOUT) -> None:
    """Kill (``kill_timeout``: as ``kill``'s), unmount, remove; raises ``BackendError`` naming what
    was left behind."""
    step = progress or (lambda _: None)
    if data is None and NAME_RE.match(name):
        data = read_meta(space.root / name) or LocalHandleData()
    sb, run, cgroups, problems = kill(name, space, data, isolation, progress, kill_timeout)
    if problems:
        # Processes are left: its files and record stay (they may still be in use), so that the
        # next attempt (the watcher's orphan sweep) finds everything and finishes the job.
        raise BackendError(f"deleting sandbox {name!r} left something behind: {'; '.join(problems)}")
    step("removing the sandbox's cgroups, mounts and files")
    if cgroups:
        stuck = Cgroups.remove(cgroups)
        if stuck:
            problems.append(f"cgroups {stuck} could not be removed")
    for base in (sb, run):
        for point in mounts.mounts_under(base):
            try:
                mounts.umount(point, detach=True)
            except OSError as exc:
                problems.append(str(exc))
    socket_link = Path(str(run) + ".sock")
    if os.path.lexists(socket_link):
        socket_link.unlink()
    for base in (sb, run):
        shutil.rmtree(base, ignore_errors=True)
        if base.exists():
            problems.append(f"{base} could not be removed")
    if space.kind == "sandboxes" and not sb.exists():  # the fork layers it stood on, once nobody else does
        ForkLayers(space.state_dir).release(sandbox_holder(name))
    if not problems:
        end_lease_monitor(data)
    # The last sandbox out removes the space's bind; its monitor, killed just now, may hold it a
    # moment more (and a close that released the space before this delete ended will not again).
    tidy(space, wait=RELEASE_WAIT)
    if problems:
        raise BackendError(f"deleting sandbox {name!r} left something behind: {'; '.join(problems)}")


def tidy(space: Space, wait: float = 0.0) -> None:
    """Remove shared parents once empty (cgroup parents, a socket directory outside the state,
    the space's bind mount: ``wait`` seconds at most for the last users to leave it)."""
    space.cgroups.remove_parent_if_empty()
    layer_mounts.release(space.root, wait)
    if not space.run_root.is_relative_to(space.state_dir):
        try:
            space.run_root.rmdir()
        except OSError:
            pass
