"""A sandbox server's move into its cgroups: as a process (``cgroup.procs``) or by its one thread (``tasks``).

On cgroup v1 a move of a process write-locks a lock every fork and exit on the host read-locks,
and that write waits for an RCU grace period unless another move came just before it; a write of
"0" to ``tasks`` moves the writing thread alone and takes no such lock. A forked sandbox server
is single-threaded when it joins its groups (``sandbox_server/zygote.py``), so it moves by its
thread. Alternated in one run: a just-forked 60 MiB process (a server's size) moves itself into a
group of each of the local backend's controllers, 50 ms after the last move, one way or the other;
the figure is the first write of the four (the one that waits).

Measured on this host before the change (the server's own timestamps): 9.7 ms of a forked
server's 19 ms from fork to ready went to its move as a process. A kernel may stop making such
moves wait at all: this host's 6.18 kernel did once the cgroup-v2 option ``favordynmods`` had been
on (a lock per thread group from then on, until a reboot), and then both ways take ~0.03 ms.
Needs root and cgroup v1 controllers.
"""

from __future__ import annotations

import os
import time

from ._common import Result, Stats, stats_table

ROUNDS = int(os.environ.get("BENCH_N", "200")) // 10 or 1
CONTROLLERS = ("memory", "pids", "cpu", "freezer")


def _first_move(groups: list[str], file: str) -> float:
    """Seconds the first write of "0" to ``file`` of ``groups`` by a just-forked 60 MiB process took."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        took = []
        for group in groups:
            fd = os.open(f"{group}/{file}", os.O_WRONLY)
            began = time.perf_counter()
            os.write(fd, b"0")
            took.append(time.perf_counter() - began)
            os.close(fd)
        os.write(write, repr(took[0]).encode())
        os._exit(0)
    os.close(write)
    answer = os.read(read, 100)
    os.close(read)
    os.waitpid(pid, 0)
    return float(answer)


def run() -> Result:
    result = Result("cgroup_moves", "A server's move into its cgroups: as a process or by its one thread")
    ballast = bytearray(60 << 20)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    groups = [f"/sys/fs/cgroup/{c}/idegym-bench-moves" for c in CONTROLLERS if os.path.isdir(f"/sys/fs/cgroup/{c}")]
    for group in groups:
        os.makedirs(group, exist_ok=True)
    ways = {"cgroup.procs": "as a process (cgroup.procs)", "tasks": "by its one thread (tasks)"}
    label = "first move of a just-forked 60 MiB process, {}"
    samples: dict[str, list[float]] = {label.format(way): [] for way in ways.values()}
    try:
        for i in range(ROUNDS):
            for file, way in ways.items():
                for _ in range(5):
                    time.sleep(0.05)
                    samples[label.format(way)].append(_first_move(groups, file))
            print(f"\r  round {i + 1}/{ROUNDS}", end="", flush=True)
        print()
    finally:
        for group in groups:
            os.rmdir(group)
    result.stats = [Stats.of(name, s) for name, s in samples.items()]
    procs, tasks = result.stats
    result.figures["first move by its thread / as a process (median)"] = round(tasks.median_ms / procs.median_ms, 3)
    print(stats_table(result.stats, baseline=procs.label))
    for name, value in result.figures.items():
        print(f"{name}: {value}")
    return result


if __name__ == "__main__":
    run().write()
