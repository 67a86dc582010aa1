"""A sandbox's writable layers on a filesystem of their own, bounded in bytes and in inodes.

Every isolated sandbox's ``layers/`` directory (the upper layers of its root trees and of its
project, and its server log) is an ext4 filesystem in a sparse image file in the sandbox's
directory, on a loop device that detaches itself once the filesystem is unmounted. Writes past
the bound fail with ENOSPC inside the sandbox instead of filling the host's disk, and so do
files past the inode bound; the image holds only what was written, and deleting the sandbox
gives it all back at once (one unmount, one file).

Images are copied from a formatted template per (size, inodes), made once per state directory
with ``mkfs.ext4``: no journal (a sandbox's layer does not outlive a crash of its host anyway)
and no blocks reserved for growing the filesystem (``resize_inode``: a layer never grows). Those
reserved blocks were 4 MiB of the default 8 GiB layer's 4.2: every sandbox's start copied them,
and the host wrote them back to disk half a minute later, into whatever ran then.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import shutil
import stat
import struct
import subprocess
import time
from pathlib import Path

from ...constants import DEFAULT_STORAGE_BYTES, DEFAULT_STORAGE_INODES  # noqa: F401 - re-exported
from ..base import BackendError
from . import mounts

MIN_BYTES_PER_INODE = 4096  # a small bound gets fewer inodes: the inode table must fit in it
IMAGE_NAME = "layers.ext4"  # a bounded filesystem's image, beside its mount point

LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LO_FLAGS_READ_ONLY = 1
LO_FLAGS_AUTOCLEAR = 4
_ATTACH_SECONDS = 30.0  # racing other callers for a free loop device, at most
# struct loop_config { u32 fd; u32 block_size; struct loop_info64 info; u64 reserved[8]; }
_LOOP_CONFIG = struct.Struct("=II QQQQQ IIII 64s64s32s QQ 8Q")


def inodes_for(size: int, inodes: int) -> int:
    return max(min(inodes, size // MIN_BYTES_PER_INODE), 1024)


class LayerStorage:
    """Bounded layer filesystems for the sandboxes of one state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.templates = state_dir / "storage"

    @staticmethod
    def unavailable() -> str | None:
        """Why bounded layers cannot be made here, or None."""
        if shutil.which("mkfs.ext4") is None:
            return "mkfs.ext4 is not installed (Debian package e2fsprogs)"
        if not os.path.exists("/dev/loop-control"):
            return "the kernel has no loop devices (/dev/loop-control)"
        return None

    def template(self, size: int, inodes: int) -> Path:
        """The formatted image for (``size``, ``inodes``), made once (under a lock)."""
        path = self.templates / f"{size}-{inodes}.fixed.ext4"  # "fixed": no resize_inode
        if path.exists():
            return path
        self.templates.mkdir(parents=True, exist_ok=True)
        with open(self.templates / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if path.exists():
                return path
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            with open(tmp, "wb") as fh:
                fh.truncate(size)
            proc = subprocess.run(["mkfs.ext4", "-q", "-F", "-O", "^has_journal,^resize_inode", "-N", str(inodes),
                                   "-m", "0", "-E", "lazy_itable_init=1,nodiscard", str(tmp)],
                                  capture_output=True, timeout=120)
            if proc.returncode != 0:
                tmp.unlink(missing_ok=True)
                raise BackendError(f"mkfs.ext4 failed for a {size}-byte sandbox layer: "
                                   f"{proc.stderr.decode(errors='replace').strip()}")
            tmp.rename(path)
        return path

    def mount(self, target: Path, image: Path, size: int, inodes: int, options: str | None = None) -> None:
        """A fresh bounded filesystem at ``target`` (an empty directory), stored in ``image``,
        mounted with ext4's ``options``."""
        _sparse_copy(self.template(size, inodes_for(size, inodes)), image)
        device, fd = _attach(image)
        try:  # with the device open: its last close before the mount would detach it
            mounts.mount(device, target, "ext4", mounts.MS_NOSUID | mounts.MS_NODEV, options)
        except OSError as exc:
            raise BackendError(f"cannot mount the sandbox's layer {image} ({device}): {exc}") from exc
        finally:
            os.close(fd)
        lost = target / "lost+found"
        if lost.is_dir():
            os.rmdir(lost)
        os.chmod(target, 0o700)


def mount_readonly(target: Path, image: Path) -> None:
    """Mount the existing ``image`` read-only at ``target`` (a read-only loop device too)."""
    device, fd = _attach(image, readonly=True)
    try:
        mounts.mount(device, target, "ext4", mounts.MS_RDONLY | mounts.MS_NOSUID | mounts.MS_NODEV)
    except OSError as exc:
        raise BackendError(f"cannot mount {image} ({device}): {exc}") from exc
    finally:
        os.close(fd)


def _sparse_copy(src: Path, dst: Path) -> None:
    """Copy only the data of a sparse file (a formatted image is a few MiB in a few GiB)."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        size = os.fstat(fin.fileno()).st_size
        offset = 0
        while offset < size:
            try:
                start = os.lseek(fin.fileno(), offset, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # no data after offset
                    break
                raise
            end = os.lseek(fin.fileno(), start, os.SEEK_HOLE)
            done = start
            while done < end:
                done += os.copy_file_range(fin.fileno(), fout.fileno(), end - done, done, done)
            offset = end
        fout.truncate(size)


def _attach(image: Path, readonly: bool = False) -> tuple[str, int]:
    """A free loop device backed by ``image`` and an open fd of it (the caller closes it once the
    filesystem is mounted); the device detaches itself when its last user is gone."""
    backing = os.open(image, (os.O_RDONLY if readonly else os.O_RDWR) | os.O_CLOEXEC)
    flags = LO_FLAGS_AUTOCLEAR | (LO_FLAGS_READ_ONLY if readonly else 0)
    try:
        control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
        try:
            # Every caller racing for a device is told the same free one and one wins each round:
            # with many sandboxes being made at once (several control planes on a host), a fixed
            # number of rounds ran out, so the race goes on until a deadline.
            deadline = time.monotonic() + _ATTACH_SECONDS
            while time.monotonic() < deadline:
                number = fcntl.ioctl(control, LOOP_CTL_GET_FREE)
                device = f"/dev/loop{number}"
                if not os.path.exists(device):
                    os.mknod(device, 0o660 | stat.S_IFBLK, os.makedev(7, number))
                fd = os.open(device, (os.O_RDONLY if readonly else os.O_RDWR) | os.O_CLOEXEC)
                config = _LOOP_CONFIG.pack(backing, 0, 0, 0, 0, 0, 0, number, 0, 0, flags,
                                           os.fsencode(image)[:63], b"", b"", 0, 0, *([0] * 8))
                try:
                    fcntl.ioctl(fd, LOOP_CONFIGURE, config)
                    return device, fd
                except OSError as exc:
                    os.close(fd)
                    if exc.errno != errno.EBUSY:
                        raise BackendError(f"cannot set up a loop device for {image}: {exc}") from exc
                time.sleep(random.uniform(0, 0.002))  # spread the racers out
        finally:
            os.close(control)
    finally:
        os.close(backing)
    raise BackendError(f"no free loop device for {image} in {_ATTACH_SECONDS:g} s: every one this host "
                       f"made was taken by another sandbox (see `losetup -a`)")
