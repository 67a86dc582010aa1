"""How memory and start latency grow with the number of live sandboxes, 1 to 500, on this host.

Sandboxes are started one after another through the control plane (warm pool on, as deployed);
at each checkpoint the proportional set size of every sandbox process (their bwrap, init and
server, and the template process the servers are forked from) is summed, and the start latency
is the median of the last few starts. Then every sandbox answers one bash call, all are stopped,
and nothing of them may be left: no process, cgroup, mount or directory. Writes a PNG of both
curves. Target: 8 MiB per idle sandbox at 200 live.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from ._common import RESULTS, Progress, Result, Stats, check_target, stats_table, table
from ._servers import control_plane
from .lifecycle import _pss_kib, _sandbox_pids

TOTAL = int(os.environ.get("BENCH_SCALE_MAX", "500"))
CHECKPOINTS = [c for c in (1, 10, 25, 50, 100, 200, 300, 400, 500) if c <= TOTAL]
TARGET_AT, TARGET_MIB = 200, 8.0


def run() -> Result:
    from control_plane.backends.local.layout import state_key
    from idegym_env.client import IdeGymClient

    result = Result("scale", f"Memory and start latency from 1 to {TOTAL} live sandboxes")
    rows, points = [], []
    with tempfile.TemporaryDirectory() as tmpdir:
        state = Path(tmpdir) / "cp"
        with control_plane(state, ["--warm-pool", "2", "--warm-pool-max", "4", "--max-servers",
                                   str(TOTAL + 10)]) as url:
            with IdeGymClient(url, name="bench-scale") as client:
                client.start(reuse="NONE").stop()
                live, latencies = [], []
                progress = Progress("starting sandboxes", TOTAL)
                started = time.perf_counter()
                for i in range(1, TOTAL + 1):
                    t = time.perf_counter()
                    live.append(client.start(reuse="NONE"))
                    latencies.append(time.perf_counter() - t)
                    progress.step()
                    if i in CHECKPOINTS:
                        pids = _sandbox_pids(state)
                        pss_mib = sum(_pss_kib(p) for p in pids) / 1024
                        recent = latencies[-min(10, len(latencies)):]
                        point = {"sandboxes": i, "total_mib": round(pss_mib, 1),
                                 "per_sandbox_mib": round(pss_mib / i, 2),
                                 "start_p50_ms": round(statistics.median(recent) * 1000, 2),
                                 "start_max_ms": round(max(recent) * 1000, 2)}
                        points.append(point)
                        rows.append(list(point.values()))
                start_seconds = time.perf_counter() - started
                calls = []
                progress = Progress("one bash call each", TOTAL)
                for sandbox in live:
                    t = time.perf_counter()
                    reply = sandbox.bash("echo hi")
                    calls.append(time.perf_counter() - t)
                    if reply.stdout.strip() != "hi":
                        raise RuntimeError(f"a sandbox answered {reply!r}")
                    progress.step()
                # Served a call, a sandbox also has its tool user's spawner (sandbox_server/native/spawner.c).
                used_mib = sum(_pss_kib(p) for p in _sandbox_pids(state)) / 1024 / TOTAL
                progress = Progress("stopping them", TOTAL)
                t = time.perf_counter()
                for sandbox in live:
                    sandbox.stop()
                    progress.step()
                stop_seconds = time.perf_counter() - t
        # After the control plane's exit: nothing of any sandbox may be left.
        key = state_key(state)
        left = {
            "processes": len([p for p in _sandbox_pids(state) if Path(f"/proc/{p}").exists()]),
            "cgroups": len([d for d in Path("/sys/fs/cgroup").glob(f"*/idegym/{key}/*") if d.is_dir()]),
            "mounts": sum(str(state) in line for line in Path("/proc/self/mountinfo").read_text().splitlines()),
            "sandbox directories": len(list((state / "sandboxes").glob("*"))) if (state / "sandboxes").exists() else 0,
        }
    call_stats = Stats.of("bash call, one per live sandbox", calls)
    result.stats = [call_stats]
    result.figures["points"] = points
    result.figures["start rate sandboxes/s"] = round(TOTAL / start_seconds, 2)
    result.figures["stop rate sandboxes/s"] = round(TOTAL / stop_seconds, 2)
    result.figures["left after stopping"] = left
    result.figures[f"PSS per sandbox after a call each at {TOTAL} live MiB"] = round(used_mib, 2)
    print()
    print(table(["live sandboxes", "total PSS MiB", "per sandbox MiB", "start p50 ms", "start max ms"], rows))
    print()
    print(stats_table([call_stats]))
    print(f"\n{TOTAL} sandboxes: started at {result.figures['start rate sandboxes/s']}/s, stopped at "
          f"{result.figures['stop rate sandboxes/s']}/s; left after stopping: {left}; "
          f"PSS per sandbox after a call each: {used_mib:.2f} MiB")
    at = next((p for p in points if p["sandboxes"] == TARGET_AT), None)
    if at is not None:
        result.targets["memory"] = check_target(f"PSS per idle sandbox at {TARGET_AT} live", at["per_sandbox_mib"],
                                                TARGET_MIB, "MiB")
    if TOTAL == TARGET_AT:
        result.targets["memory_used"] = check_target(f"PSS per sandbox at {TARGET_AT} live after a call each",
                                                     used_mib, TARGET_MIB, "MiB")
    result.targets["left"] = check_target("processes, cgroups, mounts, directories left", sum(left.values()), 0,
                                          "items")
    for target in result.targets.values():
        print(f"- {target['text']}")
    _plot(points)
    return result


def _plot(points: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p["sandboxes"] for p in points]
    fig, left = plt.subplots(figsize=(7, 4))
    left.plot(xs, [p["total_mib"] / 1024 for p in points], "o-", color="tab:blue", label="memory (GiB, PSS)")
    left.set_xlabel("live sandboxes")
    left.set_ylabel("memory of all sandboxes (GiB)", color="tab:blue")
    right = left.twinx()
    right.plot(xs, [p["start_p50_ms"] for p in points], "s--", color="tab:red", label="start p50 (ms)")
    right.set_ylabel("start latency p50 (ms)", color="tab:red")
    left.set_title("IdeGym local backend: memory and start latency vs live sandboxes")
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(RESULTS / "scale.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    run().write()
