"""A command's processes, wherever they went: its tree, whatever holds its output pipes, whatever
carries its mark (``IDEGYM_CALL`` in the environment); and stopping a tree so that nothing in it
forks its way out."""

from __future__ import annotations

import errno
import functools
import os
import signal
from collections.abc import Callable, Iterable, Set

from . import procfs
from .polling import wait_until

STOP_WAIT = 2.0  # seconds for a round's processes to stop (one in uninterruptible sleep may not)


def freeze_trees(roots: set[int], include_roots: bool, rounds: int = 200,
                 spare: frozenset[int] = frozenset(),
                 children_of: Callable[[int], Iterable[int]] | None = None) -> set[int]:
    """SIGSTOP every live descendant of ``roots`` (and the roots themselves if asked), waiting
    until each has stopped and looking again until a scan finds nothing new; returns the stopped
    processes. A stopped process cannot fork, exit or re-parent its children, so the set stops
    growing. ``spare`` processes are not stopped, their descendants are. ``children_of`` finds a
    process's children; by default each round scans every process of the pid namespace once,
    ``procfs.children`` reads only the tree's own ``/proc`` entries (for a caller on the host)."""
    me = os.getpid()
    frozen: set[int] = set()
    for _ in range(rounds):
        kids = children_of or _children_in(procfs.process_tree())
        found = {p for p in roots if p != me and procfs.alive(p)} if include_roots else set()
        stack = list(roots | frozen | spare)
        while stack:
            for child in kids(stack.pop()):
                if child in spare:
                    stack.append(child)
                elif child not in found and child != me:
                    found.add(child)
                    stack.append(child)
        new = found - frozen
        if not new:
            break
        for pid in new:
            procfs.kill(pid, signal.SIGSTOP)
        frozen |= new
        # A stop takes effect on the way back to user space: a fork the process is making when the
        # signal comes completes first, and its child (not stopped with it) must be in a later scan.
        wait_until(functools.partial(_all_halted, new), STOP_WAIT)
    return frozen


def _children_in(tree: dict[int, list[int]]) -> Callable[[int], Iterable[int]]:
    return lambda pid: tree.get(pid, ())


def _all_halted(pids: set[int]) -> bool:
    return all(procfs.halted(pid) for pid in pids)


def signal_group_and_holders(pgid: int, pipe_ids: set[int], sig: int, spare: Set[int] = frozenset()) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pipe_holders(pipe_ids, spare):
        procfs.kill(pid, sig)


def marked_processes(mark: bytes) -> set[int]:
    """Descendants of this server whose environment holds ``mark`` (one command's processes,
    including those that left its process tree)."""
    found = set()
    for pid in procfs.descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if mark in fh.read().split(b"\0"):
                    found.add(pid)
        except OSError:
            continue
    return found


def pipe_holders(pipe_inodes: set[int], spare: Set[int] = frozenset()) -> list[int]:
    """Processes (other than us and ``spare``) holding one of the given pipes open."""
    targets = {f"pipe:[{ino}]" for ino in pipe_inodes}
    found = []
    for pid in procfs.other_pids():
        if pid in spare:
            continue
        try:
            for fd in os.scandir(f"/proc/{pid}/fd"):
                try:
                    if os.readlink(fd.path) in targets:
                        found.append(pid)
                        break
                except OSError:
                    continue
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.EACCES, errno.ESRCH, errno.EPERM):
                raise
    return found
