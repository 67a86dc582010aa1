"""Where a local sandbox start spends its time and CPU, step by step and process by process.

Run: ``.venv/bin/python -m benchmarks._fill_breakdown [N] [AT_ONCE]`` (as root, bubblewrap).
Starts N sandboxes (background, as warm-pool fills are, then hurried as a claim does), AT_ONCE
at a time, on a backend in this process; for each step of the launch its wall time, the CPU of
the thread that ran it, and the wait for its thread (the launch thread's queue); for each
process a start leaves (bubblewrap's monitor, init, the server, its spawner, the lease monitor
and its sleep) the CPU it used by the time the sandbox was ready (``/proc/<pid>/schedstat``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from control_plane.backends.local import LocalBackend, launcher, readiness, zygote
from control_plane.backends.local.handle_data import LocalHandleData
from sandbox_server import procfs
from tests.local_helpers import spec

from ._common import RESULTS

_steps: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
_submitted: dict[int, float] = {}


def _timed(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            _steps[name]["wall"].append((time.perf_counter() - wall) * 1e3)
            _steps[name]["cpu"].append((time.thread_time() - cpu) * 1e3)
    return run


def _timed_async(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> Any:
        wall = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        finally:
            _steps[name]["wall"].append((time.perf_counter() - wall) * 1e3)
    return run


def _queued_spawn(fn: Any) -> Any:
    """The launch thread's queue: from the end of the step before (the lease monitor's start,
    or the preparation) to this step's start on its thread."""
    @functools.wraps(fn)
    def run(self: Any, plan: Any, data: LocalHandleData) -> Any:
        ready_since = _submitted.pop(id(data), None)
        if ready_since is not None:
            _steps["spawn"]["queued"].append((time.perf_counter() - ready_since) * 1e3)
        return fn(self, plan, data)
    return run


def _mark_submitted(fn: Any) -> Any:
    """The last of the steps before the spawn to end (the preparation, or the lease monitor's
    start, which runs during it or after it) marks when the spawn was asked for."""
    @functools.wraps(fn)
    def run(self: Any, plan: Any, data: LocalHandleData, *args: Any) -> Any:
        try:
            return fn(self, plan, data, *args)
        finally:
            _submitted[id(data)] = max(time.perf_counter(), _submitted.get(id(data), 0.0))
    return run


def _instrument() -> None:
    cls = launcher.Launcher
    cls._prepare = _mark_submitted(_timed("prepare", cls._prepare))  # type: ignore[method-assign]
    cls._watch = _mark_submitted(_timed("lease monitor start", cls._watch))  # type: ignore[method-assign]
    cls._spawn = _queued_spawn(_timed("spawn", cls._spawn))  # type: ignore[method-assign]
    cls._record = _timed("record", cls._record)  # type: ignore[method-assign]
    launcher.fork_server = _timed("zygote fork", zygote.fork_server)
    launcher.rootfs.prepare_layers = _timed("  prepare: layers", launcher.rootfs.prepare_layers)
    launcher.cgroups.Cgroups.create = _timed("  prepare: cgroups", launcher.cgroups.Cgroups.create)  # type: ignore[method-assign]
    launcher.readiness.wait_ready = _timed_async("ready (server start)", readiness.wait_ready)
    launcher.readiness.warm_up = _timed_async("warm-up call", readiness.warm_up)
    launcher.priority.settle = _timed("settle (nice 0)", launcher.priority.settle)
    launcher.readiness.attach = _timed("attach", readiness.attach)
    launcher.readiness.publish_socket = _timed("publish socket", readiness.publish_socket)


