"""Sandbox life cycle on the local backend, on a 5,000-file project with 10 files changed.

* cold start (no warm pool) and warm-pool claim, as the client sees them (start operation);
* RESET reuse (project overlay remount + ending tool processes) and RESTART reuse (a fresh
  sandbox swapped in under the same server id), after the agent changed 10 files and deleted one;
* the original implementation's reset on the same project: wipe the directory and re-extract a
  tar.gz archive of it (what ``POST /api/project/reset`` did upstream);
* snapshot, and a start that restores from it;
* memory per idle sandbox with 100 live sandboxes (proportional set size, so shared libraries
  are split fairly).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import httpx

from ._common import Progress, Result, Stats, check_target, stats_table
from ._servers import control_plane, make_project

N = int(os.environ.get("BENCH_LIFECYCLE_N", "20"))
LIVE = int(os.environ.get("BENCH_LIVE_SANDBOXES", "100"))
# Nine files changed and one made (pkg010 does not exist; the redirect's error is silenced before it is made).
CHANGE = ("for i in 1 2 3 4 5 6 7 8 9 10; do echo changed 2>/dev/null >> pkg0$i/mod1/file$((i*7+1)).py "
          "|| echo new > new$i.py; done; rm -f pkg00/mod0/file0.py; (sleep 300 &)")


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _sandbox_pids(state: Path) -> list[int]:
    """Processes of the sandboxes of the control plane whose state is ``state``: every process in
    their cgroups, their bwrap monitors, and the template processes their servers were forked
    from (children of that control plane)."""
    from control_plane.backends.local.layout import state_key

    pids = set()
    for procs in Path("/sys/fs/cgroup/pids/idegym", state_key(state)).glob("**/cgroup.procs"):
        pids.update(int(p) for p in procs.read_text().split())
    marker = str(state).encode()
    planes = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes()
        except OSError:
            continue
        if b"control_plane" in cmd and marker in cmd:
            planes.add(int(entry.name))
        elif marker in cmd and cmd.startswith(b"bwrap"):
            pids.add(int(entry.name))
    for pid in _descendants(planes):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"sandbox_server.zygote" in cmd or (cmd.startswith(b"bwrap") and b"--die-with-parent" in cmd):
            pids.add(pid)
    return sorted(pids)


def _descendants(roots: set[int]) -> set[int]:
    from sandbox_server import procfs

    found, stack = set(), list(roots)
    while stack:
        for child in procfs.children(stack.pop()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def _register_image(url: str, project: Path) -> str:
    from idegym_env.client import IdeGymClient

    tag = "bench/project5k:1"
    with IdeGymClient(url, name="bench-images") as client:
        client.build_images(json.dumps({"images": [{"tag": tag, "project": {"path": str(project)}}]}))
    return tag


def _wait_pool(url: str, want: int, timeout: float = 60) -> None:
    """Wait until the warm pool holds ``want`` sandboxes (read from /metrics)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(f"{url}/metrics").text
        ready = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                    if line.startswith("idegym_warm_pool_ready{"))
        if ready >= want:
            return
        time.sleep(0.05)


