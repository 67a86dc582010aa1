"""Processes as ``/proc`` shows them: state, parents, children, start times, signals.

Shared by the sandbox server (its tools) and the control plane's local backend (its sandboxes),
so it lives here: ``sandbox_server`` imports nothing from the other packages. Every function is
a direct ``/proc`` read or a syscall, and tolerates processes that end while it looks.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Iterable, Iterator
from typing import NamedTuple, TypeGuard

from .polling import wait_until


class Stat(NamedTuple):
    state: str  # R, S, D, Z, T…
    ppid: int
    start: int  # start time in clock ticks since boot: with the pid, it names one process
    threads: int


def _read_stat(path: str) -> Stat | None:
    try:
        with open(path, "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return Stat(fields[0].decode(), int(fields[1]), int(fields[19]), int(fields[17]))


def stat(pid: int) -> Stat | None:
    """``/proc/<pid>/stat`` of ``pid``, or None when it does not exist."""
    return _read_stat(f"/proc/{pid}/stat")


def alive(pid: int, started: int | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, when ``started`` is given, is the same process."""
    st = stat(pid)
    if st is None or st.state in ("Z", "X"):
        return False
    return started is None or st.start == started


def halted(pid: int) -> bool:
    """Whether ``pid`` is stopped (every thread of it), a zombie or gone: it runs no more code."""
    leader = stat(pid)
    if leader is None or leader.state in ("Z", "X"):
        return True
    if leader.threads == 1:
        return leader.state in ("T", "t")
    try:
        tasks = [t.name for t in os.scandir(f"/proc/{pid}/task")]
    except OSError:
        return True
    return all((st := _read_stat(f"/proc/{pid}/task/{t}/stat")) is None or st.state in ("T", "t", "Z", "X")
               for t in tasks)


def record(pid: int) -> list[int] | None:
    """``[pid, start time]``, so that a reused pid is never mistaken for the recorded process."""
    st = stat(pid)
    return None if st is None else [pid, st.start]


def recorded_alive(rec: list[int] | None) -> TypeGuard[list[int]]:
    """Whether the process ``record`` names still runs (then ``rec`` is ``[pid, start time]``)."""
    return rec is not None and len(rec) > 0 and alive(rec[0], rec[1])


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's), without scanning other processes."""
    out: list[int] = []
    try:
        for task in os.scandir(f"/proc/{pid}/task"):
            try:
                with open(f"{task.path}/children") as fh:
                    out.extend(int(p) for p in fh.read().split())
            except OSError:
                continue
    except OSError:
        pass
    return out


def process_tree() -> dict[int, list[int]]:
    """Parent pid → live children, for every process of this pid namespace."""
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = stat(int(entry.name))
            if st is not None and st.state not in ("Z", "X"):
                tree.setdefault(st.ppid, []).append(int(entry.name))
    return tree


def descendants(root: int, tree: dict[int, list[int]] | None = None) -> list[int]:
    """Every live descendant of ``root`` (children of children included)."""
    tree = process_tree() if tree is None else tree
    found, stack = [], [root]
    while stack:
        for child in tree.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def other_pids() -> Iterator[int]:
    """Every process of this pid namespace but this one."""
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != me:
            yield int(entry.name)


def pids_with_cmdline(needle: str) -> list[int]:
    """Processes whose command line mentions ``needle``. Reads every process's ``cmdline``, which
    can block on a process stuck in the kernel's memory code: for tests and tools, not for a
    path that must answer."""
    want = needle.encode()
    found = []
    for pid in other_pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if want in fh.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal ``pid``; a process that is gone (or not ours to signal) is no error."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def reap(pid: int) -> None:
    """Collect ``pid`` if it is our exited child; harmless otherwise."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` runs (reaping our own children); returns those still running.

    Each is waited for through a pidfd, one after the other: the wait wakes as the process exits
    (a zombie has), with no look at ``/proc`` meanwhile and one descriptor open however many are
    waited for (what a stop's wait costs: ``control_plane/backends/local/teardown.py``). Where
    pidfds are refused (a seccomp filter) ``/proc`` is looked at, less often as time goes."""
    deadline = time.monotonic() + timeout
    return sorted(pid for pid in set(pids) if not _wait_exit(pid, deadline))


def _wait_exit(pid: int, deadline: float) -> bool:
    """Whether ``pid`` has exited (or exits before ``deadline``); reaped if it is our child."""
    reap(pid)
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except OSError:
        def gone() -> bool:
            reap(pid)
            return not alive(pid)

        return wait_until(gone, max(deadline - time.monotonic(), 0.0))
    try:
        waiter = select.poll()
        waiter.register(fd, select.POLLIN)
        exited = bool(waiter.poll(max(deadline - time.monotonic(), 0.0) * 1000))
    finally:
        os.close(fd)
    reap(pid)
    return exited


def write(pid: int, name: str, value: bytes) -> bool:
    """Write ``value`` to ``/proc/<pid>/<name>`` (e.g. ``oom_score_adj``); False if it failed."""
    try:
        fd = os.open(f"/proc/{pid}/{name}", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.write(fd, value)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
