"""Linux's file-descriptor mount API (``fsopen``/``fsmount``/``open_tree``/``move_mount``), by syscall.

It lets a mount be made here, with paths resolved in this mount namespace, and attached in
another one (a running sandbox's), which ``mount(2)`` cannot do. x86-64 and aarch64 share these
syscall numbers (they were added after the tables were unified).
"""

from __future__ import annotations

import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_FSOPEN, SYS_FSCONFIG, SYS_FSMOUNT, SYS_MOUNT_SETATTR = 428, 429, 430, 431, 432, 442
FSOPEN_CLOEXEC = 1
FSCONFIG_SET_FLAG, FSCONFIG_SET_STRING, FSCONFIG_CMD_CREATE = 0, 1, 6
FSMOUNT_CLOEXEC = 1
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
OPEN_TREE_CLONE = 1
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 0x4


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _b(text: str | os.PathLike) -> bytes:
    return os.fsencode(text)


def overlay(lowers: list[str], upper: str, work: str, *, attrs: int = 0, userxattr: bool = False) -> int:
    """A detached overlay mount (a descriptor); paths are resolved now, relative ones against the
    calling thread's working directory. Each lower is its own option (no page limit on the list)."""
    fs = _check(_libc.syscall(SYS_FSOPEN, b"overlay", FSOPEN_CLOEXEC), "fsopen(overlay)")
    try:
        def option(key: str, value: str | None) -> None:
            cmd = FSCONFIG_SET_FLAG if value is None else FSCONFIG_SET_STRING
            _check(_libc.syscall(SYS_FSCONFIG, ctypes.c_int(fs), ctypes.c_uint(cmd), _b(key),
                                 None if value is None else _b(value), ctypes.c_int(0)),
                   f"overlay option {key}={value}")

        for lower in lowers:
            option("lowerdir+", lower)
        option("upperdir", upper)
        option("workdir", work)
        if userxattr:
            option("userxattr", None)
        _check(_libc.syscall(SYS_FSCONFIG, ctypes.c_int(fs), ctypes.c_uint(FSCONFIG_CMD_CREATE), None, None,
                             ctypes.c_int(0)), f"overlay over {lowers[:1]}...")
        return _check(_libc.syscall(SYS_FSMOUNT, ctypes.c_int(fs), ctypes.c_uint(FSMOUNT_CLOEXEC),
                                    ctypes.c_uint(attrs)), "fsmount(overlay)")
    finally:
        os.close(fs)


def clone(path: str | os.PathLike, *, recursive: bool, readonly: bool = False) -> int:
    """A detached copy of the mount at ``path`` (with what is mounted below it when ``recursive``)."""
    flags = OPEN_TREE_CLONE | os.O_CLOEXEC | (AT_RECURSIVE if recursive else 0)
    fd = _check(_libc.syscall(SYS_OPEN_TREE, ctypes.c_int(AT_FDCWD), _b(path), ctypes.c_uint(flags)),
                f"open_tree({path})")
    if readonly:
        attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
        try:
            _check(_libc.syscall(SYS_MOUNT_SETATTR, ctypes.c_int(fd), b"",
                                 ctypes.c_uint(AT_EMPTY_PATH | (AT_RECURSIVE if recursive else 0)),
                                 ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))), f"read-only {path}")
        except BaseException:
            os.close(fd)
            raise
    return fd


def attach(mount_fd: int, target: str | os.PathLike) -> None:
    """Attach a detached mount at ``target`` (resolved in the calling thread's mount namespace)."""
    _check(_libc.syscall(SYS_MOVE_MOUNT, ctypes.c_int(mount_fd), b"", ctypes.c_int(AT_FDCWD), _b(target),
                         ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH)), f"move_mount to {target}")

