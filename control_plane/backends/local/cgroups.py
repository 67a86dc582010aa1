"""Resource limits through cgroup v1 (memory, pids, cpu) and the freezer.

Each sandbox gets a small tree in every controller the host mounts, under a parent derived from
the backend's state directory (two backends never share groups; an orphan sweep finds exactly
its own)::

    <parent>/<name>                    the sandbox: its memory, pids and cpu limits, its CPU weight
    <parent>/<name>/server             the namespace's init and the sandbox server
    <parent>/<name>/tools              every tool: the sandbox's memory minus the server's reserve,
                                       its pids minus a few for the server
    <parent>/<name>/tools/delegated    bound into the sandbox (``/run/idegym-cgroup/tools/<ctrl>``):
                                       the server starts its tools here and may make and empty
                                       child groups (a grading stage); limits set in here are
                                       bounded by ``tools``, which the sandbox cannot see

So whatever the tools do to memory, the server keeps its reserve: the tools' own OOM killer
only ever chooses among tools. The sandbox's processes are in ``server`` before the server can
start any tool, and none is moved there by another process: bubblewrap is *born* in it (the
launching thread joins the groups for the instant it starts it, ``born_in``), so its init and a
server started the long way are too; a server forked by the zygote moves itself, by its one
thread. A move of a process by its pid (``cgroup.procs``, or ``tasks`` with another's pid) on
cgroup v1 write-locks what every fork and exit on the host read-locks, and that waits for an RCU
grace period (6-11 ms, ``benchmarks/cgroup_moves.py``); a thread moving itself ("0" to ``tasks``)
takes no such lock.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator, Set
from pathlib import Path

from sandbox_server import procfs
from sandbox_server.jail import RUN_PIDS_MAX
from sandbox_server.polling import wait_until

log = logging.getLogger(__name__)

CONTROLLERS = ("memory", "pids", "cpu", "freezer")
CFS_PERIOD_US = 100_000
SERVER = "server"
TOOLS = "tools"
DELEGATED = "tools/delegated"
DEFAULT_SERVER_MEMORY_RESERVE = 96 << 20  # the server's RSS is ~50-60 MiB
SERVER_PIDS_RESERVE = 16  # threads of the server (its executor) even when the tools are at their cap
CPU_SHARES_PER_CORE = 1024  # v1's default weight of a group; a sandbox asking for N cores weighs N times that
BACKGROUND_SHARES = 15  # a sandbox made ahead of demand weighs as one task at nice 19 until claimed
RUNNER_PIDS_SLACK = 16  # a code runner's processes beside its runs and their spares: the runs' zygote, the spawner
MIN_RUN_MEMORY = 64 << 20


def controller_mounts() -> dict[str, Path]:
    """Mount point of each cgroup v1 controller we use (co-mounted ones share a directory)."""
    found: dict[str, Path] = {}
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                pre, _, post = line.partition(" - ")
                parts = post.split()
                if len(parts) < 3 or parts[0] != "cgroup":
                    continue
                options = set(parts[2].split(","))
                point = Path(pre.split()[4])
                for ctrl in CONTROLLERS:
                    if ctrl in options:
                        found.setdefault(ctrl, point)
    except OSError:
        pass
    return found


@functools.cache
def _mounts() -> dict[str, Path]:
    return controller_mounts()


def _thread_groups(controllers: Set[str]) -> dict[str, str]:
    """The calling thread's group of each of ``controllers``, as host paths."""
    mounts = _mounts()
    found: dict[str, str] = {}
    with open("/proc/thread-self/cgroup") as fh:
        for line in fh:
            _, names, path = line.rstrip("\n").split(":", 2)
            for ctrl in names.split(","):
                if ctrl in controllers and ctrl in mounts:
                    found[ctrl] = f"{mounts[ctrl]}{path.rstrip('/')}"
    return found


@contextlib.contextmanager
def born_in(paths: dict[str, str]) -> Iterator[None]:
    """The calling thread in ``paths`` (one group per controller) meanwhile, then back in its
    own: a process it starts meanwhile is born there and never has to be moved. Each move is
    the thread's own ("0" to ``tasks``), which takes none of the host-wide lock a move by pid
    takes. The thread must not start anything else meanwhile (it would be born there too)."""
    if not paths:
        yield
        return
    own = _thread_groups(set(paths))
    joined: list[str] = []
    try:
        for ctrl, path in paths.items():
            if os.path.isdir(own.get(ctrl, "")):  # (else not joined: ``attach`` moves what is started)
                _write(path, "tasks", "0")
                joined.append(ctrl)
        yield
    finally:
        failed: OSError | None = None
        for ctrl in joined:  # every one tried: a thread left in a sandbox's group would start its next child there
            try:
                _write(own[ctrl], "tasks", "0")
            except OSError as exc:
                failed = failed or exc
        if failed is not None:
            raise failed


