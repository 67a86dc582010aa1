"""The sandbox's OOM-kill counter, as cgroups report it (v1 ``memory.oom_control``, v2
``memory.events``): a bash result says when the OOM killer struck during its command."""

from __future__ import annotations

import functools
import os


class MemoryEvents:
    """The sandbox's OOM-kill counter: ``oom_kill`` of a cgroup v1 ``memory.oom_control`` or a v2
    ``memory.events`` file (the local backend binds its sandbox's file in; a pod sees its own v2
    file, which the root of a host's hierarchy does not have, so no host-wide count is taken)."""

    DEFAULT_PATHS = ("/sys/fs/cgroup/memory.events",)

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        candidates = [str(path)] if path else list(self.DEFAULT_PATHS)
        self.path = next((p for p in candidates if self._read(p) is not None), None)

    @staticmethod
    def _read(path: str) -> int | None:
        """The file's ``oom_kill``; for a v1 ``memory.oom_control``, summed with its child groups'
        (v1 counts a kill in the victim's own group, e.g. a stage's)."""
        files = [path]
        if os.path.basename(path) == "memory.oom_control":
            parent = os.path.dirname(path)
            # A directory's link count is 2 plus its subdirectories: one stat, not a walk, per call.
            if _subdirectories(parent):
                files += [os.path.join(root, "memory.oom_control") for root, _, _ in os.walk(parent)
                          if root != parent]
        total = None
        for name in files:
            # os.read, not open(): a buffered file object costs ~5 times the read itself, and
            # every bash call reads this twice.
            try:
                fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                data = b"".join(iter(functools.partial(os.read, fd, 4096), b""))
                for line in data.splitlines():
                    key, _, value = line.partition(b" ")
                    if key == b"oom_kill":
                        total = (total or 0) + int(value)
            except (OSError, ValueError):
                continue
            finally:
                os.close(fd)
        return total

    def count(self) -> int | None:
        return None if self.path is None else self._read(self.path)


def _subdirectories(path: str) -> bool:
    try:
        return os.stat(path).st_nlink != 2
    except OSError:
        return False
