"""Removing an ephemeral control plane's state directory, keeping its logs when something failed.

The embedded control plane lives in a temporary state directory that goes when it stops. When a
build failed or an error was logged, its logs are what a user needs next, and errors named their
paths: those stay (``*.log`` files and ``build-logs/``), everything else goes (the database, the
token, the sandboxes' layers).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

BUILD_LOGS = "build-logs"  # control_plane.jobs.build_log_path's directory


class ErrorCounter(logging.Handler):
    """Counts the records of level ERROR and above that reach the root logger."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def has_failed_builds(state_dir: Path) -> bool:
    return any((state_dir / BUILD_LOGS).glob("*.log"))


def only_logs_left(state_dir: Path) -> bool:
    """True when ``state_dir`` holds nothing but what ``remove`` keeps (and at least that)."""
    try:
        names = [p.name for p in state_dir.iterdir()]
    except FileNotFoundError:
        return False
    return bool(names) and all(n == BUILD_LOGS or n.endswith(".log") for n in names)


def remove(state_dir: Path, *, keep_logs: bool) -> None:
    """Remove ``state_dir``; with ``keep_logs``, all but its logs."""
    if not keep_logs:
        shutil.rmtree(state_dir, ignore_errors=True)
        return
    for entry in state_dir.iterdir():
        if entry.name == BUILD_LOGS or (entry.name.endswith(".log") and entry.is_file()):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
