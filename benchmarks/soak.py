"""Soak: many live sandboxes, tens of thousands of tool calls through the control plane.

A control plane on the local backend (loopback only) starts ``BENCH_SOAK_SANDBOXES`` sandboxes
(50) and forwards ``BENCH_SOAK_CALLS`` bash calls (20,000) to them from one worker thread per
sandbox, each call answered inline (``Prefer: wait``) and checked for its own output. While it
runs, the control plane's open file descriptors and resident memory are sampled; the figures
compare the first thousand calls with the last thousand. At the end the client is stopped and
the control plane shut down, and every sandbox process, mount and cgroup must be gone.

The pass criteria (also asserted by ``tests/test_soak.py`` on a shorter run): zero failed
calls, no growth in file descriptors, memory growth within ``RSS_SLACK_MIB``, nothing left.
The baseline is the first window of the same run.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from control_plane.backends.local.layout import state_key
from sandbox_server import procfs

from ._common import Progress, Result, Stats, check_target, stats_table, table
from ._servers import control_plane

SANDBOXES = int(os.environ.get("BENCH_SOAK_SANDBOXES", "50"))
CALLS = int(os.environ.get("BENCH_SOAK_CALLS", "20000"))
WINDOW = 1000  # calls in the first and the last window that are compared
FD_SLACK = 4  # a transient descriptor (a log rotation, a check in flight) is not growth
RSS_SLACK_MIB = 16.0


@dataclass
class Sample:
    calls: int
    fds: int
    rss_kib: int


@dataclass
class SoakReport:
    sandboxes: int
    calls: int
    failures: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    start_seconds: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    window: int = WINDOW

    def _window(self, last: bool) -> list[Sample]:
        if last:
            chosen = [s for s in self.samples if s.calls >= self.calls - self.window]
        else:
            chosen = [s for s in self.samples if self.window // 4 <= s.calls <= self.window]
        return chosen or ([self.samples[-1]] if last else self.samples[:1])

    @property
    def fds_first(self) -> int:
        return max(s.fds for s in self._window(False))

    @property
    def fds_last(self) -> int:
        return max(s.fds for s in self._window(True))

    @property
    def rss_first_mib(self) -> float:
        return statistics.median(s.rss_kib for s in self._window(False)) / 1024

    @property
    def rss_last_mib(self) -> float:
        return statistics.median(s.rss_kib for s in self._window(True)) / 1024

    def problems(self) -> list[str]:
        out = []
        if self.failures:
            out.append(f"{len(self.failures)} failed calls, e.g. {self.failures[:3]}")
        if self.fds_last > self.fds_first + FD_SLACK:
            out.append(f"open descriptors grew from {self.fds_first} to {self.fds_last}")
        if self.rss_last_mib > self.rss_first_mib + RSS_SLACK_MIB:
            out.append(f"resident memory grew from {self.rss_first_mib:.1f} to {self.rss_last_mib:.1f} MiB")
        if self.leftovers:
            out.append(f"left behind: {self.leftovers[:5]}")
        return out


def _proc_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _proc_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _listening_pid(port: int) -> int:
    """The control plane's pid, from the socket listening on ``port``."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        parts = line.split()
        if parts[3] == "0A" and int(parts[1].split(":")[1], 16) == port:
            inode = parts[9]
            break
    assert inode is not None, f"nothing listens on port {port}"
    target = f"socket:[{inode}]"
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if any(os.readlink(fd.path) == target for fd in os.scandir(f"/proc/{entry.name}/fd")):
                    return int(entry.name)
            except OSError:
                continue
    raise AssertionError(f"no process holds {target}")


def leftovers(state: Path) -> list[str]:
    """Everything of the control plane's sandboxes still on the host."""
    found = [f"process {pid}" for pid in procfs.pids_with_cmdline(str(state))]
    found += [f"mount {line.split()[4]}" for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if str(state) in line]
    sandboxes = state / "sandboxes"
    if sandboxes.is_dir():
        found += [f"sandbox directory {e.name}" for e in os.scandir(sandboxes)]
    found += [f"cgroup {path}" for path in Path("/sys/fs/cgroup").glob(f"*/idegym/{state_key(state)}*/*")
              if path.is_dir()]
    return found


