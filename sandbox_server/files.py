"""File tools: create, edit, patch, chunked upload and download, listing.

Every path is resolved against the project directory, symlinks included, and must land inside
one of the allowed roots; the operation itself then runs with the tool user's filesystem
identity (``setfsuid``), so a tool can never touch what the agent's own shell could not.
"""

from __future__ import annotations

import binascii
import contextlib
import ctypes
import itertools
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from diff_match_patch import diff_match_patch

from .errors import BadRequest, Conflict, Forbidden, Unprocessable, from_os_error
from .users import UserSpec

MAX_CHUNK = 16 << 20
Entry = tuple[str, str, int | None]  # a listed entry: its path under the directory, its kind, a file's size
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_libc = ctypes.CDLL(None, use_errno=True)


class FileTools:
    def __init__(self, project: Path, roots: list[Path], user: UserSpec) -> None:
        self.project = project
        self.roots = [Path(os.path.realpath(r)) for r in roots]
        self.user = user
        self._switch = os.geteuid() == 0 and user.uid != 0

    # -- paths and identity -------------------------------------------------------------------

    def resolve(self, file_path: str, field: str = "file_path") -> Path:
        if not file_path:
            raise Unprocessable.field(["body", field], "must not be empty", file_path)
        if "\x00" in file_path:
            raise Unprocessable.field(["body", field], "must not contain a NUL byte", file_path)
        raw = Path(file_path)
        path = raw if raw.is_absolute() else self.project / raw
        real = Path(os.path.realpath(path))
        if not any(real == root or real.is_relative_to(root) for root in self.roots):
            allowed = ", ".join(map(str, self.roots))
            raise Forbidden(
                f"{file_path}: resolves to {real}, outside the directories the file tools may touch "
                f"({allowed}); use a path inside the project"
            )
        return real

    @contextlib.contextmanager
    def as_user(self) -> Iterator[None]:
        """Run filesystem calls with the tool user's fsuid/fsgid (thread-local in Linux)."""
        if not self._switch:
            yield
            return
        _libc.setfsgid(self.user.gid)
        _libc.setfsuid(self.user.uid)
        try:
            yield
        finally:
            _libc.setfsuid(0)
            _libc.setfsgid(0)

    @contextlib.contextmanager
    def _os_errors(self, shown: str) -> Iterator[None]:
        try:
            with self.as_user():
                yield
        except OSError as exc:
            raise from_os_error(exc, shown) from exc

    def _mkparents(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)

    def _read_text(self, path: Path, shown: str) -> str:
        data = _read_all(path)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadRequest(
                f"{shown}: not UTF-8 text (byte {exc.start}); use tools/file/upload for binary files"
            ) from exc

    # -- operations ---------------------------------------------------------------------------

    def create(self, file_path: str, content: str) -> None:
        path = self.resolve(file_path)
        with self._os_errors(file_path):
            self._mkparents(path)
            _write_all(path, content.encode("utf-8"))

    def edit(self, file_path: str, start: int, end: int, new_content: str) -> None:
        """Replace lines ``start..end`` (1-based, inclusive) with ``new_content``.

        ``start = end + 1`` inserts before line ``start``; an empty ``new_content`` deletes the
        range. Line endings of the untouched lines are kept byte for byte.
        """
        if start < 1:
            raise Unprocessable.field(["body", "start_line"], "lines are numbered from 1", start)
        if end < start - 1:
            raise Unprocessable.field(
                ["body", "end_line"],
                f"end_line {end} is before start_line {start}; use end_line = start_line - 1 to insert",
                end,
            )
        path = self.resolve(file_path)
        with self._os_errors(file_path):
            lines = self._read_text(path, file_path).splitlines(keepends=True)
            if start > len(lines) + 1:
                raise Unprocessable.field(
                    ["body", "start_line"], f"the file has only {len(lines)} lines", start
                )
            replacement = []
            if new_content:
                replacement = [new_content if new_content.endswith("\n") else new_content + "\n"]
            if start > 1 and lines[start - 2] and not lines[start - 2].endswith(("\n", "\r")):
                lines[start - 2] += "\n"  # appending after a last line without newline
            _write_all(path, "".join(lines[: start - 1] + replacement + lines[end:]).encode("utf-8"))

    def patch(self, file_path: str, patch_text: str) -> None:
        if not patch_text.strip():
            raise Unprocessable.field(["body", "patch"], "patch is empty: nothing to apply", patch_text)
        dmp = diff_match_patch()
        try:
            patches = dmp.patch_fromText(patch_text)
        except ValueError as exc:
            raise Unprocessable.field(
                ["body", "patch"], f"not diff-match-patch patch text ({exc}); produce it with "
                "patch_toText(patch_make(old, new))", patch_text[:200]
            ) from exc
        path = self.resolve(file_path)
        with self._os_errors(file_path):
            text = self._read_text(path, file_path)
            headers = [str(p).split("\n", 1)[0] for p in patches]
            new_text, applied = dmp.patch_apply(patches, text)
            bad = [i for i, ok in enumerate(applied) if not ok]
            failed = [{"hunk": i + 1, "header": headers[i]} for i in bad]
            if failed:
                raise Conflict(
                    f"{file_path}: {len(failed)} of {len(applied)} hunks did not apply "
                    f"({', '.join(headers[i] for i in bad)}); the file was left unchanged",
                    {"failed_hunks": failed},
                )
            _write_all(path, new_text.encode("utf-8"))

    def upload(self, file_path: str, content_base64: str, offset: int, truncate: bool) -> tuple[int, int]:
        try:
            data = binascii.a2b_base64(content_base64.encode("ascii"), strict_mode=True)
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise Unprocessable.field(
                ["body", "content_base64"], f"not standard base64 with padding ({exc})", content_base64[:64]
            ) from exc
        path = self.resolve(file_path)
        with self._os_errors(file_path):
            self._mkparents(path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
            try:
                written = 0
                while written < len(data):
                    written += os.pwrite(fd, data[written:], offset + written)
                if truncate:
                    os.ftruncate(fd, offset + len(data))
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
        return len(data), size

    def download(self, file_path: str, offset: int, length: int) -> tuple[bytes, int]:
        path = self.resolve(file_path)
        with self._os_errors(file_path):
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                st = os.fstat(fd)
                if not _is_regular(st.st_mode):
                    raise IsADirectoryError(21, "not a regular file")
                want = min(length, MAX_CHUNK, max(st.st_size - offset, 0))
                chunks, got = [], 0
                while got < want:
                    block = os.pread(fd, want - got, offset + got)
                    if not block:
                        break
                    chunks.append(block)
                    got += len(block)
                return b"".join(chunks), st.st_size
            finally:
                os.close(fd)

    def list_dir(self, file_path: str, depth: int, max_entries: int) -> tuple[list[Entry], bool]:
        """The entries under a directory down to ``depth`` levels, sorted by name, at most
        ``max_entries`` of them; and whether there were more. Directories are entered by file
        descriptor and without following symbolic links, so the walk stays where it began."""
        top = self.resolve(file_path)
        with self._os_errors(file_path):
            if not stat.S_ISDIR(os.lstat(top).st_mode):
                raise BadRequest(f"{file_path}: not a directory; read a file with read_file (tools/file/download)")
            fd = os.open(top, _DIRECTORY)
            try:
                entries: list[Entry] = []
                return entries, _list_dir(fd, "", depth, max_entries, entries)
            finally:
                os.close(fd)


def _list_dir(fd: int, prefix: str, depth: int, limit: int, out: list[Entry]) -> bool:
    """Append the entries of the directory ``fd`` (and of its directories, ``depth`` levels down)
    to ``out``; True when ``limit`` entries cut the listing short."""
    room = limit - len(out)
    with os.scandir(fd) as it:
        found = list(itertools.islice(it, room + 1))  # a directory of a million entries is not read whole
    cut = len(found) > room
    for entry in sorted(found, key=lambda e: e.name)[:room]:
        if len(out) >= limit:
            return True
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:  # gone since it was read
            continue
        kind = ("directory" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode)
                else "symlink" if stat.S_ISLNK(st.st_mode) else "other")
        out.append((prefix + entry.name, kind, st.st_size if kind == "file" else None))
        if kind != "directory" or depth <= 1:
            continue
        try:
            child = os.open(entry.name, _DIRECTORY, dir_fd=fd)
        except OSError:  # unreadable by the tool user, or replaced since: listed, not entered
            continue
        try:
            if _list_dir(child, f"{prefix}{entry.name}/", depth - 1, limit, out):
                return True
        finally:
            os.close(child)
    return cut


def _is_regular(mode: int) -> bool:
    return stat.S_ISREG(mode)


def _read_all(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        if not _is_regular(os.fstat(fd).st_mode):
            raise IsADirectoryError(21, "Is a directory")
        chunks = []
        while block := os.read(fd, 1 << 20):
            chunks.append(block)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _write_all(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
