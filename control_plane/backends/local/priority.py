"""Background work yields the CPU: the warm pool's sandboxes are made at a low priority.

A sandbox made ahead of demand (a warm-pool fill) competes for the same cores with the sandboxes
that serve calls. On 2 cores, the 8 fills that follow a fork into 8 made the children's bash calls
take twice as long (the children answering 8 calls: 51 -> 26 ms p50 once fills ran at nice 19,
``benchmarks/fork.py``). So a fill's processes (bubblewrap and all it starts) start at
``BACKGROUND_NICE``; once they are in the sandbox's groups, the group's CPU weight is what ranks
them against other sandboxes (a task's nice only ranks it inside its own group), and that weight is
the least (``cgroups.BACKGROUND_SHARES``) from the moment bubblewrap, born in the groups, has set
the sandbox up until it is claimed. Its tasks get nice 0 back at the end of the fill (``settle``,
in the background), so a claim is one write of the group's weight (``restore``), not a walk of its
tasks on the claim's path (3-6 ms under load for each of a fork's 8 children). Without a cpu group,
nice is all there is: the claim gives every task nice 0.

What stays at the normal priority, because a preempted low-priority thread would hold up others:
the fill's host-side work on the control plane's threads (its directories, layers, cgroups, the
start of bubblewrap): those threads take the GIL the event loop needs, and at nice 19 on a loaded
host one was preempted while holding it, so the loop waited for it. Back-to-back RESTART resets as
``benchmarks/env_step.py`` makes them, 8 runs of 50 alternated (load 11-17): their p95 88 -> 59 ms
and the first step after each 62 -> 56 ms p50 once those threads ran at nice 0; the loop's thread
was found in a futex wait (the GIL) in 8-12 % of 1 ms samples, 4.7 % after; ``env_step`` itself, 4
rounds alternated at load 4-6: reset p95 45 31 47 62 ms against 61 47 49 79 (5 rounds at load 11-14
before: 55 74 90 34 60 against 126 29 32 30 85). The warm-pool fork (``BENCH_FORK_WARM_ONLY``, 8
children ready p50, 10 rounds alternated, load 9 falling to 2): 116 105 79 66 80 59 108 119 76 71
ms against 80 80 71 78 70 63 119 131 122 81: no worse. Also moving processes into cgroups
(``readiness.attach``: it holds the lock every ``fork()`` on the host takes) and the zygote's fork
of a server (one request at a time on its socket). Deletes stay too: a client waits for them
(one nobody waits for, a restart's old sandbox, waits for a quiet moment instead: ``removals.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from sandbox_server import procfs

from .cgroups import Cgroups
from .handle_data import LocalHandleData

BACKGROUND_NICE = 19
NORMAL_NICE = 0


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


def _tasks(data: LocalHandleData) -> list[int]:
    """Every task of the sandbox ``data`` describes: whatever its cgroups hold, else its init's
    process tree."""
    groups = data.cgroups
    root = groups.get("cpu") or next(iter(groups.values()), None)
    if root and os.path.isdir(root):
        return _tasks_in_groups(root)
    init = data.init or data.server
    if not procfs.recorded_alive(init):
        return []
    return [t for pid in [init[0], *procfs.descendants(init[0])] for t in tasks_of_process(pid)]


def _all_normal(data: LocalHandleData, passes: int = 5) -> None:
    """Every task of the sandbox at ``NORMAL_NICE``, read again until a pass finds none left (a
    task forked from one not reset yet inherits the low nice)."""
    for _ in range(passes):
        low = []
        for tid in _tasks(data):
            try:
                if os.getpriority(os.PRIO_PROCESS, tid) != NORMAL_NICE:
                    low.append(tid)
            except ProcessLookupError:  # ended meanwhile
                continue
        if not low:
            return
        set_tasks(low, NORMAL_NICE)


def settle(data: LocalHandleData) -> None:
    """The end of a fill: when the sandbox's group carries its low weight (``data.cpu_shares``
    set), its tasks get nice 0 now, in the background, and its claim only restores the weight."""
    if data.cpu_shares is not None:
        _all_normal(data)


def restore(data: LocalHandleData) -> None:
    """The sandbox ``data`` describes was made in the background and is about to serve: its
    group's CPU weight (one write), else the normal nice for every task."""
    if data.cpu_shares is not None and Cgroups.set_shares(data.cgroups, data.cpu_shares):
        return
    _all_normal(data)
