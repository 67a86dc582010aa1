"""The sandbox's OOM-kill counter, as cgroups report it (v1 ``memory.oom_control``, v2
``memory.events``): a bash result says when the OOM killer struck during its command."""

from __future__ import annotations

import os


class MemoryEvents:
    """The sandbox's OOM-kill counter: ``oom_kill`` of a cgroup v1 ``memory.oom_control`` or a v2
    ``memory.events`` file (the local backend binds its sandbox's file in; a pod sees its own v2
    file, which the root of a host's hierarchy does not have, so no host-wide count is taken).

    Every bash call reads it twice, on its critical path: the file is kept open and read with
    ``pread`` at offset 0, which has the kernel render it afresh (an open, a path walk through
    the bind mount and a close cost ~25 us a read on a loaded host; a ``pread`` ~5). A group
    made again under the same path (a descriptor that no longer reads) is opened again."""

    DEFAULT_PATHS = ("/sys/fs/cgroup/memory.events",)

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self._fd: int | None = None
        self._dir_fd: int | None = None  # the group's directory (v1), open as long as ``_fd``
        candidates = [str(path)] if path else list(self.DEFAULT_PATHS)
        self.path = next((p for p in candidates if _read_path(p) is not None), None)
        self._v1 = self.path is not None and os.path.basename(self.path) == "memory.oom_control"
        self._group = os.path.dirname(self.path) if self.path is not None else ""

    def count(self) -> int | None:
        if self.path is None:
            return None
        total = self._read_own()
        # v1 counts a kill in the victim's own group (e.g. a stage's): the child groups' files too.
        # A directory's link count is 2 plus its subdirectories: one fstat of the group's directory
        # kept open (reopened with the file), not a walk, nor a path's stat (~3 us more), per call.
        parent = self._group
        if self._v1 and self._subdirectories():
            for root, _, _ in os.walk(parent):
                if root != parent and (more := _read_path(os.path.join(root, "memory.oom_control"))) is not None:
                    total = (total or 0) + more
        return total

    def _read_own(self) -> int | None:
        assert self.path is not None
        for _ in range(2):
            if self._fd is None:
                try:
                    self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    return None
            try:
                return _oom_kill(os.pread(self._fd, 4096, 0))
            except OSError:  # the group went (ENODEV): the path may name a new one
                self.close()
        return None

    def _subdirectories(self) -> bool:
        if self._dir_fd is None:
            try:
                self._dir_fd = os.open(self._group, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                return False
        try:
            return os.fstat(self._dir_fd).st_nlink != 2
        except OSError:
            return False

    def close(self) -> None:
        for fd in (self._fd, self._dir_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._dir_fd = None


def _read_path(path: str) -> int | None:
    """``oom_kill`` of the file at ``path`` (None when it cannot be read or has none)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _oom_kill(os.pread(fd, 4096, 0))
    except OSError:
        return None
    finally:
        os.close(fd)


_OOM_KILL = b"oom_kill "


def _oom_kill(data: bytes) -> int | None:
    """The value of the ``oom_kill`` line (found, not split into lines: twice on every call's path)."""
    if data.startswith(_OOM_KILL):
        at = len(_OOM_KILL)
    else:
        at = data.find(b"\n" + _OOM_KILL)
        if at < 0:
            return None
        at += 1 + len(_OOM_KILL)
    end = data.find(b"\n", at)
    try:
        return int(data[at:end] if end >= 0 else data[at:])
    except ValueError:
        return None