def host_memory() -> int:
    """The host's RAM in bytes (what bounds the tools when the sandbox has no memory limit)."""
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def tools_memory(total: int, reserve: int) -> int:
    """The tools' memory bound of a sandbox with ``total`` bytes: what the server's reserve leaves."""
    return total - min(reserve, total // 2)


def tools_pids(pids: int) -> int:
    return max(pids - SERVER_PIDS_RESERVE, pids // 2, 1)


def runner_pids(pids: int | None, isolated_runs: int) -> int | None:
    """A sandbox's pids bound: a code runner's lets each of its runs reach its own bound at once
    (``sandbox_server/jail.py``), so no run's fork bomb leaves another unable to start."""
    if pids is None or not isolated_runs:
        return pids
    # each run at its limit, and a spare init waiting for each next run (jail.py)
    return max(pids, isolated_runs * (RUN_PIDS_MAX + 1) + SERVER_PIDS_RESERVE + RUNNER_PIDS_SLACK)


def run_memory(total: int, reserve: int, isolated_runs: int) -> int:
    """Each isolated run's memory bound in a code runner of ``total`` bytes: its share of the tools'."""
    return max(tools_memory(total, reserve) // max(isolated_runs, 1), MIN_RUN_MEMORY)


def cpu_shares(cpu_millicores: int | None) -> int:
    """The CPU weight of a sandbox asking for ``cpu_millicores`` (one core's without a limit)."""
    return max(int(CPU_SHARES_PER_CORE * (cpu_millicores or 1000) / 1000), 2)


def sub(paths: dict[str, str], child: str) -> dict[str, str]:
    """The ``child`` group (``server``, ``tools``, ``tools/delegated``) of a sandbox's groups."""
    return {ctrl: os.path.join(path, child) for ctrl, path in paths.items()}


class Cgroups:
    """The cgroup v1 groups of one backend (``available`` is False when the host has none)."""

    def __init__(self, parent: str, server_memory_reserve: int = DEFAULT_SERVER_MEMORY_RESERVE) -> None:
        self.parent = parent.strip("/")
        self.server_memory_reserve = server_memory_reserve
        self.mounts = controller_mounts() if os.geteuid() == 0 else {}
        self.reason = ""
        if os.geteuid() != 0:
            self.reason = "the control plane does not run as root"
        elif not self.mounts:
            self.reason = "no cgroup v1 controller (memory, pids, cpu, freezer) is mounted"
        else:
            for ctrl, point in list(self.mounts.items()):
                if not os.access(point, os.W_OK):
                    del self.mounts[ctrl]
            if not self.mounts:
                self.reason = "the cgroup v1 hierarchies are not writable"

    @property
    def available(self) -> bool:
        return bool(self.mounts)

    def paths(self, name: str) -> dict[str, str]:
        return {ctrl: str(point / self.parent / name) for ctrl, point in self.mounts.items()}

    def create(self, name: str, *, memory: int | None, pids: int | None, cpu_millicores: int | None
               ) -> dict[str, str]:
        """The sandbox's groups with their limits (see the module docstring); returns its paths.
        Its CPU weight is ``cpu_shares(cpu_millicores)``: one made ahead of demand gets
        ``BACKGROUND_SHARES`` once bubblewrap has set it up (``set_shares``, launcher.py)."""
        paths = self.paths(name)
        for path in paths.values():
            for child in ("", SERVER, DELEGATED):
                target = os.path.join(path, child)
                try:
                    os.makedirs(target, exist_ok=True)
                except FileNotFoundError:  # a parent was just removed by a concurrent delete
                    os.makedirs(target, exist_ok=True)
        tools = sub(paths, TOOLS)
        if "memory" in paths:
            if memory:
                _write(paths["memory"], "memory.limit_in_bytes", str(memory))
                # No swap either, where the kernel accounts it (fails harmlessly when it does not).
                _write(paths["memory"], "memory.memsw.limit_in_bytes", str(memory), quiet=True)
            bound = tools_memory(memory or host_memory(), self.server_memory_reserve)
            _write(tools["memory"], "memory.limit_in_bytes", str(bound))
            _write(tools["memory"], "memory.memsw.limit_in_bytes", str(bound), quiet=True)
        if pids and "pids" in paths:
            _write(paths["pids"], "pids.max", str(pids))
            _write(tools["pids"], "pids.max", str(tools_pids(pids)))
        if "cpu" in paths:
            _write(paths["cpu"], "cpu.shares", str(cpu_shares(cpu_millicores)))
            if cpu_millicores:
                _write(paths["cpu"], "cpu.cfs_period_us", str(CFS_PERIOD_US))
                _write(paths["cpu"], "cpu.cfs_quota_us", str(max(cpu_millicores * CFS_PERIOD_US // 1000, 1000)))
        return paths

    # -- operations on recorded paths (work after a control-plane restart) ----------------------

    @staticmethod
    def set_shares(paths: dict[str, str], shares: int) -> bool:
        """The sandbox's CPU weight ``shares`` (one write: every task in its groups weighs by it
        against other sandboxes); False without a cpu group."""
        path = paths.get("cpu")
        if not path or not os.path.isdir(path):
            return False
        _write(path, "cpu.shares", str(shares))
        return True

    @staticmethod
    def attach(paths: dict[str, str], pid: int, single_threaded: bool = False) -> None:
        """Move ``pid`` into ``paths`` (one group per controller) unless it is there already.
        ``single_threaded``: a process that has one thread and never makes another, moved by
        writing it to ``tasks`` (its one thread), which spares the wait for an RCU grace period a
        move of a whole process (``cgroup.procs``) takes on cgroup v1."""
        try:
            with open(f"/proc/{pid}/cgroup") as fh:
                current = {ctrl: line.rstrip("\n").split(":", 2)[2] for line in fh
                           for ctrl in line.split(":", 2)[1].split(",")}
        except (OSError, IndexError):
            current = {}
        for ctrl, path in paths.items():
            if path.endswith(current.get(ctrl, "\0")):
                continue  # already there (inherited): skip the costly move
            _write(path, "tasks" if single_threaded else "cgroup.procs", str(pid))

    @staticmethod
    def procs(paths: dict[str, str]) -> set[int]:
        """Every process in the groups and their descendant groups."""
        found: set[int] = set()
        for path in paths.values():
            for group in _tree(path):
                try:
                    with open(os.path.join(group, "cgroup.procs")) as fh:
                        found.update(int(p) for p in fh.read().split())
                except OSError:
                    continue
        return found

    @staticmethod
    def freeze(paths: dict[str, str], timeout: float = 2.0) -> bool | None:
        """Freeze the group (its descendants with it): True once frozen, False if still freezing
        at the deadline, None without a freezer. Whenever it returns non-None, the caller must
        ``thaw`` afterwards."""
        path = paths.get("freezer")
        if not path or not os.path.isdir(path):
            return None
        _write(path, "freezer.state", "FROZEN")
        return wait_until(lambda: _read(path, "freezer.state") == "FROZEN", timeout, first=0.001, cap=0.002)

    @staticmethod
    def thaw(paths: dict[str, str], descendants: bool = False) -> None:
        """Thaw the group; with ``descendants``, also child groups frozen on their own (a stage
        group the server froze, or a root tool did)."""
        path = paths.get("freezer")
        if path and os.path.isdir(path):
            for group in (_tree(path) if descendants else [path]):
                _write(group, "freezer.state", "THAWED", quiet=True)

    @staticmethod
    def oom_kills(paths: dict[str, str]) -> int:
        """OOM kills in the sandbox's memory groups (v1 counts them per group, not up the tree)."""
        path = paths.get("memory")
        if not path:
            return 0
        kills = 0
        for group in _tree(path):
            for line in _read(group, "memory.oom_control").splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    kills += int(value)
        return kills

    @classmethod
    def signal_all(cls, paths: dict[str, str], extra: Set[int] = frozenset(), spare: Set[int] = frozenset()
                   ) -> set[int]:
        """SIGKILL every process in the groups (and ``extra``) but ``spare``, frozen first so
        nothing forks; without waiting for them to be gone. Returns those it signalled."""
        freezing = cls.freeze(paths, 1.0)
        try:
            victims = (cls.procs(paths) | set(extra)) - {os.getpid(), *spare}
            for pid in victims:
                procfs.kill(pid, signal.SIGKILL)
        finally:
            if freezing is not None:
                cls.thaw(paths, descendants=True)  # frozen tasks only die once thawed
        return victims

    @classmethod
    def kill_all(cls, paths: dict[str, str], timeout: float = 5.0, extra: Set[int] = frozenset(),
                 spare: Set[int] = frozenset()) -> list[int]:
        """SIGKILL every process in the groups (and ``extra``) but ``spare``, frozen first so
        nothing forks; returns those still there after ``timeout`` (e.g. stuck in the kernel),
        ``spare`` left out. (Bubblewrap's monitor is spared: it reaps the namespace's init, then
        exits.)

        The groups are read once more after those signalled have exited (each waited for by its
        pidfd, ``procfs.wait_gone``), not looked at again and again while they die: whatever is
        in them then (a process that got in meanwhile) is killed and waited for in turn."""
        deadline = time.monotonic() + timeout
        spared = {os.getpid(), *spare}
        killed = cls.signal_all(paths, extra, spare)
        while True:
            procfs.wait_gone(killed, max(deadline - time.monotonic(), 0.0))
            left = cls.procs(paths) - spared
            if not left or time.monotonic() >= deadline:
                return sorted(left)
            for pid in left:
                procfs.kill(pid, signal.SIGKILL)
            killed = left

    @staticmethod
    def remove(paths: dict[str, str], timeout: float = 2.0) -> list[str]:
        """rmdir every group, child groups first, within ``timeout`` in all; returns those that
        could not be removed (a group keeps a task that has not died yet)."""
        deadline = time.monotonic() + timeout
        left = []
        for path in paths.values():
            for group in reversed(_tree(path)):
                if not _rmdir_when_free(group, max(deadline - time.monotonic(), 0.0)):
                    left.append(group)
        return left

    def names(self) -> set[str]:
        found: set[str] = set()
        for point in self.mounts.values():
            try:
                found.update(e.name for e in os.scandir(point / self.parent) if e.is_dir())
            except OSError:
                continue
        return found

    def remove_parent_if_empty(self) -> None:
        """Remove our (and the shared top) group when no sandbox is left in it."""
        for point in self.mounts.values():
            path = point / self.parent
            while path != point:
                try:
                    os.rmdir(path)
                except OSError:
                    break
                path = path.parent


def remove_stale(top: str, in_use: Callable[[str], bool]) -> list[str]:
    """Remove, under ``top`` in every controller, the empty groups of state directories that are
    gone (``in_use(key)`` False: ``layout.states_in_use()``): what a delete could not remove and
    nobody came back for. A group that still holds a process is left (``idegym sandboxes prune
    --all`` ends those); so is every group of a state directory that may be in use — one this
    process cannot see but whose backend still runs too (a control plane with a private ``/tmp``
    once removed the groups of every other one's sandbox being made)."""
    removed: list[str] = []
    for point in controller_mounts().values():
        root = point / top.strip("/")
        try:
            keys = [e for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for entry in keys:
            if in_use(entry.name.removesuffix("-build")):
                continue
            for group in reversed(_tree(entry.path)):
                try:
                    os.rmdir(group)
                    removed.append(group)
                except OSError:  # a process in it (or below it)
                    continue
        try:
            os.rmdir(root)
        except OSError:
            pass
    return removed


def _tree(path: str) -> list[str]:
    """``path`` and every group below it, parents before children (empty if it does not exist)."""
    if not os.path.isdir(path):
        return []
    found = [path]
    for group in found:  # grows while it is walked: breadth first
        try:
            found.extend(e.path for e in os.scandir(group) if e.is_dir(follow_symlinks=False))
        except OSError:
            continue
    return found


def _rmdir_when_free(path: str, timeout: float) -> bool:
    """rmdir a group, retrying while the kernel still counts a dying task in it (EBUSY)."""
    failed: list[OSError] = []

    def removed() -> bool:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                failed.append(exc)
            return bool(failed)
        return True

    return wait_until(removed, timeout, first=0.001, cap=0.005) and not failed


def _write(path: str, name: str, value: str, quiet: bool = False) -> None:
    try:
        with open(os.path.join(path, name), "w") as fh:
            fh.write(value)
    except OSError:
        if not quiet:
            raise


def _read(path: str, name: str) -> str:
    try:
        with open(os.path.join(path, name)) as fh:
            return fh.read().strip()
    except OSError:
        return ""
