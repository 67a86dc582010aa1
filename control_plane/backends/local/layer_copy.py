"""Copy a directory tree exactly, never following a link: a sandbox's writable layer, or its /tmp.

What a sandbox wrote is the sandbox's to shape: any entry may be a symlink to a host path, a
FIFO, a socket, a device node (overlay whiteouts are 0:0 character devices). Every step works
on directory descriptors opened with ``O_NOFOLLOW``, so a copy reads and writes only inside the
two trees, whatever the entries are. Kept: type, mode, owner, times (nanoseconds), extended
attributes (overlay's ``trusted.overlay.*``/``user.overlay.*`` opaque and whiteout marks), hard
links within the tree. In-process (no ``cp`` to start) because a fork copies while its parent is
frozen: the copy's cost is the parent's pause.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 30


class CopyError(Exception):
    pass


def open_dir(path: str | os.PathLike, dir_fd: int | None = None) -> int:
    """A descriptor of the directory ``path`` itself (``CopyError`` when it is a link or missing)."""
    try:
        return os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise CopyError(f"cannot open {path}: not a directory ({exc.strerror})") from exc


def is_empty(path: Path) -> bool:
    try:
        with os.scandir(path) as it:
            return next(it, None) is None
    except (FileNotFoundError, NotADirectoryError):
        return True


def copy_tree(src: str | os.PathLike, dst: str | os.PathLike, *, make_root: bool = True) -> int:
    """Copy the tree ``src`` to ``dst`` (created, or with ``make_root=False`` an existing empty
    directory whose own attributes are then left alone); returns the bytes of file data copied."""
    with _copying(src, dst, make_root) as (sfd, dfd, copier):
        copier.tree(sfd, dfd)
        if make_root:
            copier.attributes(sfd, dfd, None, os.fstat(sfd))
        return copier.bytes


OPAQUE = "y"


def underlay(src: str | os.PathLike, dst: str | os.PathLike, opaque_key: str) -> int:
    """Merge the overlay layer ``src`` under the layer ``dst``, so that ``dst`` alone shows what
    ``dst`` over ``src`` showed (overlayfs without redirects or metacopy, as sandboxes mount it):
    an entry of ``src`` is copied where ``dst`` has none; ``dst``'s own entries, whiteouts (0:0
    character devices) and opaque directories hide what ``src`` has below them; a directory of
    both is merged, and made opaque (``opaque_key``) where ``src`` hid what lies below it (its
    directory was opaque, or not a directory at all). Returns the bytes of file data copied."""
    if not os.path.lexists(dst):
        return copy_tree(src, dst)
    with _copying(src, dst) as (sfd, dfd, copier):
        copier.underlay(sfd, dfd, opaque_key)
        return copier.bytes


@contextmanager
def _copying(src: str | os.PathLike, dst: str | os.PathLike,
             make_dst: bool = False) -> Iterator[tuple[int, int, _Copier]]:
    """The two directories open (``dst`` made first with ``make_dst``) and a copier between
    them; all closed at the end."""
    sfd = open_dir(src)
    try:
        if make_dst:
            os.mkdir(dst, 0o700)
        dfd = open_dir(dst)
        copier = _Copier()
        try:
            yield sfd, dfd, copier
        finally:
            copier.close()
            os.close(dfd)
    finally:
        os.close(sfd)


def _opaque(path: str | int, key: str) -> bool:
    try:
        return os.getxattr(path, key) == OPAQUE.encode()
    except OSError:
        return False


class _Copier:
    def __init__(self) -> None:
        self.bytes = 0
        self.links: dict[tuple[int, int], tuple[int, str]] = {}  # (dev, ino) -> (dir fd, name) of the first copy
        self._kept: list[int] = []  # directory descriptors the link map still names

    def tree(self, sfd: int, dfd: int) -> None:
        with os.scandir(sfd) as it:
            names = [entry.name for entry in it]
        for name in names:
            self.entry(sfd, dfd, name)

    def underlay(self, sfd: int, dfd: int, opaque_key: str) -> None:
        with os.scandir(sfd) as it:
            names = [entry.name for entry in it]
        for name in names:
            try:
                mine = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                self.entry(sfd, dfd, name)
                continue
            if not stat.S_ISDIR(mine.st_mode):
                continue  # a file or a whiteout of the upper layer hides whatever is below
            below = os.stat(name, dir_fd=sfd, follow_symlinks=False)
            child_d = open_dir(name, dfd)
            try:
                if _opaque(child_d, opaque_key):
                    continue
                hides = not stat.S_ISDIR(below.st_mode)
                if not hides:
                    child_s = open_dir(name, sfd)
                    try:
                        self.underlay(child_s, child_d, opaque_key)
                        hides = _opaque(child_s, opaque_key)
                    finally:
                        os.close(child_s)
                if hides:  # what lay below the lower layer's entry stays hidden under the merge
                    os.setxattr(child_d, opaque_key, OPAQUE.encode())
            finally:
                os.close(child_d)

    def entry(self, sfd: int, dfd: int, name: str) -> None:
        st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            os.mkdir(name, 0o700, dir_fd=dfd)
            child_s = open_dir(name, sfd)
            try:
                child_d = open_dir(name, dfd)
                try:
                    self.tree(child_s, child_d)
                    self.attributes(child_s, child_d, None, st)
                finally:
                    os.close(child_d)
            finally:
                os.close(child_s)
            return
        if not stat.S_ISLNK(mode) and st.st_nlink > 1:
            first = self.links.get((st.st_dev, st.st_ino))
            if first is not None:
                os.link(first[1], name, src_dir_fd=first[0], dst_dir_fd=dfd, follow_symlinks=False)
                return
        if stat.S_ISREG(mode):
            self._file(sfd, dfd, name, st)
        else:
            if stat.S_ISLNK(mode):
                os.symlink(os.readlink(name, dir_fd=sfd), name, dir_fd=dfd)
            elif stat.S_ISFIFO(mode):
                os.mkfifo(name, 0o600, dir_fd=dfd)
            else:  # character/block devices (whiteouts), sockets
                os.mknod(name, stat.S_IFMT(mode) | 0o600, st.st_rdev, dir_fd=dfd)
            self.attributes(sfd, dfd, name, st)
        if not stat.S_ISLNK(mode) and st.st_nlink > 1:
            keep = os.dup(dfd)
            self._kept.append(keep)
            self.links[(st.st_dev, st.st_ino)] = (keep, name)

    def _file(self, sfd: int, dfd: int, name: str, st: os.stat_result) -> None:
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=sfd)
        try:
            dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                          dir_fd=dfd)
            try:
                left = st.st_size
                while left > 0:
                    try:
                        n = os.copy_file_range(src, dst, min(left, _CHUNK))
                    except OSError as exc:
                        if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                            raise
                        n = os.sendfile(dst, src, None, min(left, _CHUNK))
                    if n == 0:  # the file shrank meanwhile (only a frozen source is consistent)
                        break
                    left -= n
                    self.bytes += n
                # Through the two descriptors: a path through /proc/self/fd is looked up anew by each call.
                self.attributes(src, dst, None, st)
            finally:
                os.close(dst)
        finally:
            os.close(src)

    @staticmethod
    def attributes(sfd: int, dfd: int, name: str | None, st: os.stat_result) -> None:
        """Owner, extended attributes, mode and times of ``name`` in the two directories (None:
        of what the descriptors ``sfd`` and ``dfd`` are themselves)."""
        if name is None:
            src: int | str = sfd
            dst: int | str = dfd
            nofollow = True  # (descriptors take no follow_symlinks)
        else:  # the entry itself, never what a link names (the path is resolved in this namespace's /proc)
            src, dst, nofollow = f"/proc/self/fd/{sfd}/{name}", f"/proc/self/fd/{dfd}/{name}", False
        link = stat.S_ISLNK(st.st_mode)
        follow = True if name is None else nofollow
        if os.geteuid() == 0:
            os.chown(dst, st.st_uid, st.st_gid, follow_symlinks=follow)
        try:
            keys = os.listxattr(src, follow_symlinks=follow)
        except OSError as exc:
            if exc.errno not in (errno.ENOTSUP, errno.EPERM):
                raise
            keys = []
        for key in keys:
            try:
                os.setxattr(dst, key, os.getxattr(src, key, follow_symlinks=follow), follow_symlinks=follow)
            except OSError as exc:
                if exc.errno not in (errno.ENOTSUP, errno.EPERM) or key.startswith(("trusted.", "user.overlay.")):
                    raise CopyError(f"cannot copy the extended attribute {key} of {name or '.'}: {exc.strerror}"
                                    ) from exc
        if not link:
            os.chmod(dst, stat.S_IMODE(st.st_mode))  # never a link: ours, just made
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=follow)

    def close(self) -> None:
        for fd in self._kept:
            os.close(fd)
        self._kept.clear()
        self.links.clear()
