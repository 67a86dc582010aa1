"""Sandbox layers under one mount per space, so that a launch drops all of them at once.

Each launch copies the host's mounts (``bwrap.spawn``) and bubblewrap's monitor keeps that
copy for the sandbox's life; a copy must not hold the other sandboxes' layers (their loop
devices and disk space would stay taken after they are deleted). Unmounting them one by one
cost a launch N unmounts with N sandboxes live (0.6 s at 1,000: starts slowed with every one
live). Instead the space's directory is a bind mount of itself on the host (``held``) with
every layer below it, and a launch replaces that mount in its copy by a clone without what is
mounted below (``drop_other_layers``): one unmount, whatever the number of sandboxes.

The bind is removed once nothing is mounted below it (``release``: after a delete, or by the
last lease monitor of a control plane that died).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandbox_server.polling import wait_until

from . import mount_api, mounts

_libc = ctypes.CDLL(None, use_errno=True)
_STATX_ATTR_MOUNT_ROOT = 0x2000
_AT_SYMLINK_NOFOLLOW = 0x100
_lock = threading.Lock()  # a bind is never released between its check and a layer mounted below it


def is_mount_root(path: str | os.PathLike) -> bool:
    """Whether ``path`` is where a mount is attached (in the calling thread's mount namespace)."""
    buf = ctypes.create_string_buffer(256)  # struct statx
    if _libc.statx(-100, os.fsencode(path), _AT_SYMLINK_NOFOLLOW, 0, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"statx {path}: {os.strerror(err)}")
    attributes = int.from_bytes(buf.raw[8:16], "little")
    return bool(attributes & _STATX_ATTR_MOUNT_ROOT)


@contextlib.contextmanager
def held(root: Path) -> Iterator[None]:
    """``root`` (a space's directory) a mount of its own while the block mounts a layer below it.
    Not while layers an earlier version mounted without it are below: a bind would hide them
    (and their deletes would miss them); launches unmount those one by one until they are gone."""
    with _lock:
        if not is_mount_root(root) and not mounts.mounts_under(root):
            mounts.mount(root, root, None, mounts.MS_BIND)
            mounts.mount(None, root, None, mounts.MS_PRIVATE)  # nothing below it propagates elsewhere
        yield


def release(root: Path, wait: float = 0.0) -> None:
    """Remove the bind of ``root`` once it holds nothing (a plain unmount fails while anything
    holds a file below it: a lease monitor of a sandbox deleted a moment ago may, so ``wait``
    seconds at most for that); a mount of ``root`` that is not such a bind (a disk) stays."""

    def settled() -> bool:
        with _lock:
            with os.scandir(root) if os.path.isdir(root) else contextlib.nullcontext(iter(())) as entries:
                if next(entries, None) is not None:
                    return True  # a sandbox's directory is left: the delete of the last one releases it
            point = _mounts().get(str(root))
            if point is None or not point.self_bind:
                return True
            try:
                mounts.umount(root, detach=False)
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                return False
            return True

    if not settled() and wait > 0:
        wait_until(settled, wait)


@dataclass
class _Mount:
    id: int
    parent: int
    fs_root: str
    point: str
    self_bind: bool = False


def _mounts() -> dict[str, _Mount]:
    """This mount namespace's mounts by mount point (the topmost where several are stacked)."""
    by_id: dict[int, _Mount] = {}
    with open("/proc/thread-self/mountinfo", "rb") as fh:
        for line in fh:
            fields = line.split(b" ", 5)
            found = _Mount(int(fields[0]), int(fields[1]), mounts.unescape(fields[3].decode()),
                           mounts.unescape(fields[4].decode()))
            by_id[found.id] = found
    out: dict[str, _Mount] = {}
    for found in by_id.values():
        parent = by_id.get(found.parent)
        # a directory bound on itself: its path in its filesystem ends with its mount point's name
        found.self_bind = (parent is not None and found.fs_root != "/"
                           and found.point.endswith(found.fs_root.rstrip("/")))
        out[found.point] = found
    return out


def drop_other_layers(own: Path) -> None:
    """In a private mount namespace: no sandbox's layers (``…/sandboxes/<name>/layers``, of any
    state directory) but ``own`` mounted. A space's bind is swapped for a clone without what is
    mounted below it (one unmount for all its layers); layers not below such a bind (a control
    plane of an earlier version) are unmounted one by one."""
    mine = str(own)
    table = _mounts()
    layers = [m for m in table.values() if m.point.endswith("/layers") and "/sandboxes/" in m.point]
    by_id = {m.id: m for m in table.values()}
    parents: dict[str, _Mount] = {}
    singles = []
    for layer in layers:
        parent = by_id.get(layer.parent)
        if parent is not None and parent.point == layer.point.rsplit("/", 2)[0]:
            parents[parent.point] = parent
        elif layer.point != mine:
            singles.append(layer.point)
    kept = mount_api.clone(mine, recursive=False) if mine in table else -1
    try:
        for root in parents:
            try:
                clone = mount_api.clone(root, recursive=False)  # the space's directory, nothing below it
            except FileNotFoundError:
                # Listed but out of reach: covered by a mount of this namespace (a control plane
                # with a private /tmp lists another's spaces under the host's /tmp). What cannot
                # be reached by its path cannot be unmounted by it either; its layers are tried
                # one by one, as any layer not below a space's bind.
                singles += [m.point for m in layers if by_id.get(m.parent) is parents[root]]
                continue
            try:
                mounts.umount(root, detach=True)
                mount_api.attach(clone, root)
            finally:
                os.close(clone)
        for point in sorted(singles, key=lambda p: p.count("/"), reverse=True):
            try:
                mounts.umount(point, detach=True)
            except OSError:
                pass
        if kept >= 0 and not is_mount_root(own):
            mount_api.attach(kept, own)
    finally:
        if kept >= 0:
            os.close(kept)
