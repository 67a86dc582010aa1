"""Ending a local sandbox: kill its processes, unmount, remove its files and cgroups.

Every step works from what is left, so a half-created sandbox, one whose control plane died,
or one deleted twice ends the same way.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

from sandbox_server import procfs

from ..base import BackendError
from . import mounts
from .cgroups import Cgroups
from .fork_layers import ForkLayers, sandbox_holder
from .layout import NAME_RE, Space, read_meta


def kill(name: str, space: Space, data: dict[str, Any] | None, isolation: str
         ) -> tuple[Path, Path, dict[str, str], list[str]]:
    """End every process of a sandbox (its whole pid namespace); files and groups stay.
    Returns its directory, run directory, existing cgroups and what went wrong."""
    if not NAME_RE.match(name):
        raise BackendError(f"invalid sandbox name {name!r}", 400)
    sb = space.root / name
    if data is None:
        data = read_meta(sb) or {}
    sb = Path(data.get("dir") or sb)
    run = Path(data.get("run_dir") or space.run_dir(name))
    cgroups = {c: p for c, p in (data.get("cgroups") or space.cgroups.paths(name)).items() if os.path.isdir(p)}
    matches = set(procfs.pids_with_cmdline(f"{sb}/")) | set(procfs.pids_with_cmdline(f"{run}/"))
    for key in ("init", "server", "monitor"):
        rec = data.get(key)
        if procfs.recorded_alive(rec):
            matches.add(rec[0])
    # Processes whose command line names the sandbox directory: bwrap's launcher ("monitor")
    # and the namespace's init (even when the control plane died before recording them), or a
    # plain server. The monitor is left to reap init, so that no zombie lingers.
    monitors: set[int] = set()
    if data.get("isolation", isolation) == "bwrap":
        parents = {pid: (procfs.stat(pid) or ("", 0, 0))[1] for pid in matches}
        monitors = {pid for pid, ppid in parents.items() if ppid not in matches}
        monitors -= {data["init"][0]} if data.get("init") else set()
    victims = matches - monitors
    if victims:
        tree = procfs.process_tree()
        family = set(victims)
        for pid in victims:
            family.update(procfs.descendants(pid, tree))
        if not cgroups.get("freezer"):
            # No freezer: stop them first so that nothing forks or re-parents meanwhile.
            # (Never combined with the freezer: a stopped task keeps a group FREEZING.)
            for pid in family:
                procfs.kill(pid, signal.SIGSTOP)
        victims = family
    if cgroups:
        victims |= Cgroups.procs(cgroups)
        Cgroups.kill_all(cgroups, extra=victims)  # frozen, killed, thawed
    for pid in victims:
        procfs.kill(pid, signal.SIGKILL)
    left = procfs.wait_gone(victims, 10.0)
    if monitors:  # they exit once init has; force them if they do not
        left += procfs.wait_gone(monitors, 1.0)
        for pid in monitors:
            procfs.kill(pid, signal.SIGKILL)
        left = [p for p in left if p not in monitors] + procfs.wait_gone(monitors, 5.0)
    problems = [f"processes {left} did not die"] if left else []
    return sb, run, cgroups, problems


def destroy(name: str, space: Space, data: dict[str, Any] | None, isolation: str) -> None:
    """Kill, unmount, remove; raises ``BackendError`` naming what was left behind."""
    sb, run, cgroups, problems = kill(name, space, data, isolation)
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
    tidy(space)
    if problems:
        raise BackendError(f"deleting sandbox {name!r} left something behind: {'; '.join(problems)}")


def tidy(space: Space) -> None:
    """Remove shared parents once empty (cgroup parents, a socket directory outside the state)."""
    space.cgroups.remove_parent_if_empty()
    if not space.run_root.is_relative_to(space.state_dir):
        try:
            space.run_root.rmdir()
        except OSError:
            pass