def _run_ns(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/schedstat") as fh:
            return int(fh.read().split()[0]) / 1e6
    except OSError:
        return None


def _processes(data: LocalHandleData) -> dict[str, float]:
    out: dict[str, float] = {}
    named = {"bwrap monitor": data.monitor, "init (placeholder)": data.init, "server": data.server,
             "lease monitor (sh)": data.lease_monitor}
    for label, record in named.items():
        if record and procfs.recorded_alive(record) and (ms := _run_ns(record[0])) is not None:
            out[label] = ms
    if data.server:
        for kid in procfs.children(data.server[0]):
            if (ms := _run_ns(kid)) is not None:
                out["spawner"] = out.get("spawner", 0.0) + ms
    if data.lease_monitor:
        for kid in procfs.children(data.lease_monitor[0]):
            if (ms := _run_ns(kid)) is not None:
                out["lease sleep"] = ms
    return out


async def main(n: int, at_once: int) -> None:
    _instrument()
    with tempfile.TemporaryDirectory(prefix="fill-breakdown-") as tmp:
        backend = LocalBackend(Path(tmp) / "state", isolation="bwrap")
        await backend.start()
        procs: dict[str, list[float]] = defaultdict(list)
        totals: list[float] = []
        try:
            await backend.delete(await backend.create(spec("warm-zygote"), 120))  # the zygote, the runtime
            _steps.clear()
            zygote_pids = [z.pid for z in backend.launcher._zygote_of.values() if z.pid]
            zygote_before = sum(_run_ns(p) or 0.0 for p in zygote_pids)
            for batch in range(0, n, at_once):
                names = [f"b{i}" for i in range(batch, min(batch + at_once, n))]

                async def one(name: str) -> Any:
                    task = asyncio.ensure_future(backend.create(spec(name), 120, background=True))
                    await asyncio.sleep(0)
                    backend.hurry(name)  # a claim waits for it: the launch's own steps at the normal priority
                    return await task

                started = time.perf_counter()
                handles = await asyncio.gather(*(one(name) for name in names))
                totals.append((time.perf_counter() - started) * 1e3)
                await asyncio.sleep(0.05)  # the spawner's start, the sleep's exec
                for handle in handles:
                    for label, ms in _processes(LocalHandleData.of(handle.data)).items():
                        procs[label].append(ms)
                await asyncio.gather(*(backend.delete(h) for h in handles))
            procs["zygote (its fork, per start)"].append(
                (sum(_run_ns(p) or 0.0 for p in zygote_pids) - zygote_before) / n)
        finally:
            await backend.close()
    print(f"{n} starts, {at_once} at once; load {os.getloadavg()[0]:.1f}")
    print(f"{'step':28} {'wall p50':>9} {'wall p90':>9} {'cpu p50':>8} {'queued p50':>11} {'queued p90':>11}")
    for name, fields in _steps.items():
        wall, cpu, queued = fields["wall"], fields.get("cpu") or [float("nan")], fields.get("queued", [])
        q = (f"{statistics.median(queued):11.2f} {statistics.quantiles(queued, n=10)[-1]:11.2f}"
             if len(queued) >= 2 else "")
        print(f"{name:28} {statistics.median(wall):9.2f} {statistics.quantiles(wall, n=10)[-1]:9.2f} "
              f"{statistics.median(cpu):8.2f} {q}")
    print(f"{'process':28} {'cpu p50 ms':>10} {'cpu p90':>9}")
    for label, values in procs.items():
        p90 = statistics.quantiles(values, n=10)[-1] if len(values) >= 2 else values[0]
        print(f"{label:28} {statistics.median(values):10.2f} {p90:9.2f}")
    print(f"batch wall p50 {statistics.median(totals):.1f} ms")
    out = RESULTS / "fill_breakdown.json"
    out.write_text(json.dumps({
        "starts": n, "at_once": at_once, "load": os.getloadavg()[0],
        "steps": {name: {key: {"p50": statistics.median(v), "n": len(v)} for key, v in fields.items() if v}
                  for name, fields in _steps.items()},
        "processes_cpu_ms": {label: {"p50": statistics.median(v), "n": len(v)} for label, v in procs.items()},
        "batch_wall_p50_ms": statistics.median(totals)}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20, int(sys.argv[2]) if len(sys.argv) > 2 else 1))
