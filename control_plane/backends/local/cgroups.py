"""Resource limits through cgroup v1 (memory, pids, cpu) and the freezer.

Each sandbox gets ``<controller mount>/<parent>/<sandbox name>`` in every controller the host
mounts; ``parent`` is derived from the backend's state directory so that two backends never
share groups and an orphan sweep finds exactly its own. The sandbox's init and server are moved
in while the server imports (each move costs an RCU grace period, ~3 ms per controller), before
it can start any tool, so everything the tools start inherits the groups.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
from pathlib import Path

from sandbox_server import procfs
from sandbox_server.polling import wait_until

log = logging.getLogger(__name__)

CONTROLLERS = ("memory", "pids", "cpu", "freezer")
CFS_PERIOD_US = 100_000


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


class Cgroups:
    """The cgroup v1 groups of one backend (``available`` is False when the host has none)."""

    def __init__(self, parent: str) -> None:
        self.parent = parent.strip("/")
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

    def create(self, name: str, *, memory: int | None, pids: int | None, cpu_millicores: int | None) -> dict[str, str]:
        paths = self.paths(name)
        for path in paths.values():
            try:
                os.makedirs(path, exist_ok=True)
            except FileNotFoundError:  # a parent was just removed by a concurrent delete
                os.makedirs(path, exist_ok=True)
        if memory and "memory" in paths:
            _write(paths["memory"], "memory.limit_in_bytes", str(memory))
            # No swap either, where the kernel accounts it (fails harmlessly when it does not).
            _write(paths["memory"], "memory.memsw.limit_in_bytes", str(memory), quiet=True)
        if pids and "pids" in paths:
            _write(paths["pids"], "pids.max", str(pids))
        if cpu_millicores and "cpu" in paths:
            _write(paths["cpu"], "cpu.cfs_period_us", str(CFS_PERIOD_US))
            _write(paths["cpu"], "cpu.cfs_quota_us", str(max(cpu_millicores * CFS_PERIOD_US // 1000, 1000)))
        return paths

    # -- operations on recorded paths (work after a control-plane restart) ----------------------

    @staticmethod
    def attach(paths: dict[str, str], pid: int) -> None:
        try:
            with open(f"/proc/{pid}/cgroup") as fh:
                current = {ctrl: line.rstrip("\n").split(":", 2)[2] for line in fh
                           for ctrl in line.split(":", 2)[1].split(",")}
        except (OSError, IndexError):
            current = {}
        for ctrl, path in paths.items():
            if path.endswith(current.get(ctrl, "\0")):
                continue  # already there (inherited): skip the costly move
            _write(path, "cgroup.procs", str(pid))

    @staticmethod
    def procs(paths: dict[str, str]) -> set[int]:
        found: set[int] = set()
        for path in paths.values():
            try:
                with open(os.path.join(path, "cgroup.procs")) as fh:
                    found.update(int(p) for p in fh.read().split())
            except OSError:
                continue
        return found

    @staticmethod
    def freeze(paths: dict[str, str], timeout: float = 2.0) -> bool | None:
        """Freeze the group: True once frozen, False if still freezing at the deadline, None
        without a freezer. Whenever it returns non-None, the caller must ``thaw`` afterwards."""
        path = paths.get("freezer")
        if not path or not os.path.isdir(path):
            return None
        _write(path, "freezer.state", "FROZEN")
        return wait_until(lambda: _read(path, "freezer.state") == "FROZEN", timeout, first=0.001, cap=0.002)

    @staticmethod
    def thaw(paths: dict[str, str]) -> None:
        path = paths.get("freezer")
        if path and os.path.isdir(path):
            _write(path, "freezer.state", "THAWED", quiet=True)

    @staticmethod
    def oom_kills(paths: dict[str, str]) -> int:
        path = paths.get("memory")
        if not path:
            return 0
        for line in _read(path, "memory.oom_control").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    @classmethod
    def kill_all(cls, paths: dict[str, str], timeout: float = 5.0, extra: set[int] = frozenset()) -> list[int]:
        """SIGKILL every process in the groups (and ``extra``), frozen first so nothing forks."""
        freezing = cls.freeze(paths, 1.0)
        try:
            for pid in cls.procs(paths) | set(extra):
                procfs.kill(pid, signal.SIGKILL)
        finally:
            if freezing is not None:
                cls.thaw(paths)  # frozen tasks only die once thawed: never leave the group frozen

        def empty() -> bool:
            left = cls.procs(paths)
            for pid in left:
                procfs.kill(pid, signal.SIGKILL)
                procfs.reap(pid)
            return not left

        wait_until(empty, timeout, first=0.001, cap=0.005)
        return sorted(cls.procs(paths))

    @staticmethod
    def remove(paths: dict[str, str], timeout: float = 2.0) -> list[str]:
        """rmdir every group; returns those that could not be removed."""
        return [path for path in paths.values() if not _rmdir_when_free(path, timeout)]

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
