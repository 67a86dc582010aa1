"""Mount syscalls for the local backend: mount, bind, unmount, private mount namespaces.

Direct syscalls through libc, no helper processes, so each step of ``create()`` stays in the
tens of microseconds. (Process records and signals are in ``sandbox_server.procfs``.)
"""

from __future__ import annotations

import ctypes
import errno
import os

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
_libc.unshare.argtypes = (ctypes.c_int,)
_libc.setns.argtypes = (ctypes.c_int, ctypes.c_int)

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2


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


def enter_network_namespace(fd: int) -> None:
    """Move the calling *thread* into the network namespace ``fd`` refers to."""
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(net): {os.strerror(err)}")


def enter_mount_namespace(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(mnt): {os.strerror(err)}")


def mounts_under(prefix: str | os.PathLike) -> list[str]:
    """Mount points of *this* mount namespace at or below ``prefix``, deepest first."""
    root = os.fspath(prefix).rstrip("/")
    found = [p for p in _mount_points() if p == root or p.startswith(root + "/")]
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def _mount_points() -> list[str]:
    """Every mount point of this mount namespace, in mountinfo's order (none when unreadable)."""
    try:
        with open("/proc/self/mountinfo", "rb") as fh:
            return [unescape(line.split(b" ", 5)[4].decode()) for line in fh]
    except OSError:
        return []


def unescape(path: str) -> str:
    """A path as mountinfo writes it, unescaped."""
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
