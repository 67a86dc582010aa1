"""Where the caches shared by every state directory of this user live."""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ...settings import ControlPlaneSettings

# What a process killed while filling a cache left (``.tmp-*``) goes after this long.
TMP_RETENTION = 3600.0
LOCK = ".lock"  # in a cache's directory: held while an entry is made
COMPLETE = ".complete"  # in an entry: it is whole (touched at every use)


def user_cache_dir(name: str, override: Path | None = None) -> Path:
    """``override`` (a variable of the settings) when set, else ``$XDG_CACHE_HOME/idegym/<name>``
    (default ``~/.cache``)."""
    return override or ControlPlaneSettings.from_env().user_cache_dir(name)


def prune(root: Path, retention: float, *, keep: int = 0, spare: str | None = None) -> None:
    """Remove the entries of ``root`` (each marked ``.complete``, touched at every use) beyond the
    ``keep`` most recently used that are unused for ``retention`` seconds, except ``spare``, and
    the leftovers of killed fills."""
    entries = []
    for entry in root.iterdir():
        if entry.name == LOCK:
            continue
        marker = entry / COMPLETE
        try:
            entries.append(((marker if marker.exists() else entry).stat().st_mtime, entry))
        except OSError:
            continue
    now = time.time()
    for rank, (used, entry) in enumerate(sorted(entries, reverse=True)):
        leftover = entry.name.startswith(".tmp-") and used < now - TMP_RETENTION
        if leftover or (rank >= keep and used < now - retention and entry.name != spare):
            shutil.rmtree(entry, ignore_errors=True)


@contextmanager
def locked(root: Path) -> Iterator[None]:
    """An exclusive lock on the cache ``root``: a file lock, which other control planes sharing the
    cache and other threads of this one (each opens the file anew) wait for alike."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def fill_once(root: Path, key: str, fill: Callable[[Path], None]) -> Path:
    """The entry ``root / key``, made now by ``fill(directory)`` unless it is complete already.

    One start makes it, under ``locked(root)``; any other start, in this process or another,
    waits for it and then uses it. ``fill`` writes into a directory of its own, which becomes
    the entry (marked complete) only once whole. The entry is touched at every use (``prune``)."""
    entry = root / key
    marker = entry / COMPLETE
    if not marker.exists():
        with locked(root):
            if not marker.exists():
                tmp = root / f".tmp-{key}-{os.getpid()}-{threading.get_ident()}"
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
                try:
                    fill(tmp)
                    (tmp / COMPLETE).write_text(key)
                    shutil.rmtree(entry, ignore_errors=True)  # one left incomplete
                    tmp.rename(entry)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    try:
        os.utime(marker)
    except OSError:
        pass
    return entry
