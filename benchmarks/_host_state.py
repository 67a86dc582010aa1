"""What the kernel has kept from earlier work, recorded before each benchmark of a run.

The same warm-pool fork into 8 (p50 of 5-10, 5,000 files) took 82-203 ms in the minutes after a
full run (2.7 M cached dentries, 1,221 memory cgroups removed and not yet freed, the disk's I/O
pressure at 46 %), and 47-59 ms once the dirty pages were synced and the caches dropped. An hour
later, alternated at load ~1, the code of a run that had measured 41 ms and the code of today both
took 46-68 ms. A later pair at 1.09 M dentries measured 55.7 ms before a
slab drop and 61.4 after, so the caches alone do not decide it; they are recorded beside each
benchmark's figures so that runs can be compared by the state they ran in.
"""

from __future__ import annotations

import os
from pathlib import Path

from control_plane.backends.local.cgroups import controller_mounts


def _memory_hierarchy() -> Path | None:
    """Where the memory controller's cgroup v1 hierarchy is mounted (what the local backend uses)."""
    return controller_mounts().get("memory")


def _memory_cgroups() -> tuple[int, int] | None:
    """(memory cgroups the kernel holds, those of them removed but not yet freed)."""
    root = _memory_hierarchy()
    if root is None:
        return None
    try:
        held = next(int(line.split()[2]) for line in Path("/proc/cgroups").read_text().splitlines()
                    if line.split()[:1] == ["memory"])
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    live = sum(1 for _ in os.walk(root))
    return held, max(held - live, 0)


def snapshot() -> dict[str, int]:
    """Cached dentries (of them negative), memory cgroups (of them removed, not yet freed), loop
    block devices, and the page cache in MiB; what cannot be read is left out."""
    out: dict[str, int] = {}
    try:
        fields = Path("/proc/sys/fs/dentry-state").read_text().split()
        out["dentries"], out["negative dentries"] = int(fields[0]), int(fields[4])
    except (OSError, ValueError, IndexError):
        pass
    if (memcgs := _memory_cgroups()) is not None:
        out["memory cgroups"], out["memory cgroups removed, not yet freed"] = memcgs
    try:
        out["loop devices"] = sum(1 for name in os.listdir("/sys/block") if name.startswith("loop"))
    except OSError:
        pass
    try:
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        out["page cache MiB"] = int(meminfo["Cached"].split()[0]) // 1024
    except (OSError, KeyError, ValueError):
        pass
    return out


def describe(state: dict[str, int]) -> str:
    """``state`` (a ``snapshot``) as one line's text."""
    return ", ".join(f"{key} {value:,}" for key, value in state.items())
