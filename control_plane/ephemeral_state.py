"""Removing an ephemeral control plane's state directory, keeping the logs an error named.

The embedded control plane lives in a temporary state directory that goes when it stops. An
error that names a log of that directory (a failed build's log, a zygote's log) marks the
directory (``named``); its logs then stay (``*.log`` files and ``build-logs/``), so the path the
user was given still leads somewhere, and everything else goes (the database, the token, the
sandboxes' layers).
"""

from __future__ import annotations

import shutil
from pathlib import Path

BUILD_LOGS = "build-logs"  # control_plane.jobs.build_log_path's directory


KEEP_LOGS = "keep-logs"  # a mark: an error named a log of this directory


def named(log: Path) -> Path:
    """Mark the state directory ``log`` lies in (``log``'s parent, or its parent for a build log)
    as one whose logs an error named; returns ``log``, for use inside the message."""
    state_dir = log.parent.parent if log.parent.name == BUILD_LOGS else log.parent
    try:
        (state_dir / KEEP_LOGS).touch()
    except OSError:
        pass  # (the directory is gone: nothing to keep)
    return log


def logs_named(state_dir: Path) -> bool:
    return (state_dir / KEEP_LOGS).exists()


def only_logs_left(state_dir: Path) -> bool:
    """True when ``state_dir`` holds nothing but what ``remove`` keeps (and at least that)."""
    try:
        names = [p.name for p in state_dir.iterdir()]
    except FileNotFoundError:
        return False
    return bool(names) and all(n in (BUILD_LOGS, KEEP_LOGS) or n.endswith(".log") for n in names)


def remove(state_dir: Path, *, keep_logs: bool) -> None:
    """Remove ``state_dir``; with ``keep_logs``, all but its logs."""
    if not keep_logs:
        shutil.rmtree(state_dir, ignore_errors=True)
        return
    for entry in state_dir.iterdir():
        if entry.name in (BUILD_LOGS, KEEP_LOGS) or (entry.name.endswith(".log") and entry.is_file()):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
