"""How memory and start latency grow with the number of live sandboxes, 1 to 200, on this host.

Sandboxes are started one after another through the control plane (warm pool on, as deployed);
at each checkpoint the proportional set size of every sandbox process is summed, and the start
latency is the median of the last few starts. Writes a PNG of both curves.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from ._common import RESULTS, Progress, Result, table
from ._servers import control_plane
from .lifecycle import _pss_kib, _sandbox_pids

TOTAL = int(os.environ.get("BENCH_SCALE_MAX", "200"))
CHECKPOINTS = [c for c in (1, 10, 25, 50, 100, 150, 200) if c <= TOTAL]


def run() -> Result:
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
                for sandbox in live:
                    sandbox.stop()
    result.figures["points"] = points
    print()
    print(table(["live sandboxes", "total PSS MiB", "per sandbox MiB", "start p50 ms", "start max ms"], rows))
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
