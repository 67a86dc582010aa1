"""The project directory and its pristine copy: populate at start, restore on reset.

Two ways to restore, picked at start-up:

* ``OverlayProject`` — the project is an overlay mount whose lower layer is the pristine tree;
  reset unmounts, empties the upper layer and mounts again. Cost follows what the agent changed.
  Needs mount rights (root, or root in the sandbox's user namespace). A sandbox forked from
  another (the control plane's fork) starts from its parent's frozen project layers stacked
  over the pristine tree (named in ``<layer>/fork-layers.json``); a reset goes back to the
  pristine tree, or with ``to_fork_point`` to those layers: the project as it was at the fork.
* ``CopyProject`` — anywhere else. A manifest records each entry's (inode, ctime) after the
  last restore; ctime cannot be set from user space, so an entry whose pair is unchanged is
  byte-identical, and only the others are copied back. Exact, and cheap when little changed.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


class ProjectError(Exception):
    pass


class Project(Protocol):
    path: Path
    pristine: Path  # the tree a reset restores (read-only to tools)

    def reset(self, to_fork_point: bool = False) -> int:
        """Restore the project to its pristine state (or, forked, to the fork point); returns how
        many entries were restored."""


def prepare_pristine(source: Path | None, project: Path, private_dir: Path) -> tuple[Path, bool]:
    """Return a pristine tree for ``project`` and whether ``project`` now equals it.

    ``project`` is populated from ``source`` when it is empty.

    ``source`` may be a directory, a ``.tar(.gz|.bz2|.xz)``/``.tgz`` or a ``.zip`` archive (a single
    top-level directory in an archive is stripped, as the original image builder does). Without a
    source, the current content of ``project`` becomes the pristine copy.
    """
    project.mkdir(parents=True, exist_ok=True)
    if source is not None and not source.exists():
        raise ProjectError(f"project source {source} does not exist; pass a directory or a .tar.gz/.zip archive")
    if source is None:
        pristine = private_dir / "pristine"
        _copy_tree(project, pristine)
        return pristine, True
    if source.is_dir():
        pristine = source
    else:
        pristine = private_dir / "pristine"
        extract_archive(source, pristine)
    if any(project.iterdir()):
        return pristine, False
    _copy_tree(pristine, project)
    return pristine, True


def _copy_tree(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        shutil.rmtree(dst)
    # cp keeps modes, times, symlinks and uses reflinks where the filesystem has them.
    subprocess.run(["cp", "-a", "--reflink=auto", f"{src}/.", str(dst)], check=True, capture_output=True)


def extract_archive(archive: Path, dst: Path) -> None:
    """Unpack a .tar(.gz|.bz2|.xz)/.tgz/.zip into ``dst``, stripping a single top-level directory."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dst.parent))
    try:
        name = archive.name.lower()
        if name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(tmp)
        elif name.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")):
            with tarfile.open(archive) as tf:
                tf.extractall(tmp, filter="data")
        else:
            raise ProjectError(f"{archive}: unknown archive type; use .tar.gz, .tgz, .tar or .zip")
        entries = list(tmp.iterdir())
        root = entries[0] if len(entries) == 1 and entries[0].is_dir() else tmp
        if dst.exists():
            shutil.rmtree(dst)
        root.rename(dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- copy-based restore ---------------------------------------------------------------------------

Stamp = tuple[int, int, int]  # (inode, ctime_ns, mode)


def _scan(root: Path) -> dict[str, Stamp]:
    found: dict[str, Stamp] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(root / rel if rel else root) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                key = f"{rel}/{entry.name}" if rel else entry.name
                found[key] = (st.st_ino, st.st_ctime_ns, st.st_mode)
                if stat.S_ISDIR(st.st_mode):
                    stack.append(key)
    return found


class CopyProject:
    def __init__(self, path: Path, pristine: Path, identical: bool = True) -> None:
        self.path = path
        self.pristine = pristine
        self._pristine_entries = _scan(pristine)
        # Only entries known to equal the pristine copy may be skipped by the first reset.
        self._manifest = _scan(path) if identical else {}
        self._root_stamp = _root_stamp(path)

    def reset(self, to_fork_point: bool = False) -> int:
        if to_fork_point:
            raise ProjectError("this sandbox's project is a copy, not an overlay: it was not forked and has no "
                               "fork point (reset without to_fork_point)")
        root = self.path
        if not root.is_dir() or root.is_symlink():
            _remove(root)
            _copy_tree(self.pristine, root)
            self._manifest, self._root_stamp = _scan(root), _root_stamp(root)
            return len(self._manifest)
        pst = self.pristine.stat()
        if self._root_stamp != _root_stamp(root):
            os.chmod(root, stat.S_IMODE(pst.st_mode))
        current = _scan(root)
        restored = 0
        # Remove what is new or changed (deepest first), then copy back what is missing.
        for rel in sorted(current, key=lambda r: r.count("/"), reverse=True):
            stamp = current[rel]
            want = self._pristine_entries.get(rel)
            unchanged = self._manifest.get(rel) == stamp and want is not None
            if unchanged:
                continue
            if want is not None and stat.S_ISDIR(stamp[2]) and stat.S_ISDIR(want[2]):
                # A directory whose own entry changed (a file added or removed in it): its
                # children are handled one by one; only its mode needs restoring.
                os.chmod(root / rel, stat.S_IMODE(want[2]))
                continue
            _remove(root / rel)
            restored += 1
        for rel in sorted(self._pristine_entries, key=lambda r: r.count("/")):
            target = root / rel
            if os.path.lexists(target):
                continue
            _copy_entry(self.pristine / rel, target)
            restored += 1
        self._manifest = _scan(root)
        self._root_stamp = _root_stamp(root)
        return restored


def _root_stamp(path: Path) -> tuple[int, int]:
    st = path.lstat()
    return (st.st_ino, st.st_mode)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _copy_entry(src: Path, dst: Path) -> None:
    st = src.lstat()
    if stat.S_ISDIR(st.st_mode):
        dst.mkdir()
        shutil.copystat(src, dst, follow_symlinks=False)
    elif stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src), dst)
    else:
        shutil.copy2(src, dst, follow_symlinks=False)
    if os.geteuid() == 0:
        os.lchown(dst, st.st_uid, st.st_gid)


