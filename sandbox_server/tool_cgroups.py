"""The cgroups the server's tools run in, delegated to the server by the sandbox (``--tool-cgroups``).

The local backend binds, for each cgroup v1 controller, the tools' delegated group at
``<dir>/<controller>`` (``memory``, ``pids``, ``cpu``, ``freezer``); its limits are bounded by
groups the sandbox cannot see, so that whatever the tools do, the server keeps its memory reserve
and a few process slots. The interface, for the server only:

* ``join(stage)``: the calling *thread* moves into the tools' groups (or into the stage's child
  groups). The supervisor starts every tool from one such thread (its spawner), so a tool is born
  in them: no race with a tool that forks at once, and no per-call move.
* ``create(stage)`` / ``empty(stage)`` / ``remove(stage)``: child groups for one stage (grading),
  and ending every process in them: frozen first so nothing forks away or ``setsid``s out of
  reach, then killed, then the groups are removed.

Appuser tools can read these files but not write them (they are root's); root tools could, but
only below the tools' bound. The server never lists its own pid among a group's victims.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from . import procfs
from .polling import wait_until

log = logging.getLogger(__name__)

CONTROLLERS = ("memory", "pids", "cpu", "freezer")


class ToolCgroups:
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.dirs = {c: self.root / c for c in CONTROLLERS if (self.root / c / "tasks").exists()}

    @property
    def available(self) -> bool:
        return bool(self.dirs)

    def _groups(self, stage: str | None) -> dict[str, Path]:
        if stage is not None and (not stage or "/" in stage or stage.startswith(".")):
            raise ValueError(f"invalid stage group name {stage!r}")
        return {c: d / stage if stage else d for c, d in self.dirs.items()}

    def join(self, stage: str | None = None) -> None:
        """Move the calling thread into the tools' groups (a stage's, when named): "0" written to
        ``tasks`` moves the writer alone, without the lock a move by pid takes on cgroup v1 (an
        RCU grace period: 12-40 ms on a busy host, against 0.3 for the four controllers)."""
        for group in self._groups(stage).values():
            with open(group / "tasks", "w") as fh:
                fh.write("0")

    def create(self, stage: str) -> None:
        for group in self._groups(stage).values():
            group.mkdir(exist_ok=True)

    def procs(self, stage: str | None = None) -> set[int]:
        found: set[int] = set()
        for group in self._groups(stage).values():
            for path in [group, *(p for p in group.rglob("*") if p.is_dir())]:
                try:
                    found.update(int(p) for p in (path / "cgroup.procs").read_text().split())
                except (OSError, ValueError):
                    continue
        return found - {os.getpid()}

    def empty(self, stage: str, timeout: float = 5.0) -> list[int]:
        """End every process of the stage's groups; returns those still there at ``timeout``."""
        freezer = self._groups(stage).get("freezer")
        if freezer is not None and freezer.is_dir():
            _write(freezer / "freezer.state", "FROZEN")
            wait_until(lambda: _read(freezer / "freezer.state") == "FROZEN", 1.0, first=0.001, cap=0.005)
        try:
            for pid in self.procs(stage):
                procfs.kill(pid, signal.SIGKILL)
        finally:
            if freezer is not None and freezer.is_dir():
                _write(freezer / "freezer.state", "THAWED")  # frozen tasks only die once thawed

        def gone() -> bool:
            left = self.procs(stage)
            for pid in left:
                procfs.kill(pid, signal.SIGKILL)
                procfs.reap(pid)
            return not left

        wait_until(gone, timeout, first=0.001, cap=0.01)
        return sorted(self.procs(stage))

    def remove(self, stage: str) -> None:
        for group in self._groups(stage).values():
            for path in sorted((p for p in group.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                _rmdir(path)
            _rmdir(group)


def _rmdir(path: Path) -> None:
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot remove cgroup %s: %s", path, exc)


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError:
        pass


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
