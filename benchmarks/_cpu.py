"""CPU time of a benchmark's own processes, read from ``/proc``, by part.

A latency or a rate moves with whatever else loads the machine; the CPU time our processes spend
on a run moves far less, so where it goes says where a method loses against another even on a
busy host. Each process's figure includes the children it reaped (a tool's ``bash``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
ROOT = "this process"
REST = "other processes"


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command's name (state first), or None: gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def parent(pid: int) -> int:
    """The parent of ``pid`` (0 when it is gone)."""
    fields = _stat(pid)
    return int(fields[1]) if fields else 0


def own_and_reaped(pid: int) -> tuple[float, float]:
    """CPU seconds of ``pid`` itself and of the children it reaped (user + system; 0 when gone)."""
    fields = _stat(pid)
    if fields is None:
        return 0.0, 0.0
    ticks = [int(f) for f in fields[11:15]]
    return (ticks[0] + ticks[1]) / TICK, (ticks[2] + ticks[3]) / TICK


def _scan() -> dict[int, tuple[int, float]]:
    """Every process: its parent and its CPU seconds (user, system, and of its reaped children)."""
    out: dict[int, tuple[int, float]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (fields := _stat(entry.name)) is not None:
            out[int(entry.name)] = int(fields[1]), sum(int(f) for f in fields[11:15]) / TICK
    return out


def cpu_by_part(parts: Mapping[str, set[int]]) -> dict[str, float]:
    """CPU seconds so far of this process (``ROOT``: its threads, and the children it reaped) and of
    its descendants: each in the first part that names it or an ancestor of it below this process,
    else ``REST``."""
    procs = _scan()
    root = os.getpid()
    out = {ROOT: procs.get(root, (0, 0.0))[1], REST: 0.0, **{name: 0.0 for name in parts}}
    for pid, (_, seconds) in procs.items():
        if pid == root:
            continue
        part, at, seen = None, pid, 0
        while at != root and at in procs and seen < 64:
            part = part or next((name for name, pids in parts.items() if at in pids), None)
            at, seen = procs[at][0], seen + 1
        if at == root:
            out[part or REST] += seconds
    return out


def spent(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {name: after[name] - before.get(name, 0.0) for name in after}


def children() -> set[int]:
    """This process's children now."""
    root = os.getpid()
    return {pid for pid, (parent, _) in _scan().items() if parent == root}


def seconds_of(pids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process, to the nanosecond (the scheduler's count for each of
    its live threads; 0 for a process that is gone). Not its children's."""
    out = {}
    for name, pid in pids.items():
        total = 0
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            tasks = []
        for task in tasks:
            try:
                total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                continue  # a thread that ended meanwhile
        out[name] = total / 1e9
    return out
