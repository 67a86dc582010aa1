"""A neighbour's bash round trip while other sandboxes misbehave, and the time to stop a fork bomb.

Three local sandboxes of one backend: the neighbour answers ``echo hi`` throughout; a burner
sandbox runs more busy loops than the host has cores; a bomb sandbox runs a fork bomb (at its
pids cap). Measured, in one run: the neighbour's median idle (baseline), while the burner
burns, while the bomb runs (with the burner stopped), and how long deleting the bomb's sandbox
takes. Targets (``docs/security.md`` §2): the neighbour stays within 3x its idle median under each, and the
bomb is gone within 5 s of its sandbox being stopped.

Scheduling latency depends on everything else this host runs: on a machine shared with other
busy processes the ratios say more about them than about the sandboxes (the load average at
the start is recorded).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from pathlib import Path

import httpx

from control_plane.backends.base import Limits, SandboxHandle, SandboxSpec
from control_plane.backends.local import BUILTIN_IMAGE, LocalBackend
from control_plane.models import ServerKind

from ._common import Result, Stats, check_target, stats_table, table

N = int(os.environ.get("BENCH_N", "200"))


def _spec(name: str) -> SandboxSpec:
    return SandboxSpec(server_id=1, generated_name=name, namespace="idegym", image_tag=BUILTIN_IMAGE,
                       server_kind=ServerKind.IDEGYM, run_as_root=False, runtime_class_name=None,
                       container_port=8000, service_port=80, limits=Limits())


def _client(handle: SandboxHandle) -> httpx.Client:
    assert handle.endpoint.unix_socket
    return httpx.Client(transport=httpx.HTTPTransport(uds=handle.endpoint.unix_socket), base_url="http://sandbox",
                        timeout=120)


def _bash(client: httpx.Client, command: str) -> None:
    resp = client.post("/api/tools/bash", json={"command": command, "timeout": 10})
    assert resp.status_code == 200, resp.text


def _echoes(client: httpx.Client, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        _bash(client, "echo hi")
        samples.append(time.perf_counter() - started)
    return samples


def _pids(handle: SandboxHandle) -> int:
    return int(Path(handle.data["cgroups"]["pids"], "pids.current").read_text())


def run() -> Result:
    result = Result("neighbours", "A neighbour's bash p50 next to a CPU burner and a fork bomb; stopping the bomb")
    load = os.getloadavg()[0]
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def call(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(180)

    with tempfile.TemporaryDirectory(prefix="idegym-bench-") as tmp:
        backend = LocalBackend(Path(tmp) / "state", isolation="bwrap")
        call(backend.start())
        made: list[SandboxHandle] = []
        try:
            for name in ("neighbour", "burner", "bomb"):
                made.append(call(backend.create(_spec(name), 120)))
            neighbour, burner, bomb = made
            with _client(neighbour) as c, _client(burner) as b, _client(bomb) as f:
                _echoes(c, 20)  # warm
                idle = _echoes(c, N)
                loops = 2 * (os.cpu_count() or 2)
                _bash(b, f"for i in $(seq {loops}); do (while :; do :; done) >/dev/null 2>&1 & done")
                time.sleep(1.0)
                burning = _echoes(c, N)
                b.post("/api/processes/terminate", json={"graceful_termination_timeout": 0.2})
                _bash(f, "(bomb() { bomb | bomb & }; bomb) </dev/null >/dev/null 2>&1 & exit 0")
                deadline = time.monotonic() + 10
                while _pids(bomb) < 200 and time.monotonic() < deadline:
                    time.sleep(0.05)
                bombing = _echoes(c, N)
                bomb_pids = _pids(bomb)
            started = time.perf_counter()
            call(backend.delete(bomb))
            stop_s = time.perf_counter() - started
            made.remove(bomb)
        finally:
            for handle in made:
                call(backend.delete(handle))
            call(backend.close())
            loop.call_soon_threadsafe(loop.stop)
    stats = [Stats.of("neighbour echo, idle (baseline)", idle), Stats.of("... while a CPU burner runs", burning),
             Stats.of("... while a fork bomb runs", bombing)]
    result.stats = stats
    base = stats[0].median_ms
    result.figures = {"load_average_at_start": round(load, 2), "burner_loops": loops, "bomb_processes": bomb_pids,
                      "bomb_stop_seconds": round(stop_s, 3),
                      "burner_ratio": round(stats[1].median_ms / base, 2),
                      "bomb_ratio": round(stats[2].median_ms / base, 2)}
    result.targets = {
        "burner": check_target("neighbour p50 with a burner / idle p50", stats[1].median_ms / base, 3.0, "x"),
        "bomb": check_target("neighbour p50 with a fork bomb / idle p50", stats[2].median_ms / base, 3.0, "x"),
        "stop": check_target("stopping the fork bomb's sandbox", stop_s, 5.0, "s"),
    }
    print(stats_table(stats, baseline=stats[0].label))
    print(table(["figure", "value"], [[k, v] for k, v in result.figures.items()]))
    if load > 2 * (os.cpu_count() or 1):
        result.notes.append(f"the host was busy (load average {load:.1f} at the start): latency ratios reflect it")
    return result
