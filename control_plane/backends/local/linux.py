"""Small Linux primitives for the local backend: mount syscalls, /proc process records, kills.

Everything here is a direct syscall or a /proc read: no helper processes, so the hot path of
``create()`` stays in the tens of microseconds per step.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
_libc.unshare.argtypes = (ctypes.c_int,)
_libc.setns.argtypes = (ctypes.c_int, ctypes.c_int)

CLONE_NEWNS = 0x00020000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _b(value: str | os.PathLike | None) -> bytes | None:
    return None if value is None else os.fsencode(value)


def mount(source: str | os.PathLike | None, target: str | os.PathLike, fstype: str | None,
          flags: int = 0, data: str | None = None) -> None:
    if _libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)) != 0:
        err = ctypes.get_errno()
        what = f"{fstype or 'bind'} {source or ''} on {target}" + (f" ({data})" if data else "")
        raise OSError(err, f"mount {what}: {os.strerror(err)}")


def bind(source: str | os.PathLike, target: str | os.PathLike, *, readonly: bool) -> None:
    """Bind ``source`` on ``target``; read-only binds are remounted with nosuid,nodev too.

    Made in a mount namespace owned by the initial user namespace, a read-only bind becomes
    *locked* once a sandbox's (less privileged) mount namespace copies it: root inside the
    sandbox cannot remount it writable.
    """
    mount(source, target, None, MS_BIND | MS_REC)
    if readonly:
        mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def umount(target: str | os.PathLike, detach: bool = True) -> bool:
    if _libc.umount2(_b(target), MNT_DETACH if detach else 0) != 0:
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOENT):
            return False
        raise OSError(err, f"umount {target}: {os.strerror(err)}")
    return True


def unshare_mount_namespace() -> None:
    """Give the calling *thread* a private mount namespace (CLONE_NEWNS implies CLONE_FS)."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNS): {os.strerror(err)}")
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def enter_mount_namespace(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(mnt): {os.strerror(err)}")


def mounts_under(prefix: str | os.PathLike) -> list[str]:
    """Mount points of *this* mount namespace at or below ``prefix``, deepest first."""
    root = os.fspath(prefix).rstrip("/")
    found = []
    try:
        with open("/proc/self/mountinfo", "rb") as fh:
            for line in fh:
                point = _unescape(line.split(b" ", 5)[4].decode())
                if point == root or point.startswith(root + "/"):
                    found.append(point)
    except OSError:
        return []
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def _unescape(path: str) -> str:
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


# -- processes ------------------------------------------------------------------------------------


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time in clock ticks) of ``pid``, or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[1]), int(fields[19])


def start_time(pid: int) -> int | None:
    st = proc_stat(pid)
    return None if st is None else st[2]


def alive(pid: int, started: int | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, when ``started`` is given, is the same process."""
    st = proc_stat(pid)
    if st is None or st[0] in ("Z", "X"):
        return False
    return started is None or st[2] == started


def record(pid: int) -> list[int] | None:
    """A pid with its start time, so that a reused pid is never mistaken for ours."""
    started = start_time(pid)
    return None if started is None else [pid, started]


def recorded_alive(rec: list[int] | None) -> bool:
    return bool(rec) and alive(rec[0], rec[1])


def children(pid: int) -> list[int]:
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
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = proc_stat(int(entry.name))
            if st is not None:
                tree.setdefault(st[1], []).append(int(entry.name))
    return tree


def descendants(root: int, tree: dict[int, list[int]] | None = None) -> list[int]:
    tree = process_tree() if tree is None else tree
    found, stack = [], [root]
    while stack:
        for child in tree.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def pids_with_cmdline(needle: str) -> list[int]:
    """Processes whose command line mentions ``needle`` (a sandbox's own directory)."""
    want = needle.encode()
    me = os.getpid()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                if want in fh.read():
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
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
    """Wait until none of ``pids`` runs; returns those still running at the deadline."""
    pending = set(pids)
    deadline = time.monotonic() + timeout
    delay = 0.0005
    while pending:
        for pid in list(pending):
            reap(pid)
            if not alive(pid):
                pending.discard(pid)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
    return sorted(pending)


def uptime_ticks() -> int:
    with open("/proc/uptime") as fh:
        return int(float(fh.read().split()[0]) * _CLK_TCK)


def tail(path: Path, lines: int = 40, max_bytes: int = 16384) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(size - max_bytes, 0))
            data = fh.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])
