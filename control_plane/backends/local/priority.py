"""Background work yields the CPU: the warm pool's sandboxes are made at a low priority.

A sandbox made ahead of demand (a warm-pool fill) competes for the same cores with the sandboxes
that serve calls. On 2 cores, the 8 fills that follow a fork into 8 made the children's bash calls
take twice as long (the children answering 8 calls: 51 -> 26 ms p50 once fills ran at nice 19,
``benchmarks/fork.py``). So a fill's host-side work (its directories, layers, cgroups and
bubblewrap) runs on threads at ``BACKGROUND_NICE``, its processes start at that nice, and a claim
gives every task of the sandbox the normal priority back before it serves anything.

What stays at the normal priority, because a preempted low-priority thread would hold up others:
moving processes into cgroups (``readiness.attach``: it holds the lock every ``fork()`` on the host
takes) and the zygote's fork of a server (one request at a time on its socket). Deletes stay too:
a client waits for them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from sandbox_server import procfs

from .handle_data import LocalHandleData

BACKGROUND_NICE = 19
NORMAL_NICE = 0


def lower_this_thread() -> None:
    """Run the calling thread, and whatever it starts, at the background priority (an executor's
    initializer: on Linux a nice value is a thread's, and children inherit their thread's)."""
    os.setpriority(os.PRIO_PROCESS, 0, BACKGROUND_NICE)


def set_tasks(tids: Iterable[int], nice: int) -> None:
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:  # ended meanwhile
            pass


def tasks_of_process(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def _tasks_in_groups(root: str) -> list[int]:
    """Every thread in a cgroup v1 tree (``tasks`` lists a group's own threads only)."""
    found: list[int] = []
    for directory, _, _ in os.walk(root):
        try:
            with open(os.path.join(directory, "tasks")) as fh:
                found += [int(t) for t in fh.read().split()]
        except FileNotFoundError:  # removed meanwhile
            continue
    return found


def restore(data: LocalHandleData) -> None:
    """Give every task of the sandbox ``data`` describes the normal priority (it was made in the
    background and is about to serve): whatever its cgroups hold, else its init's process tree."""
    groups = data.cgroups
    root = groups.get("cpu") or next(iter(groups.values()), None)
    if root and os.path.isdir(root):
        tids = _tasks_in_groups(root)
    else:
        init = data.init or data.server
        if not procfs.recorded_alive(init):
            return
        tids = [t for pid in [init[0], *procfs.descendants(init[0])] for t in tasks_of_process(pid)]
    set_tasks(tids, NORMAL_NICE)
