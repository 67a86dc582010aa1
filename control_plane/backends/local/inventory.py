"""Which sandboxes a space holds on this host, whatever is left of them (for the orphan sweep).

A sandbox counts as present while anything of it remains: its directory, a cgroup, a mount
under the space, or its run directory (which records the full name in ``.name``) — except while
another live process is creating it (its record names that creator until the server is ready):
a sweep must not delete a neighbour's sandbox half-way through its start. This process's own
creates are the launcher's to exclude.
"""

from __future__ import annotations

import os
from pathlib import Path

from sandbox_server import procfs

from . import mounts
from .layout import NAME_RE, Space, read_meta


def names(space: Space) -> set[str]:
    found = {e.name for e in os.scandir(space.root) if e.is_dir() and NAME_RE.match(e.name)}
    elsewhere = {name for name in found if _created_elsewhere(space.root / name)}
    found |= {n for n in space.cgroups.names() if NAME_RE.match(n)}
    prefix = str(space.root) + "/"
    for point in mounts.mounts_under(space.root):
        rest = point[len(prefix):].split("/", 1)[0]
        if NAME_RE.match(rest):
            found.add(rest)
    if space.kind == "sandboxes" and space.run_root.is_dir() and space.run_root != space.root:
        for entry in os.scandir(space.run_root):
            short = entry.name.removesuffix(".sock")
            if short.startswith("b-"):
                continue
            try:
                found.add(Path(space.run_root, short, ".name").read_text().strip())
            except OSError:
                if NAME_RE.match(short) and len(short) <= 24:
                    found.add(short)
    return found - elsewhere


def _created_elsewhere(sb: Path) -> bool:
    record = read_meta(sb)
    creator = record.creator if record is not None else None
    return creator is not None and creator[0] != os.getpid() and procfs.recorded_alive(creator)
