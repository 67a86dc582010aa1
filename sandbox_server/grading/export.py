"""``POST /api/project/export``: the agent's editable files, read without trusting the tree.

The project is the agent's: it may hold symlinks (to the hidden tests, to ``/proc``), FIFOs,
deep or huge trees. Nothing is followed: directories are walked without following links,
files are opened with ``O_NOFOLLOW | O_NONBLOCK`` and kept only when regular, and the walk stops
at ``max_files`` entries and ``max_bytes`` bytes (a 413 then: an agent that floods the tree
gets no grade, not a partial one that may pass).
"""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

from ..errors import PayloadTooLarge
from . import paths
from .models import ExportedFile, ExportRequest, ExportResponse, Skipped


def walk(root: Path, limit: int) -> dict[str, os.stat_result]:
    """Every entry under ``root`` (project-relative path → lstat), caches and VCS dirs skipped."""
    found: dict[str, os.stat_result] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            entries = list(os.scandir(root / rel if rel else root))
        except OSError:
            continue
        for entry in entries:
            path = f"{rel}/{entry.name}" if rel else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if not paths.skipped_dir(entry.name):
                    stack.append(path)
                continue
            found[path] = st
            if len(found) > limit:
                raise PayloadTooLarge(f"the project has more than {limit} files to consider for grading; remove "
                               "what the task does not need (build output, downloads) and submit again")
    return found


def _read(root: Path, rel: str, limit: int) -> bytes | None:
    try:
        fd = os.open(root / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        chunks, got = [], 0
        while got <= limit:
            block = os.read(fd, 1 << 20)
            if not block:
                break
            chunks.append(block)
            got += len(block)
        return b"".join(chunks) if got <= limit else None
    finally:
        os.close(fd)


def export(project: Path, pristine: Path | None, req: ExportRequest) -> ExportResponse:
    current = walk(project, req.max_files)
    original = walk(pristine, req.max_files) if pristine is not None else {}
    globs = tuple(req.editable or ())
    # the pristine project's regular files, and the task's starting files (written at reset)
    pristine_files = {p for p, st in original.items() if stat.S_ISREG(st.st_mode)} | set(req.starting)

    def editable(path: str) -> bool:
        if paths.under(path, req.protected) or paths.denied(path, globs):
            return False
        if globs:
            return paths.matches(path, globs)
        return path in pristine_files

    out = ExportResponse()
    for path in sorted(current):
        if not editable(path):
            continue
        st = current[path]
        if not stat.S_ISREG(st.st_mode):
            kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            out.skipped.append(Skipped(path=path, reason=f"{kind}: only regular files are graded"))
            continue
        data = _read(project, path, req.max_bytes - out.total_bytes)
        if data is None:
            if st.st_size > req.max_bytes - out.total_bytes:
                raise PayloadTooLarge(f"the editable files exceed {req.max_bytes} bytes (at {path}); remove large "
                               "files the task does not need and submit again")
            out.skipped.append(Skipped(path=path, reason="could not be read as a regular file"))
            continue
        out.total_bytes += len(data)
        out.files.append(ExportedFile(path=path, content_base64=base64.b64encode(data).decode("ascii"),
                                   executable=bool(st.st_mode & stat.S_IXUSR)))
    exported = {f.path for f in out.files}
    out.deleted = sorted(p for p in pristine_files if editable(p) and p not in exported)
    _drop_shadowing_modules(out, pristine_files)
    return out


def _drop_shadowing_modules(out: ExportResponse, pristine_files: set[str]) -> None:
    """Leave out new modules that would shadow the standard library or an installed package
    (``paths.module_name``), judged on the graded tree (pristine files but the deleted ones, and
    what is exported); a left-out ``__init__.py`` can unmake a package, so again until none is."""
    protected = paths.protected_modules()
    while True:
        graded = (pristine_files - set(out.deleted)) | {f.path for f in out.files}
        shadowing = {f.path: name for f in out.files if f.path not in pristine_files
                     and (name := paths.module_name(f.path, graded)) in protected}
        if not shadowing:
            return
        for path, name in sorted(shadowing.items()):
            out.skipped.append(Skipped(path=path, reason=f"a new module named {name!r} outside a package would "
                                                         "shadow the standard library's or an installed package's"))
        out.total_bytes -= sum(len(base64.b64decode(f.content_base64)) for f in out.files if f.path in shadowing)
        out.files = [f for f in out.files if f.path not in shadowing]
