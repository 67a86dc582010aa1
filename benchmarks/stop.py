"""A client's stop of a sandbox: its latency, one by one and all at once, and the control plane's
CPU per stop.

Each round starts ``N`` sandboxes (no warm pool), runs a command in each that leaves two processes
behind (a ``sleep`` and a ``python3`` holding 64 MiB, as an agent's test run may), then stops them
one after the other (each stop's latency as the client sees it; the control plane's CPU over them,
per stop), then does it again and stops all ``N`` at once (each stop's latency, and the time until
the last ended). A stop waits for the whole delete: every process killed and gone, the groups,
mounts and files removed (``control_plane/backends/local/teardown.py``).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

from ._common import Result, Stats, stats_table
from ._cpu import children, own_and_reaped
from ._servers import control_plane

N = int(os.environ.get("BENCH_STOP_N", "12"))
ROUNDS = int(os.environ.get("BENCH_STOP_ROUNDS", "3"))
LEAVE = "(sleep 300 &); (python3 -c 'import time; b = bytearray(64 << 20); time.sleep(300)' &); echo started"


def _cpu(pid: int) -> float:
    """CPU seconds of the control plane, its ended threads' included (each teardown runs on a
    thread of its own): ``/proc``'s count, in ticks of 10 ms, so the figure is a mean over many."""
    return own_and_reaped(pid)[0]


async def _started(client, n: int) -> list:  # noqa: ANN001 - the client's types are the package's
    sandboxes = [await client.start(reuse="NONE", server_name=f"stop-{i}") for i in range(n)]
    for sandbox in sandboxes:
        await sandbox.bash(LEAVE)
    return sandboxes


async def _stopped(sandbox) -> float:  # noqa: ANN001
    began = time.perf_counter()
    await sandbox.stop()
    return time.perf_counter() - began


async def _rounds(url: str, plane: int, samples: dict[str, list[float]]) -> None:
    from idegym_env.client import AsyncIdeGymClient

    async with AsyncIdeGymClient(url, name="bench-stop") as client:
        await (await client.start(reuse="NONE")).stop()  # the built-in image made
        for i in range(ROUNDS):
            sandboxes = await _started(client, N)
            cpu = _cpu(plane)
            for sandbox in sandboxes:
                samples["stop, one at a time"].append(await _stopped(sandbox))
            samples["control plane CPU per stop (one at a time)"].append((_cpu(plane) - cpu) / N)
            sandboxes = await _started(client, N)
            cpu, began = _cpu(plane), time.perf_counter()
            samples["stop, all at once"] += await asyncio.gather(*(_stopped(s) for s in sandboxes))
            samples[f"all {N} stopped at once, until the last ended"].append(time.perf_counter() - began)
            samples["control plane CPU per stop (all at once)"].append((_cpu(plane) - cpu) / N)
            print(f"\r  round {i + 1}/{ROUNDS} (load {os.getloadavg()[0]:.1f})", end="", flush=True)
        print()


def run() -> Result:
    result = Result("stop", f"A client's stop: {N} sandboxes one at a time and all at once, {ROUNDS} rounds")
    samples: dict[str, list[float]] = {k: [] for k in (
        "stop, one at a time", "stop, all at once", f"all {N} stopped at once, until the last ended",
        "control plane CPU per stop (one at a time)", "control plane CPU per stop (all at once)")}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmpdir:
        before = children()
        with control_plane(Path(tmpdir) / "cp", ["--warm-pool", "0", "--warm-pool-max", "0"]) as url:
            (plane,) = children() - before
            asyncio.run(_rounds(url, plane, samples))
    load.append(os.getloadavg()[0])
    result.stats = [Stats.of(label, s) for label, s in samples.items()]
    result.figures["load (1 min) at start and end"] = load
    print(stats_table(result.stats))
    print(f"load: {load[0]:.1f} -> {load[1]:.1f}")
    return result


if __name__ == "__main__":
    run().write()
