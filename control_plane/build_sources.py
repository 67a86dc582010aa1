"""Which host files an image build may read: only what lies under the operator's build roots.

A build YAML names host paths in a project's ``path`` or ``archive``, in a ``git`` repository
given as a ``file://`` URL or a local path, and in a Dockerfile build's ``context``. Each must
resolve (symlinks followed) to a place under one of the control plane's ``--build-root``
directories; a standalone control plane has none unless its operator says so. Remote git URLs
(https, http, git, ssh, ``host:path``) read no host file. Git's other transports (``ext::``
runs a command) and anything git could take for an option are refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from .tree_pack import REFERENCE_PREFIX

REMOTE_GIT_SCHEMES = frozenset({"https", "http", "git", "ssh"})
_TRANSPORT = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::")


class SourceNotAllowed(Exception):
    """A build source outside every build root (403)."""


def check_git(url: str, ref: str, where: str) -> None:
    """Refuse what git would not take as a plain URL and ref. Raises ``ValueError``."""
    if not url.strip():
        raise ValueError(f"{where}: the git URL is empty")
    if url.startswith("-"):
        raise ValueError(f"{where}: git URL {url!r} starts with '-': git would read it as an option")
    if ref.startswith("-"):
        raise ValueError(f"{where}: git ref {ref!r} starts with '-': git would read it as an option")
    if _TRANSPORT.match(url):
        raise ValueError(f"{where}: git URL {url!r} uses a '<transport>::' address; give an https, http, git, "
                         "ssh or file URL")
    if "://" in url and url.split("://", 1)[0].lower() not in REMOTE_GIT_SCHEMES | {"file"}:
        raise ValueError(f"{where}: git URL {url!r}: the scheme must be https, http, git, ssh or file")


def git_local_path(url: str) -> str | None:
    """The host path a git URL reads, or None for a remote repository."""
    if "://" in url:
        return unquote(urlsplit(url).path) if url.split("://", 1)[0].lower() == "file" else None
    head = url.split(":", 1)[0]
    if ":" in url and "/" not in head:
        return None  # scp-like ssh: host:path
    return url


def host_sources(project: dict[str, Any] | None, entry: dict[str, Any], where: str) -> Iterator[tuple[str, str]]:
    """``(what, host path)`` for every host path one image entry reads."""
    if project:
        if "path" in project:
            yield f"{where}.project.path", str(project["path"])
        if "archive" in project:
            yield f"{where}.project.archive", str(project["archive"])
        if "git" in project:
            local = git_local_path(str(project["git"]))
            if local is not None:
                yield f"{where}.project.git", local
    context = entry.get("context")
    if context is not None and not (isinstance(context, str) and context.startswith(REFERENCE_PREFIX)):
        yield f"{where}.context", str(context)


def check_allowed(what: str, path: str, roots: Sequence[Path]) -> None:
    """Raise ``SourceNotAllowed`` unless ``path`` resolves to a place under one of ``roots``."""
    resolved = Path(path).expanduser().resolve()
    for root in roots:
        if resolved.is_relative_to(Path(root).expanduser().resolve()):
            return
    allowed = ", ".join(str(r) for r in roots) if roots else "none"
    raise SourceNotAllowed(
        f"{what}: {path} is not under a directory this control plane builds from (allowed: {allowed}); "
        "its operator allows directories with --build-root DIR ($IDEGYM_CONTROL_PLANE_BUILD_ROOTS)")
