"""What the kernel has kept from earlier work, recorded before each benchmark of a run.

A fork into 8 from a warm pool measured right after a full run took 131 ms (p50 of 5); with the
kernel's reclaimable slab dropped (2.7 M cached dentries, 2.65 M ext4 inodes) 59 ms, and with its
page cache dropped too (1,221 memory cgroups, all but 3 of them removed and not yet freed because
page cache was still charged to them, became 155) 47 ms. Nothing but the host's state differed,
so each benchmark's figures are recorded beside the state it ran in.
"""

from __future__ import annotations

import os
from pathlib import Path


def _memory_hierarchy() -> Path | None:
    """Where the memory controller's hierarchy is mounted (cgroup v1), or the unified one (v2)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    unified = None
    for line in lines:
        fields = line.split()
        sep = fields.index("-")
        fstype, options = fields[sep + 1], fields[sep + 3].split(",")
        if fstype == "cgroup" and "memory" in options:
            return Path(fields[4])
        if fstype == "cgroup2" and unified is None:
            unified = Path(fields[4])
    return unified


def _memory_cgroups() -> tuple[int, int] | None:
    """(memory cgroups the kernel holds, those of them removed but not yet freed)."""
    root = _memory_hierarchy()
    if root is None:
        return None
    stat = root / "cgroup.stat"
    if stat.exists():  # cgroup v2 counts them itself
        values = dict(line.split() for line in stat.read_text().splitlines())
        live = sum(1 for _ in os.walk(root))
        dying = int(values.get("nr_dying_descendants", 0))
        return live + dying, dying
    try:
        held = next(int(line.split()[2]) for line in Path("/proc/cgroups").read_text().splitlines()
                    if line.startswith("memory\t") or line.startswith("memory "))
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
