"""The upload format: a directory packed as a deterministic tar, named by its SHA-256.

Shared by the client (which packs) and the control plane (which checks and unpacks); standard
library only, so a client imports nothing else of the control plane for it.

The same tree gives the same bytes on any machine: entries sorted by path, owners 0 and
nameless, times 0, modes 0755 (directories, files with the owner's execute bit) or 0644,
symlinks as links (their target as written), hard links as plain files. Sockets, FIFOs and
devices are left out, and so are the caches a run leaves behind (``__pycache__``, ``*.pyc``…):
the same set the task content hash ignores. A symlink must stay inside the tree (a relative
target that does not climb out of it): the control plane copies trees as they are, and a link
to ``/etc`` would put the host's files in an image.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import re
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
REFERENCE_PREFIX = "upload:"  # a build YAML's ``context: upload:sha256:…``
IGNORED_NAMES = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".DS_Store"})
IGNORED_SUFFIXES = (".pyc", ".pyo")
DIR_MODE, EXEC_MODE, FILE_MODE = 0o755, 0o755, 0o644
_CHUNK = 1 << 20


class PackError(ValueError):
    """A tree that cannot be packed or unpacked as it is; the message names the entry."""


def ignored(name: str) -> bool:
    return name in IGNORED_NAMES or name.endswith(IGNORED_SUFFIXES)


def check_digest(text: str) -> str:
    """``text`` if it is an upload's name (``sha256:`` and 64 lowercase hex digits)."""
    if not isinstance(text, str) or not DIGEST.fullmatch(text):
        raise ValueError(f"{text!r} is not an upload digest: expected 'sha256:' and 64 lowercase hex digits")
    return text


def link_inside(rel: str, target: str) -> bool:
    """Whether a symlink at ``rel`` (a path in the tree) pointing at ``target`` stays inside it."""
    if not target or target.startswith("/") or "\0" in target:
        return False
    depth = 0
    for part in posixpath.dirname(rel).split("/") + target.split("/"):
        if part in ("", "."):
            continue
        depth = depth - 1 if part == ".." else depth + 1
        if depth < 0:
            return False
    return True