def run() -> Result:
    from idegym_env.client import IdeGymClient

    result = Result("lifecycle", "Sandbox life cycle: cold and warm start, RESET, RESTART, snapshot, memory")
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        project = make_project(tmp / "project5k")
        # --- the original's reset: wipe and re-extract an archive ---------------------------------
        archive = tmp / "project.tar.gz"
        with tarfile.open(archive, "w:gz") as tf:
            tf.add(project, arcname="project")
        work = tmp / "original"
        shutil.copytree(project, work)
        original = []
        wipe_and_extract = (f"set -euo pipefail; find {work} -mindepth 1 -maxdepth 1 -exec rm -rf -- {{}} +; "
                            f"tar -xzf {archive} -C {work} --strip-components=1")
        progress = Progress("original reset (wipe + re-extract)", N)
        for _ in range(N):
            subprocess.run(["bash", "-c", CHANGE.replace("(sleep 300 &)", "true")], cwd=work, check=True)
            t = time.perf_counter()
            subprocess.run(["bash", "-c", wipe_and_extract], check=True)
            original.append(time.perf_counter() - t)
            progress.step()
        samples["reset, original way (wipe + re-extract tar.gz)"] = original

        # --- cold starts: no warm pool --------------------------------------------------------------
        with control_plane(tmp / "cold", ["--warm-pool", "0", "--warm-pool-max", "0"]) as url:
            tag = _register_image(url, project)
            with IdeGymClient(url, name="bench-cold") as client:
                client.start(tag, reuse="NONE").stop()  # first start generates the built-in image
                cold = []
                progress = Progress("cold start (no pool)", N)
                for _ in range(N):
                    t = time.perf_counter()
                    sandbox = client.start(tag, reuse="NONE")
                    cold.append(time.perf_counter() - t)
                    sandbox.stop()
                    progress.step()
                samples["cold start"] = cold

        # --- warm pool, reuse, snapshots, memory ----------------------------------------------------
        with control_plane(tmp / "warm", ["--warm-pool", "2", "--warm-pool-max", "4",
                                           "--max-servers", str(LIVE + 20)]) as url:
            tag = _register_image(url, project)
            with IdeGymClient(url, name="bench-warm") as client:
                client.start(tag, reuse="NONE").stop()  # teaches the pool this image
                warm = []
                progress = Progress("warm start (pool claim)", N)
                for _ in range(N):
                    _wait_pool(url, 1)
                    t = time.perf_counter()
                    sandbox = client.start(tag, reuse="NONE")
                    warm.append(time.perf_counter() - t)
                    sandbox.stop()
                    progress.step()
                samples["warm start (pool claim)"] = warm

                sandbox = client.start(tag, reuse="NONE")
                resets, restarts = [], []
                progress = Progress("RESET and RESTART reuse", 2 * N)
                for _ in range(N):
                    sandbox.bash(CHANGE)
                    t = time.perf_counter()
                    sandbox.reset()
                    resets.append(time.perf_counter() - t)
                    progress.step()
                for _ in range(N):
                    sandbox.bash(CHANGE)
                    _wait_pool(url, 1)
                    t = time.perf_counter()
                    sandbox.restart()
                    restarts.append(time.perf_counter() - t)
                    progress.step()
                samples["RESET reuse (10 files changed, 1 deleted)"] = resets
                samples["RESTART reuse (fresh sandbox, same id)"] = restarts

                sandbox.bash(CHANGE)
                snap = sandbox.snapshot()
                restores = []
                progress = Progress("start from a snapshot", max(N // 2, 5))
                for _ in range(max(N // 2, 5)):
                    t = time.perf_counter()
                    restored = client.start(tag, reuse="NONE", snapshot={"id": snap.snapshot_id,
                                                                         "tag": snap.snapshot_tag})
                    restores.append(time.perf_counter() - t)
                    restored.stop()
                    progress.step()
                samples["start from a snapshot"] = restores
                sandbox.stop()

                live = []
                progress = Progress(f"{LIVE} live sandboxes", LIVE)
                for _ in range(LIVE):
                    live.append(client.start(tag, reuse="NONE"))
                    progress.step()
                time.sleep(1.0)  # let start-up garbage settle before reading memory
                pids = _sandbox_pids(tmp / "warm")
                total_kib = sum(_pss_kib(p) for p in pids)
                result.figures["live sandboxes"] = LIVE
                result.figures["sandbox processes"] = len(pids)
                result.figures["memory per idle sandbox MiB (PSS)"] = round(total_kib / 1024 / LIVE, 2)
                for sandbox in live:
                    sandbox.stop()
    stats = [Stats.of(label, s) for label, s in samples.items()]
    result.stats = stats
    print()
    print(stats_table(stats, baseline="reset, original way (wipe + re-extract tar.gz)"))
    print(f"\nmemory per idle sandbox at {LIVE} live sandboxes: "
          f"{result.figures['memory per idle sandbox MiB (PSS)']} MiB (PSS)")
    by = {s.label: s for s in stats}
    result.targets = {
        "warm": check_target("warm start p50", by["warm start (pool claim)"].median_ms, 10.0),
        "cold": check_target("cold start p50", by["cold start"].median_ms, 300.0),
        "reset": check_target("RESET p50", by["RESET reuse (10 files changed, 1 deleted)"].median_ms, 20.0),
        "restart": check_target("RESTART p50", by["RESTART reuse (fresh sandbox, same id)"].median_ms, 50.0),
    }
    for target in result.targets.values():
        print(target["text"])
    return result


if __name__ == "__main__":
    run().write()
