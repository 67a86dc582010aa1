"""The mounts a test run leaves below its temporary directory (``tests/conftest.py`` asserts there
are none): a sandbox's layers, a state directory's bind of its ``sandboxes/`` space
(``layer_mounts.py``), an image's. Every state directory of a run's backends, embedded control
planes' included, is below that directory; other runs on this host have their own.
"""

from __future__ import annotations

import time
from pathlib import Path

from control_plane.backends.local import mounts


def below(base: Path) -> list[str]:
    """The mount points below ``base`` in this process's mount namespace."""
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = Path(mounts.unescape(line.split(" ", 5)[4]))
            if point.is_relative_to(base):
                found.append(str(point))
    return found


def left_after(base: Path, before: list[str], timeout: float) -> list[str]:
    """The run's new mounts still there once ``timeout`` has passed (the last lease monitors of
    a stopped control plane may still be on their way out)."""
    deadline = time.monotonic() + timeout
    while True:
        left = [point for point in below(base) if point not in before]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def clear(points: list[str]) -> None:
    """Detach them, deepest first: nothing of the run stays mounted on the host."""
    for point in sorted(points, key=len, reverse=True):
        try:
            mounts.umount(point, detach=True)
        except OSError:
            continue
