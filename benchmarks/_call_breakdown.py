"""Where one forwarded tool call's time goes, measured on the running processes, not guessed.

For a block of calls made one after another by one caller:

* the caller's own CPU (``time.thread_time``): building and serialising the request, its HTTP,
  parsing and validating the answer;
* the control plane's handler time and its round trip to the sandbox: the sums of its own
  Prometheus histograms (``idegym_http_request_seconds`` of the forward route, measured by
  ``forward_protocol`` from a whole request to its answer, or by the middleware on a connection
  aiohttp serves; ``idegym_forward_seconds``), read from ``/metrics`` before and after;
* the command's time in the sandbox (``duration_seconds`` of each answer: from the server asking
  the tool user's spawner to start it until it exited and its pipes closed);
* the CPU each process spent per call (``_cpu.seconds_of``): control plane, sandbox server,
  spawner; and how often each went to sleep (its voluntary context switches): each sleep
  on the way is a wake-up to wait for, a scheduler's latency on a loaded machine.

What is left between them is the wire and the wake-ups: caller ↔ control plane (and aiohttp's
parsing and writing outside the handler), control plane ↔ sandbox server (and the server's HTTP,
validation and reply). Means, not medians: the histograms give sums.

A turn of a process's event loop between a callback and the task it wakes is no sleep: taking the
task's step in the callback itself (a shim over asyncio's task, in the sandbox server and the
control plane: four turns an isolated call) gave nothing end to end (6 rounds of 400 calls,
alternated with main, load 5-13) and cost more in a hot loop (web.py alone: 38-42 us a request
against 34-37, server CPU +3 us): the task's own wake-up still runs. Only fewer sleeps, or less
work, pay: web.py's layer over its parser (a task per connection, the dispatch's coroutines,
request and answer objects, the answer's head checked and built) costs 31-37 us of the server's
CPU a request in a hot loop, where a protocol that parses with the same ``request_head`` and
answers in ``data_received`` costs 14-17 (6 rounds of 2,000, load ~15): a route answered without
a task, in the server and in the control plane, is where the CPU left to cut is.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from . import _cpu

FORWARD_ROUTE = "/api/forward/{client_id}/{server_id}/{path}"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def processes() -> dict[str, int]:
    """This process's control plane (its child) and, below it, the one sandbox's server and spawner."""
    cps = [p for p in _cpu.children() if "-m control_plane" in _cmdline(p)]
    if len(cps) != 1:
        return {}
    found = {"caller": os.getpid(), "control plane": cps[0]}
    pids = [int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit()]
    spawners = [p for p in pids if "idegym-spawner" in _cmdline(p) and _below(p, cps[0])]
    if len(spawners) == 1:
        found["sandbox server"], found["spawner"] = _cpu.parent(spawners[0]), spawners[0]
    return found


def _below(pid: int, ancestor: int) -> bool:
    for _ in range(64):
        pid = _cpu.parent(pid)
        if pid in (0, 1):
            return False
        if pid == ancestor:
            return True
    return False


def sleeps(pid: int) -> int:
    """How often the process went to sleep so far (its threads' voluntary context switches)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "status").read_text().split("\nvoluntary_ctxt_switches:", 1)[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total


def _histogram_sum(text: str, name: str, labels: str = "") -> tuple[float, float]:
    """(sum, count) of a Prometheus histogram series (``labels`` a substring of its label set)."""
    values = {}
    for kind in ("sum", "count"):
        pattern = re.compile(rf"^{name}_{kind}(\{{.*\}})? ([0-9.e+-]+)$", re.MULTILINE)
        values[kind] = sum(float(m.group(2)) for m in pattern.finditer(text) if labels in (m.group(1) or ""))
    return values["sum"], values["count"]


def _metrics(url: str, auth: tuple[str, str] | None) -> tuple[tuple[float, float], tuple[float, float]]:
    text = httpx.get(url.rstrip("/") + "/metrics", auth=auth, timeout=30).text
    return (_histogram_sum(text, "idegym_http_request_seconds", f'route="{FORWARD_ROUTE}"'),
            _histogram_sum(text, "idegym_forward_seconds"))


def breakdown(call: Callable[[], float], n: int, url: str, auth: tuple[str, str] | None) -> dict[str, float]:
    """``n`` calls of ``call`` (which returns the command's ``duration_seconds``), in ms per call."""
    for _ in range(20):
        call()
    pids = processes()
    cpu_before, sleeps_before = _cpu.seconds_of(pids), {name: sleeps(pid) for name, pid in pids.items()}
    handler_before, forward_before = _metrics(url, auth)
    own_before, wall_before = time.thread_time(), time.perf_counter()
    command = 0.0
    for _ in range(n):
        command += call()
    wall, own = time.perf_counter() - wall_before, time.thread_time() - own_before
    handler_after, forward_after = _metrics(url, auth)
    cpu_after, sleeps_after = _cpu.seconds_of(pids), {name: sleeps(pid) for name, pid in pids.items()}
    calls = handler_after[1] - handler_before[1]
    assert calls >= n, f"the control plane counted {calls} forwards of the {n} made"
    ms = 1e3 / n
    total, caller = wall * ms, own * ms
    handler = (handler_after[0] - handler_before[0]) * 1e3 / calls
    round_trip = (forward_after[0] - forward_before[0]) * 1e3 / (forward_after[1] - forward_before[1])
    command_ms = command * ms
    return {
        "total": total,
        "caller's own CPU (request, HTTP, answer's validation)": caller,
        "caller <-> control plane: wire, wake-ups, aiohttp outside the handler": total - caller - handler,
        "control plane handler (middlewares: auth, limits; the forward's own work)": handler - round_trip,
        "control plane <-> sandbox server: wire, wake-ups, the server's HTTP, validation, reply": round_trip
        - command_ms,
        "the command in the sandbox (spawner, fork/exec as the tool user, bash, exit, pipes)": command_ms,
        **{f"CPU of the {name}": (cpu_after[name] - cpu_before[name]) * ms for name in pids if name != "caller"},
        **{f"sleeps of the {name} (count)": (sleeps_after[name] - sleeps_before[name]) / n for name in pids},
    }
