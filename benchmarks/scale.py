"""1,000 live sandboxes on this host: start rate, memory, tool calls across all of them, stop, leftovers.

One control plane with its default configuration but ``--max-servers`` (the one limit a user
raises for this: by default 200 sandboxes run at once) starts ``BENCH_SCALE_MAX`` sandboxes
(1,000) through its API, ``BENCH_SCALE_STARTS`` (8) at a time, as a trainer would. At each
checkpoint the proportional set size of every process the sandboxes cost is summed: every
descendant of the control plane (bubblewrap, each sandbox's init, its lease monitor, the
template process servers are forked from, the warm pool's sandboxes) and every process in the
sandboxes' cgroups; the control plane's own is reported beside it, and so are the launch's
steps (its record of each start) and, at the end, the CPU all of them use while idle. Then every sandbox answers
a bash call, ``ROUNDS`` rounds with ``BENCH_SCALE_CALLS`` (32) calls in flight; all are stopped;
and once the control plane has exited nothing of them may be left: no process, cgroup, mount,
loop device or directory. Writes a PNG of memory and start latency against the number live.
Targets: PSS per idle sandbox <= 8 MiB at 1,000 live (and at 200), nothing left.

Stops early (and cleans up) if the host's available memory falls below ``MIN_AVAILABLE_GIB``.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from ._common import RESULTS, Progress, Result, Stats, check_target, percentile, stats_table, table
from ._servers import control_plane
from .lifecycle import _descendants, _pss_kib

TOTAL = int(os.environ.get("BENCH_SCALE_MAX", "1000"))
STARTS_IN_FLIGHT = int(os.environ.get("BENCH_SCALE_STARTS", "8"))
CALLS_IN_FLIGHT = int(os.environ.get("BENCH_SCALE_CALLS", "32"))
ROUNDS = 3
IDLE_SECONDS = 15.0  # (the lease monitors wake every 30 s each: 1,000 of them about 33 a second)
CHECKPOINTS = sorted({c for c in (1, 10, 50, 100, 200, 300, 500, 750, 1000) if c <= TOTAL} | {TOTAL})
TARGETS_AT, TARGET_MIB = (200, 1000), 8.0
MIN_AVAILABLE_GIB = 4.0


STEPS = ("prepare p50 ms", "spawn p50 ms", "server start p50 ms", "launch p50 ms")
POINT_KEYS = ("sandboxes", "total_mib", "per_sandbox_mib", "control_plane_mib", "processes", "start_p50_ms",
              "start_p95_ms", "prepare_p50_ms", "spawn_p50_ms", "server_start_p50_ms", "total_p50_ms", "available_gib")


NOTE = (f"Starts run {STARTS_IN_FLIGHT} at a time and calls {CALLS_IN_FLIGHT}, so each waits on the others; absolute "
        "times follow the host's load (its load average before and after is a figure), so compare the "
        "checkpoints and the launch's steps within one run. PSS counts every process a sandbox costs: its "
        "bubblewrap, init, server, spawner and lease monitor, and a share of the template process.")


class LowMemory(RuntimeError):
    pass


def _available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024 / 1024
    return float("inf")


def _guard_memory() -> None:
    if (gib := _available_gib()) < MIN_AVAILABLE_GIB:
        raise LowMemory(f"only {gib:.1f} GiB of memory available (the floor is {MIN_AVAILABLE_GIB:g}): stopped")


def _control_plane_pid(state: Path) -> int:
    marker = str(state).encode()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes()
            except OSError:
                continue
            if b"-m\0control_plane" in cmd and marker in cmd:
                return int(entry.name)
    raise RuntimeError(f"no control plane of {state} runs")


def _cgroup_pids(key: str) -> set[int]:
    """The processes in the control plane's cgroups; groups come and go meanwhile (warm-pool
    fills), so a walk skips what vanished under it (a glob raised FileNotFoundError)."""
    pids: set[int] = set()
    for top in Path("/sys/fs/cgroup").glob(f"*/idegym/{key}"):
        for root, _, files in os.walk(top):
            if "cgroup.procs" in files:
                try:
                    pids.update(int(p) for p in Path(root, "cgroup.procs").read_text().split())
                except OSError:
                    continue
    return pids


def _memory(state: Path, key: str, plane: int) -> tuple[float, float, int]:
    """MiB (PSS) of everything the sandboxes cost, of the control plane itself, and how many processes."""
    pids = (_descendants({plane}) | _cgroup_pids(key)) - {plane}
    return sum(_pss_kib(p) for p in pids) / 1024, _pss_kib(plane) / 1024, len(pids)


def _leftovers(state: Path, key: str, run_root: Path) -> dict[str, int]:
    marker = str(state).encode()
    processes = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                processes += marker in Path(f"/proc/{entry.name}/cmdline").read_bytes()
            except OSError:
                continue
    loops = 0
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            loops += backing.read_text().startswith(str(state))
        except OSError:
            continue
    sandboxes = state / "sandboxes"
    return {
        "processes": processes + len(_cgroup_pids(key)),
        "cgroups": len([d for d in Path("/sys/fs/cgroup").glob(f"*/idegym/{key}/*") if d.is_dir()]),
        "mounts": sum(str(state) in line or str(run_root) in line
                      for line in Path("/proc/self/mountinfo").read_text().splitlines()),
        "loop devices": loops,
        "directories": (len(list(sandboxes.iterdir())) if sandboxes.exists() else 0)
        + (len(list(run_root.iterdir())) if run_root.exists() else 0),
    }


def _new_timings(state: Path, seen: set[str]) -> dict[str, float]:
    """Median of each step of the starts of sandboxes not in ``seen`` (the launcher's record of
    each: prepare on the host, spawn bubblewrap and fork the server, the server's start)."""
    from control_plane.backends.local.layout import read_meta

    steps: dict[str, list[float]] = {}
    for sb in (state / "sandboxes").iterdir():
        if sb.name in seen:
            continue
        data = read_meta(sb)
        if data is None or not data.timings_ms:
            continue
        seen.add(sb.name)
        for step, ms in data.timings_ms.items():
            steps.setdefault(step, []).append(ms)
    return {f"{step}_p50_ms": round(percentile(sorted(ms), 50), 1) for step, ms in steps.items()}


def _cpu_seconds(pids: set[int]) -> float:
    """CPU time of ``pids`` and of their children they reaped (a lease monitor's ``sleep``)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


async def _idle_cpu(state: Path, key: str, plane: int, seconds: float) -> tuple[float, float]:
    """Percent of one CPU the sandboxes' processes and the control plane used while all sat idle."""
    pids = (_descendants({plane}) | _cgroup_pids(key)) - {plane}
    before, plane_before, t = _cpu_seconds(pids), _cpu_seconds({plane}), time.monotonic()
    await asyncio.sleep(seconds)
    elapsed = time.monotonic() - t
    return ((_cpu_seconds(pids) - before) / elapsed * 100, (_cpu_seconds({plane}) - plane_before) / elapsed * 100)


async def _in_flight(n: int, items: list[Any], work: Any, progress: Progress) -> list[float]:
    """``work(item)`` for every item, ``n`` at a time; the seconds each took, in order."""
    took = [0.0] * len(items)
    queue = list(enumerate(items))
    queue.reverse()

    async def worker() -> None:
        while queue:
            i, item = queue.pop()
            t = time.perf_counter()
            await work(item)
            took[i] = time.perf_counter() - t
            progress.step()

    await asyncio.gather(*(worker() for _ in range(min(n, len(items)))))
    return took


async def _drive(url: str, state: Path, key: str, out: dict[str, Any]) -> None:
    from idegym_env.client import AsyncIdeGymClient

    plane = _control_plane_pid(state)
    async with AsyncIdeGymClient(url, name="bench-scale") as client:
        await (await client.start(reuse="NONE")).stop()  # the template process and the image's caches
        live: list[Any] = []
        points, starts = out["points"], out["starts"]
        started = time.perf_counter()
        previous = 0
        seen: set[str] = set()
        for checkpoint in CHECKPOINTS:
            _guard_memory()

            async def start(_: int) -> None:
                live.append(await client.start(reuse="NONE"))

            took = await _in_flight(STARTS_IN_FLIGHT, list(range(checkpoint - previous)), start,
                                    Progress(f"starting sandboxes {previous + 1}-{checkpoint}", checkpoint - previous))
            starts.extend(took)
            previous = checkpoint
            out["start seconds"] = time.perf_counter() - started
            sandboxes_mib, plane_mib, processes = _memory(state, key, plane)
            ms = sorted(t * 1000 for t in took)
            points.append({"sandboxes": checkpoint, "total_mib": round(sandboxes_mib, 1),
                           "per_sandbox_mib": round(sandboxes_mib / checkpoint, 2),
                           "control_plane_mib": round(plane_mib, 1), "processes": processes,
                           "start_p50_ms": round(percentile(ms, 50), 1), "start_p95_ms": round(percentile(ms, 95), 1),
                           **_new_timings(state, seen), "available_gib": round(_available_gib(), 1)})
            print(f"  {points[-1]}", flush=True)
        out["idle cpu"] = await _idle_cpu(state, key, plane, IDLE_SECONDS)
        out["calls"] = []
        for r in range(ROUNDS):
            _guard_memory()

            async def call(sandbox: Any) -> None:
                reply = await sandbox.bash("echo hi")
                if reply.stdout.strip() != "hi":
                    raise RuntimeError(f"a sandbox answered {reply!r}")

            t = time.perf_counter()
            took = await _in_flight(CALLS_IN_FLIGHT, live, call, Progress(f"round {r + 1}: a bash call each", TOTAL))
            out["calls"].append((time.perf_counter() - t, took))
        # Served a call, a sandbox also has its tool user's spawner (sandbox_server/native/spawner.c).
        out["used mib"] = _memory(state, key, plane)[0] / TOTAL
        out["plane fds"] = len(os.listdir(f"/proc/{plane}/fd"))
        out["plane fd limit"] = next(line.split()[3] for line in Path(f"/proc/{plane}/limits").read_text().splitlines()
                                     if line.startswith("Max open files"))

        async def stop(sandbox: Any) -> None:
            await sandbox.stop()

        t = time.perf_counter()
        await _in_flight(STARTS_IN_FLIGHT, live, stop, Progress("stopping them", TOTAL))
        out["stop seconds"] = time.perf_counter() - t


def run() -> Result:
    from control_plane.backends.local.layout import pick_run_root, state_key

    result = Result("scale", f"{TOTAL} live sandboxes: start rate, memory, tool calls across all, stop, leftovers")
    out: dict[str, Any] = {"points": [], "starts": []}
    load = os.getloadavg()  # absolute times follow the host's load: other work shares its CPUs
    with tempfile.TemporaryDirectory() as tmpdir:
        state = Path(tmpdir) / "cp"
        key = state_key(state)
        flags = ["--max-servers", str(TOTAL + 10)]
        try:
            with control_plane(state, flags) as url:
                asyncio.run(_drive(url, state, key, out))
        except LowMemory as exc:
            result.notes.append(str(exc))
            print(f"\n{exc}")
        # After the control plane's exit: nothing of any sandbox may be left.
        left = _leftovers(state, key, pick_run_root(state, key))
    points = out["points"]
    reached = points[-1]["sandboxes"] if points else 0
    result.notes.append(NOTE)
    result.figures["control plane flags beyond the defaults"] = " ".join(flags)
    result.figures["load average before, after (1 min)"] = f"{load[0]:.1f}, {os.getloadavg()[0]:.1f}"
    result.figures["starts in flight"] = STARTS_IN_FLIGHT
    result.figures["points"] = points
    result.figures["live sandboxes reached"] = reached
    result.figures["left after stopping"] = left
    for what, count in left.items():
        result.figures[f"{what} left"] = count
    print()
    print(table(["live", "PSS of sandboxes MiB", "per sandbox MiB", "control plane MiB", "processes",
                 "start p50 ms", "start p95 ms", *STEPS, "available GiB"],
                [[p.get(k, "") for k in POINT_KEYS] for p in points]))
    if "calls" in out:
        start_stats = Stats.of(f"start, {STARTS_IN_FLIGHT} in flight, 1 to {TOTAL} live", out["starts"])
        call_stats = Stats.of(f"bash call, {CALLS_IN_FLIGHT} in flight, {TOTAL} live", [s for _, r in out["calls"]
                                                                                        for s in r])
        result.stats = [start_stats, call_stats]
        calls_per_second = [round(len(r) / seconds, 1) for seconds, r in out["calls"]]
        result.figures["start rate sandboxes/s"] = round(TOTAL / out["start seconds"], 2)
        for r, rate in enumerate(calls_per_second, 1):
            result.figures[f"bash calls/s across all {TOTAL}, round {r}"] = rate
        result.figures["stop seconds"] = round(out["stop seconds"], 2)
        result.figures["stop rate sandboxes/s"] = round(TOTAL / out["stop seconds"], 2)
        result.figures[f"PSS per sandbox after a call each at {TOTAL} live MiB"] = round(out["used mib"], 2)
        result.figures[f"control plane descriptors after a call to each of {TOTAL}"] = out["plane fds"]
        result.figures[f"CPU of {TOTAL} idle sandboxes, % of one core"] = round(out["idle cpu"][0], 1)
        result.figures[f"CPU of the control plane with {TOTAL} idle, % of one core"] = round(out["idle cpu"][1], 1)
        result.figures["control plane descriptor limit (soft)"] = out["plane fd limit"]
        print()
        print(stats_table(result.stats))
        print(f"\n{TOTAL} sandboxes: started at {result.figures['start rate sandboxes/s']}/s; "
              f"bash calls across all: {calls_per_second}/s; stopped in {out['stop seconds']:.1f} s; "
              f"PSS per sandbox after a call each: {out['used mib']:.2f} MiB")
    print(f"left after stopping: {left}")
    for at in TARGETS_AT:
        point = next((p for p in points if p["sandboxes"] == at), None)
        if at <= TOTAL:
            value = point["per_sandbox_mib"] if point else float("inf")
            result.targets[f"memory_{at}"] = check_target(f"PSS per idle sandbox at {at} live", value, TARGET_MIB,
                                                          "MiB")
    result.targets["reached"] = check_target("live sandboxes reached", reached, TOTAL, "sandboxes",
                                             lower_is_better=False)
    result.targets["left"] = check_target("processes, cgroups, mounts, loop devices, directories left",
                                          sum(left.values()), 0, "items")
    for target in result.targets.values():
        print(f"- {target['text']}")
    if points:
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
    left.set_ylabel("memory of all sandboxes (GiB, PSS)", color="tab:blue")
    right = left.twinx()
    right.plot(xs, [p["start_p50_ms"] for p in points], "s--", color="tab:red", label="start p50 (ms)")
    right.plot(xs, [p["start_p95_ms"] for p in points], "^:", color="tab:orange", label="start p95 (ms)")
    right.set_ylabel(f"start latency, {STARTS_IN_FLIGHT} in flight (ms)", color="tab:red")
    right.legend(loc="upper left")
    left.set_title("IdeGym local backend: memory and start latency vs live sandboxes")
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(RESULTS / "scale.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    run().write()
