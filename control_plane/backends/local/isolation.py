"""Which isolation the local backend can give here: bubblewrap sandboxes, or plain processes."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from ..base import BackendError

log = logging.getLogger(__name__)

ISOLATIONS = ("auto", "bwrap", "none")

_said: set[str] = set()


def say_once(key: str, level: int, message: str, *args: Any) -> None:
    """Log ``message`` the first time ``key`` is said in this process (warnings about the host)."""
    if key not in _said:
        _said.add(key)
        log.log(level, message, *args)


def bwrap_unavailable() -> str | None:
    """Why bubblewrap sandboxes cannot work here, or None when they can."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    if os.geteuid() != 0:
        return "the control plane does not run as root (needed for overlay root filesystems)"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs"
    return None


def choose_isolation(requested: str) -> str:
    """``bwrap`` or ``none`` for ``requested`` (one of ``ISOLATIONS``); ``bwrap`` that cannot work
    raises, ``auto`` falls back to ``none`` with one loud warning."""
    reason = None
    if requested != "none":
        reason = bwrap_unavailable()
        if reason is None:
            return "bwrap"
        if requested == "bwrap":
            raise BackendError(f"local backend: isolation 'bwrap' is not possible here: {reason}")
    say_once("isolation", logging.WARNING,
             "\n%s\nLOCAL BACKEND: SANDBOXES ARE NOT ISOLATED (%s). Each sandbox server runs as a plain "
             "child process with this process's user and full view of the host: files, network, other "
             "sandboxes. Only a per-sandbox project copy separates them. Install bubblewrap and run as "
             "root for isolation.\n%s", "!" * 78, reason or "isolation='none' requested", "!" * 78)
    return "none"