def soak(state: Path, sandboxes: int = SANDBOXES, calls: int = CALLS, progress: bool = True,
         window: int = WINDOW) -> SoakReport:
    """The soak itself (``state`` must not exist yet); used by ``run`` and the test suite."""
    report = SoakReport(sandboxes, calls, window=window)
    state.parent.mkdir(parents=True, exist_ok=True)
    with control_plane(state, ["--warm-pool", "0", "--max-servers", str(sandboxes + 10),
                               "--watch-interval", "1"]) as url:
        cp_pid = _listening_pid(int(url.rsplit(":", 1)[1]))
        http = httpx.Client(base_url=url, timeout=120)
        client_id = http.post("/api/clients", json={"name": "soak", "nodes_count": 0}).json()["id"]
        started = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            ids = list(pool.map(lambda _: _start(http, client_id), range(sandboxes)))
        report.start_seconds = time.perf_counter() - started
        done = [0]
        lock = threading.Lock()
        stop = threading.Event()
        bar = Progress(f"{calls} calls to {sandboxes} sandboxes", calls) if progress else None

        def sampler() -> None:
            while not stop.is_set():
                try:
                    report.samples.append(Sample(done[0], _proc_fds(cp_pid), _proc_rss_kib(cp_pid)))
                except OSError:
                    return
                stop.wait(0.05)

        def worker(index: int) -> None:
            share = calls // sandboxes + (1 if index < calls % sandboxes else 0)
            sid = ids[index]
            with httpx.Client(base_url=url, timeout=120) as mine:
                for n in range(share):
                    token = f"{index}-{n}"
                    t = time.perf_counter()
                    try:
                        resp = mine.post(f"/api/forward/{client_id}/{sid}/api/tools/bash",
                                         json={"command": f"echo {token}"}, headers={"Prefer": "wait=120"})
                        body = resp.json() if resp.status_code == 200 else None
                        if body is None or body.get("stdout") != f"{token}\n" or body.get("exit_code") != 0:
                            report.failures.append(f"{token}: {resp.status_code} {resp.text[:200]}")
                    except httpx.HTTPError as exc:
                        report.failures.append(f"{token}: {type(exc).__name__} {exc}")
                    elapsed = time.perf_counter() - t
                    with lock:
                        report.latencies.append(elapsed)
                        done[0] += 1
                    if bar is not None:
                        bar.step()

        sampling = threading.Thread(target=sampler, daemon=True)
        sampling.start()
        started = time.perf_counter()
        with ThreadPoolExecutor(sandboxes) as pool:
            list(pool.map(worker, range(sandboxes)))
        report.seconds = time.perf_counter() - started
        report.samples.append(Sample(done[0], _proc_fds(cp_pid), _proc_rss_kib(cp_pid)))
        stop.set()
        sampling.join(5)
        op = http.request("DELETE", "/api/clients", json={"client_id": client_id}).json()["operation_id"]
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if http.get(f"/api/operations/status/{op}").json()["status"] != "IN_PROGRESS":
                break
            time.sleep(0.2)
        http.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and leftovers(state):
        time.sleep(0.2)
    report.leftovers = leftovers(state)
    return report


def _start(http: httpx.Client, client_id: str) -> int:
    resp = http.post("/api/idegym-servers", json={"client_id": client_id, "image_tag": "idegym/builtin:latest",
                                                  "reuse_strategy": "NONE"}, headers={"Prefer": "wait=300"})
    assert resp.status_code == 200, resp.text
    return json.loads(resp.text)["server_id"]


def run() -> Result:
    result = Result("soak", f"Soak: {SANDBOXES} sandboxes, {CALLS} tool calls through the control plane")
    with tempfile.TemporaryDirectory() as tmpdir:
        report = soak(Path(tmpdir) / "cp")
    stats = Stats.of("bash call through the control plane", report.latencies)
    result.stats.append(stats)
    figures: dict[str, Any] = {
        "sandboxes": report.sandboxes, "calls": report.calls, "failed calls": len(report.failures),
        "calls per second": round(report.calls / report.seconds, 1), "seconds": round(report.seconds, 1),
        "sandbox start seconds (all)": round(report.start_seconds, 1),
        "control plane fds, first 1000 calls": report.fds_first, "control plane fds, last 1000 calls": report.fds_last,
        "control plane RSS MiB, first 1000 calls": round(report.rss_first_mib, 1),
        "control plane RSS MiB, last 1000 calls": round(report.rss_last_mib, 1),
        "left behind": len(report.leftovers),
    }
    result.figures.update(figures)
    print()
    print(stats_table([stats]))
    print()
    print(table(["figure", "value"], [[k, v] for k, v in figures.items()]))
    problems = report.problems()
    result.targets["failed_calls"] = check_target("failed calls", len(report.failures), 0, unit="calls")
    result.targets["fd_growth"] = check_target("fd growth, first to last 1000 calls",
                                               report.fds_last - report.fds_first, FD_SLACK, unit="fds")
    result.targets["rss_growth"] = check_target("RSS growth, first to last 1000 calls",
                                                report.rss_last_mib - report.rss_first_mib, RSS_SLACK_MIB, unit="MiB")
    result.targets["left_behind"] = check_target("processes, mounts, directories left", len(report.leftovers), 0,
                                                 unit="items")
    for target in result.targets.values():
        print(target["text"])
    result.notes += problems
    return result


if __name__ == "__main__":
    run().write()