def check_name(rel: str) -> str:
    """``rel`` if it is a relative path in a tree: no absolute path, no ``..``, no empty part."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\0" in rel or any(p in ("", ".", "..") for p in parts):
        raise PackError(f"entry {rel!r}: not a plain relative path inside the tree")
    return rel


@dataclass(frozen=True)
class Entry:
    rel: str
    kind: str  # "dir" | "file" | "link"
    mode: int
    size: int = 0
    target: str = ""


def entries(root: Path) -> Iterator[tuple[Entry, Path]]:
    """The entries of the tree under ``root``, sorted by path (what ``pack`` writes)."""
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not ignored(d))
        for name in dirnames + [f for f in filenames if not ignored(f)]:
            found.append(((here / name).relative_to(root).as_posix(), here / name))
    for rel, path in sorted(found):
        try:
            rel.encode("utf-8")
        except UnicodeEncodeError:
            raise PackError(f"{path}: the file name is not UTF-8") from None
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(path)
            if not link_inside(rel, target):
                raise PackError(f"{path}: the symlink points outside the tree ({target!r}); the control plane "
                                "takes only links that stay inside it (make it relative, or copy what it names)")
            yield Entry(rel, "link", 0o777, target=target), path
        elif stat.S_ISDIR(st.st_mode):
            yield Entry(rel, "dir", DIR_MODE), path
        elif stat.S_ISREG(st.st_mode):
            yield Entry(rel, "file", EXEC_MODE if st.st_mode & stat.S_IXUSR else FILE_MODE, st.st_size), path


def fingerprint(root: Path) -> str:
    """What the tree's files say about themselves (paths, kinds, sizes, modes, times, inodes): an
    unchanged fingerprint means an unchanged tree, so its digest need not be computed again."""
    digest = hashlib.sha256(str(root.resolve()).encode() + b"\0")
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            digest.update(f"{dirpath}/{name}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0"
                          f"{st.st_ino}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


class Sink(Protocol):
    """Where a packed tree goes: a file, a gzip stream…"""

    def write(self, data: bytes, /) -> object: ...


class _Hashing(io.RawIOBase):
    """A writer that hashes and counts what goes through it."""

    def __init__(self, out: Sink | None) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.sha.update(data)
        self.size += len(data)
        if self.out is not None:
            self.out.write(data)
        return len(data)


@dataclass(frozen=True)
class Packed:
    digest: str
    size: int  # bytes of the tar
    files: int  # entries


def _info(entry: Entry) -> tarfile.TarInfo:
    info = tarfile.TarInfo(entry.rel)
    info.mode, info.uid, info.gid, info.uname, info.gname, info.mtime = entry.mode, 0, 0, "", "", 0
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
    elif entry.kind == "link":
        info.type, info.linkname = tarfile.SYMTYPE, entry.target
    else:
        info.size = entry.size
    return info


def pack(root: Path, out: Sink | None = None, *, max_bytes: int | None = None) -> Packed:
    """Write the tree under ``root`` to ``out`` (None: only name it) and return its digest.
    ``max_bytes`` stops early (``PackError``) once the tar would be larger."""
    if not root.is_dir():
        raise PackError(f"{root} is not a directory")
    sink = _Hashing(out)
    count = 0
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT, encoding="utf-8") as tar:
        for entry, path in entries(root):
            info = _info(entry)
            if entry.kind == "file":
                with open(path, "rb") as f:
                    if os.fstat(f.fileno()).st_size != entry.size:
                        raise PackError(f"{path} changed while it was packed; pack again")
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
            count += 1
            if max_bytes is not None and sink.size > max_bytes:
                raise PackError(f"{root} packs to more than {max_bytes} bytes")
    return Packed("sha256:" + sink.sha.hexdigest(), sink.size, count)


@dataclass
class PackLimits:
    max_bytes: int  # of the tar (the files' bytes, headers and padding)
    max_files: int


def unpack(archive: BinaryIO, dest: Path, limits: PackLimits) -> tuple[int, int]:
    """Unpack a tar made by ``pack`` into the empty directory ``dest``, refusing what ``pack``
    never writes: absolute paths, ``..``, links that leave the tree or hard links, devices, a
    path under a symlink, more than ``limits``. Files get only the modes ``pack`` gives. Returns
    (files, bytes of file content). Raises ``PackError`` naming the first bad entry."""
    files = content = 0
    links: set[str] = set()
    seen: set[str] = set()
    try:
        tar = tarfile.open(fileobj=archive, mode="r|", encoding="utf-8", errors="strict")
    except tarfile.TarError as exc:
        raise PackError(f"not a tar archive: {exc}") from None
    with tar:
        try:
            for member in tar:
                rel = check_name(member.name.rstrip("/") if member.isdir() else member.name)
                files += 1
                if files > limits.max_files:
                    raise PackError(f"more than {limits.max_files} entries")
                if rel in seen:
                    raise PackError(f"entry {rel!r} appears twice")
                seen.add(rel)
                parents = rel.split("/")[:-1]
                for i in range(len(parents)):
                    if "/".join(parents[:i + 1]) in links:
                        raise PackError(f"entry {rel!r} lies under a symlink")
                path = dest / rel
                if not path.parent.is_dir() or path.parent.is_symlink():
                    raise PackError(f"entry {rel!r} comes before its directory")
                if member.isdir():
                    path.mkdir(mode=DIR_MODE)
                    os.chmod(path, DIR_MODE)
                elif member.issym():
                    if not link_inside(rel, member.linkname):
                        raise PackError(f"symlink {rel!r} -> {member.linkname!r} leaves the tree")
                    os.symlink(member.linkname, path)
                    links.add(rel)
                elif member.isreg():
                    content += member.size
                    if content > limits.max_bytes:
                        raise PackError(f"the files hold more than {limits.max_bytes} bytes")
                    source = tar.extractfile(member)
                    assert source is not None
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 FILE_MODE)
                    with os.fdopen(fd, "wb") as f:
                        while chunk := source.read(_CHUNK):
                            f.write(chunk)
                        os.fchmod(f.fileno(), EXEC_MODE if member.mode & stat.S_IXUSR else FILE_MODE)
                else:
                    kind = "hard link" if member.islnk() else "device, FIFO or other special file"
                    raise PackError(f"entry {rel!r} is a {kind}: uploads hold files, directories and symlinks only")
        except tarfile.TarError as exc:
            raise PackError(f"the archive is malformed: {exc}") from None
        except UnicodeDecodeError:
            raise PackError("an entry's name is not UTF-8") from None
    return files, content
