"""Where the caches shared by every state directory of this user live."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

# What a process killed while filling a cache left (``.tmp-*``) goes after this long.
TMP_RETENTION = 3600.0


def user_cache_dir(name: str, override_env: str | None = None) -> Path:
    """``$<override_env>`` when set, else ``$XDG_CACHE_HOME/idegym/<name>`` (default ``~/.cache``)."""
    explicit = os.environ.get(override_env) if override_env else None
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "idegym" / name


def prune(root: Path, retention: float, *, keep: int = 0, spare: str | None = None) -> None:
    """Remove the entries of ``root`` (each marked ``.complete``, touched at every use) beyond the
    ``keep`` most recently used that are unused for ``retention`` seconds, except ``spare``, and
    the leftovers of killed fills."""
    entries = []
    for entry in root.iterdir():
        marker = entry / ".complete"
        try:
            entries.append(((marker if marker.exists() else entry).stat().st_mtime, entry))
        except OSError:
            continue
    now = time.time()
    for rank, (used, entry) in enumerate(sorted(entries, reverse=True)):
        leftover = entry.name.startswith(".tmp-") and used < now - TMP_RETENTION
        if leftover or (rank >= keep and used < now - retention and entry.name != spare):
            shutil.rmtree(entry, ignore_errors=True)
