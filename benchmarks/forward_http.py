"""The control plane's HTTP for a forward: ``control_plane/forward_protocol.py`` against aiohttp, in
one run, on one control plane and one sandbox.

A connection that carries only forwards is answered below aiohttp; one that carried anything else
first (here a ``GET /health``) is aiohttp's, which then answers its forwards through its request
objects, router and middleware: the same call, the same handler, the two ways interleaved in
blocks. For our client and for a plain ``httpx.Client`` (what the tool-call targets are measured
with), a bash ``true`` call each: the median round trip, and the control plane's CPU per call
(``/proc``, over each way's blocks). This is why the control plane answers forwards with HTTP
code of its own rather than aiohttp's: the difference is paid on every tool call.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from . import _cpu
from ._call_breakdown import processes
from ._common import Result, Stats, stats_table
from ._servers import control_plane

N = int(os.environ.get("BENCH_N", "1000"))
BLOCK = 20


def run() -> Result:
    import httpx

    from idegym_env.client import IdeGymClient
    from idegym_env.client._http import HTTPSession

    result = Result("forward_http", "A forward answered below aiohttp (forward_protocol.py) and by aiohttp")
    with tempfile.TemporaryDirectory() as tmp, control_plane(Path(tmp) / "cp", ["--warm-pool", "0"]) as url, \
            IdeGymClient(url, name="bench") as client:
        sandbox = client.start(reuse="NONE")
        path = f"/api/forward/{client.client_id}/{sandbox.server_id}/api/tools/bash"
        body = b'{"command":"true"}'
        ours = {way: HTTPSession(client.settings.url, auth=client.settings.auth) for way in ("below", "aiohttp")}
        plain = {way: httpx.Client(base_url=client.settings.url, auth=client.settings.auth)
                 for way in ("below", "aiohttp")}
        ours["aiohttp"].request("GET", "/health")  # the connection is aiohttp's from now on
        plain["aiohttp"].get("/health")

        def ours_call(session: HTTPSession) -> Callable[[], object]:
            return lambda: session.request("POST", path, data=body, headers={
                "Content-Type": "application/json", "Prefer": "wait=630"})

        def plain_call(http: httpx.Client) -> Callable[[], object]:
            return lambda: http.post(path, content=body, headers={"Content-Type": "application/json",
                                                                 "Prefer": "wait=630"})

        calls = {
            "our client, below aiohttp": ours_call(ours["below"]),
            "our client, aiohttp": ours_call(ours["aiohttp"]),
            "httpx, below aiohttp": plain_call(plain["below"]),
            "httpx, aiohttp": plain_call(plain["aiohttp"]),
        }
        cp = processes()["control plane"]
        samples: dict[str, list[float]] = {name: [] for name in calls}
        cpu = dict.fromkeys(calls, 0.0)
        for fn in calls.values():
            for _ in range(50):
                fn()
        load = [os.getloadavg()[0]]
        for _ in range(0, N, BLOCK):
            for name, fn in calls.items():
                before = sum(_cpu.own_and_reaped(cp))
                for _ in range(BLOCK):
                    t = time.perf_counter()
                    fn()
                    samples[name].append(time.perf_counter() - t)
                cpu[name] += sum(_cpu.own_and_reaped(cp)) - before
        load.append(os.getloadavg()[0])
        for session in ours.values():
            session.close()
        for http in plain.values():
            http.close()
        sandbox.stop()
    stats = [Stats.of(name, values) for name, values in samples.items()]
    result.stats += stats
    print(stats_table(stats))
    for name in calls:
        per_call = cpu[name] / len(samples[name]) * 1e3
        result.figures[f"control plane CPU per call, {name} ms"] = round(per_call, 3)
        result.figures[f"median, {name} ms"] = round(statistics.median(samples[name]) * 1e3, 3)
        print(f"{name}: median {statistics.median(samples[name]) * 1e3:.3f} ms, control plane CPU {per_call:.3f} ms"
              " per call")
    for who in ("our client", "httpx"):
        saved = result.figures[f"median, {who}, aiohttp ms"] - result.figures[f"median, {who}, below aiohttp ms"]
        result.figures[f"{who}: median saved below aiohttp ms"] = round(saved, 3)
    result.notes.append(f"load average (1 min) {load[0]:.2f} at the start, {load[1]:.2f} at the end")
    return result


if __name__ == "__main__":
    run().write()