# -- overlay restore --------------------------------------------------------------------------------


FORK_LAYERS = "fork-layers.json"  # in the layer directory: the fork's project layers, top first
_LAYER_PATH = re.compile(r"^/[A-Za-z0-9_.@+-]+(/[A-Za-z0-9_.@+-]+)*$")  # nothing an overlay option could split


def fork_layers(layer: Path) -> list[Path]:
    """The read-only project layers a forked sandbox started from (``[]`` when it was not forked)."""
    try:
        names = json.loads((layer / FORK_LAYERS).read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise ProjectError(f"unreadable {layer / FORK_LAYERS}: {exc}") from exc
    if not isinstance(names, list) or not all(isinstance(n, str) and _LAYER_PATH.match(n) and ".." not in n
                                                  for n in names):
        raise ProjectError(f"{layer / FORK_LAYERS} must list absolute directory paths")
    return [Path(n) for n in names]


class OverlayProject:
    """The project as an overlay mount over a read-only pristine tree (and, forked, the fork's layers)."""

    def __init__(self, path: Path, lower: Path, layer: Path) -> None:
        self.path = path
        self.lower = lower
        self.pristine = lower
        self.layer = layer
        self.path.mkdir(parents=True, exist_ok=True)
        self._mount(fork_layers(layer))

    def _options(self, forks: list[Path]) -> str:
        lowers = ":".join(str(p) for p in [*forks, self.lower])
        opts = f"lowerdir={lowers},upperdir={self.layer}/upper,workdir={self.layer}/work"
        return opts + (",userxattr" if _in_child_userns() else "")

    def _mount(self, forks: list[Path]) -> None:
        upper = self.layer / "upper"
        fresh = not upper.exists()
        for sub in ("upper", "work"):
            (self.layer / sub).mkdir(parents=True, exist_ok=True)
        if fresh:
            # The overlay's root directory takes its owner and mode from the upper directory: a
            # new upper must look like the pristine root, or a root-run server would hand the
            # project root to root after a reset.
            st = (forks[0] if forks else self.lower).stat()
            if os.geteuid() == 0:
                os.chown(upper, st.st_uid, st.st_gid)
            os.chmod(upper, stat.S_IMODE(st.st_mode))
            os.utime(upper, ns=(st.st_atime_ns, st.st_mtime_ns))
        with _no_symlink(self.path) as target:
            if _libc.mount(b"overlay", target, b"overlay", 0, self._options(forks).encode()) != 0:
                err = ctypes.get_errno()
                raise ProjectError(f"cannot mount the project overlay on {self.path}: {os.strerror(err)}")

    def reset(self, to_fork_point: bool = False) -> int:
        forks = fork_layers(self.layer) if to_fork_point else []
        upper = self.layer / "upper"
        changed = sum(1 for _ in upper.rglob("*")) if upper.exists() else 0
        with _no_symlink(self.path) as target:
            if _libc.umount2(target, MNT_DETACH) != 0:
                err = ctypes.get_errno()
                raise ProjectError(f"cannot unmount the project overlay: {os.strerror(err)}")
        for sub in ("upper", "work"):
            shutil.rmtree(self.layer / sub, ignore_errors=True)
        self._mount(forks)
        return changed

    def close(self) -> None:
        try:
            with _no_symlink(self.path) as target:
                _libc.umount2(target, MNT_DETACH)
        except ProjectError:
            pass


@contextlib.contextmanager
def _no_symlink(path: Path) -> Iterator[bytes]:
    """A mount target that is ``path`` itself, never what a symlink put there leads to.

    Root tools may replace the project directory (or rename its parent) to aim the server's
    mount calls, which run with capabilities the tools lack, at another mount such as the
    read-only /proc/sys; mounting through an ``O_PATH | O_NOFOLLOW`` descriptor hits only a
    real directory.
    """
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ProjectError(f"the project directory {path} is not a directory (a symlink?): {exc.strerror}") from exc
    try:
        yield f"/proc/self/fd/{fd}".encode()
    finally:
        os.close(fd)


def _in_child_userns() -> bool:
    try:
        return Path("/proc/self/uid_map").read_text().split() != ["0", "0", "4294967295"]
    except OSError:
        return False
