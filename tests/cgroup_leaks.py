"""The cgroups a test run's local backends leave behind (``tests/conftest.py`` asserts there are none).

A backend's groups live under ``<controller mount>/idegym/<key>`` (and ``<key>-build``), the key
naming its state directory (``layout.state_key``); every backend that starts as root notes its
key and state directory in ``/run/idegym-index``. A run's groups are those of the state
directories below its temporary directory: other test runs on this host (other checkouts, other
workers) have their own and are never counted.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from control_plane.backends.local.cgroups import Cgroups, controller_mounts
from control_plane.backends.local.layout import registered_states

PARENT = "idegym"  # LocalBackend's default cgroup_parent


def run_groups(base: Path) -> dict[str, list[str]]:
    """Every group of the state directories below ``base``, by key (parents before children)."""
    found: dict[str, list[str]] = {}
    keys = [key for key, state in registered_states().items() if state.is_relative_to(base)]
    for key in keys:
        for point in controller_mounts().values():
            for top in (point / PARENT / key, point / PARENT / f"{key}-build"):
                groups = [str(top)] if top.is_dir() else []
                for group in groups:  # grows while it is walked
                    try:
                        groups.extend(e.path for e in os.scandir(group) if e.is_dir(follow_symlinks=False))
                    except OSError:
                        continue
                if groups:
                    found.setdefault(key, []).extend(groups)
    return found


def left_after(base: Path, timeout: float) -> dict[str, list[str]]:
    """The run's groups still there once ``timeout`` has passed (deletes may finish in background)."""
    deadline = time.monotonic() + timeout
    while True:
        left = run_groups(base)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def describe(groups: list[str]) -> list[str]:
    out = []
    for group in groups:
        procs = Cgroups.procs({"g": group})
        out.append(f"{group} ({len(procs)} processes)" if procs else group)
    return out


def clear(keys: list[str]) -> None:
    """End what is in the keys' groups and remove them: nothing of the run stays on the host."""
    for key in keys:
        for suffix in ("", "-build"):
            tops = {ctrl: str(point / PARENT / f"{key}{suffix}") for ctrl, point in controller_mounts().items()}
            tops = {ctrl: path for ctrl, path in tops.items() if os.path.isdir(path)}
            Cgroups.kill_all(tops, timeout=2.0)  # frozen first (the freezer's group), so nothing forks away
            Cgroups.remove(tops, timeout=2.0)
