"""What the kernel has kept from earlier work, recorded before each benchmark of a run.

A fork into 8 from a warm pool measured right after a full run took 131 ms (p50 of 5); with the
kernel's reclaimable slab dropped (2.7 M cached dentries, 2.65 M ext4 inodes) 59 ms, and with its
page cache dropped too (1,221 memory cgroups, all but 3 of them removed and not yet freed because
page cache was still charged to them, became 155) 47 ms. Nothing but the host's state differed,
so each benchmark's figures are recorded beside the state it ran in. (A full run started with those
caches dropped still missed the fork's 50 ms: they explain the worst figures, not every miss.)
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


def line(state: dict[str, int]) -> str:
    return "host: " + ", ".join(f"{key} {value:,}" for key, value in state.items())
