"""``benchmarks/_host_state.py`` counts what the kernel kept: a memory cgroup removed while page
cache is still charged to it is counted as removed and not yet freed."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from benchmarks import _host_state

hierarchy = _host_state._memory_hierarchy()
if os.geteuid() != 0 or hierarchy is None:  # pragma: no cover
    pytest.skip("needs root and a cgroup v1 memory hierarchy (this host's)", allow_module_level=True)


def test_a_removed_memory_cgroup_holding_page_cache_is_counted(tmp_path: Path) -> None:
    before = _host_state.snapshot()
    assert before["dentries"] > 0 and before["page cache MiB"] > 0 and "loop devices" in before
    data = tmp_path / "charged"
    with open(data, "wb") as fh:  # on disk and out of the cache: the read below charges the group
        fh.write(b"x" * (1 << 20))
        fh.flush()
        os.fsync(fh.fileno())
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    group = hierarchy / f"idegym-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        subprocess.run(["sh", "-c", f"echo $$ > {group}/cgroup.procs && cat {data} > /dev/null"], check=True)
    finally:
        group.rmdir()
    after = _host_state.snapshot()
    assert after["memory cgroups removed, not yet freed"] >= before["memory cgroups removed, not yet freed"] + 1
    assert after["memory cgroups"] >= before["memory cgroups"] + 1  # held by the kernel, gone from the tree
