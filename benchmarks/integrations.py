"""Cost of each trainer adapter: one bash tool call (``echo hello``) through TRL's environment
class, SkyRL's text env, the MCP server (the SDK's client over stdio) and Harbor's environment
provider, against the same call made with our client directly, in one run on one control plane.

TRL, SkyRL and MCP are timed round-robin (interleaved) with a direct ``Sandbox.bash`` on a
sandbox of the same image, all in one asyncio loop on one thread: the synchronous calls (direct,
TRL, SkyRL) run inline, the MCP client's calls are awaited, so no sample pays a thread hop that
another does not. The baseline is our fastest direct call, the synchronous client's
(``AsyncSandbox.bash``, over httpx, is timed too, to show it). Harbor runs in its own Python 3.12
venv, where ``env.exec`` is timed interleaved with ``AsyncSandbox.bash`` on the provider's own
sandbox. Target: each adapter at most 10 % over its direct call (medians).

MCP's excess over the direct call is split five ways, each the difference of two rows: the SDK's
client and the stdio pipes (a call to a null server: a hand-written JSON-RPC responder, no SDK,
``_mcp_null_server.py``); the direct call made from a second, mostly idle process (the null
server making the same ``Sandbox.bash`` itself); the SDK's server (a call our handler refuses at
argument validation, before any episode); the call made from an event loop with the async client,
as our server makes it, instead of with blocking reads and writes (the null server making the
direct call so, on uvloop, over it making it inline); and our handler's own work (the rest:
argument parsing, the episode's step over a bare ``AsyncSandbox.bash``, the answer and its
structured content). The first two are what any MCP server
over stdio costs with the SDK's client; the null server making the direct call is that floor.

The same split is made of the CPU time each server process spends per call (the refused calls go
to a second ``idegym mcp serve`` of their own): unlike a latency, it hardly moves with what else
loads the machine.

Where "our handler's own work" goes (``perf_counter_ns`` stamps in the served processes and the
client, 500 calls a row, load 1-3): the handler's path (arguments, episode, the env's step around
the sandbox call, the answer) takes 0.06 ms of CPU between the SDK's dispatch and the answer,
though 13 µs when the same calls run back to back: served, each call finds its caches cold. It
makes the same two loop turns as a bare ``AsyncSandbox.bash``, no garbage collection, and its
sandbox round trip is the bare one's (within 0.04 ms). The SDK's path before and after the handler
costs the refused call as much (0.55 and 0.25 ms). The rest is outside the server: the client
reads and returns an answer of ours 0.02-0.06 ms later than the null server's. A test build whose
handler makes only the bare call left 0.03-0.10 ms (beyond the SDK's round trip 10.8-13.5 % with
the second-process part at 0.24-0.30 ms). Over stdio a running episode's call now starts as soon as
the SDK's own checks pass for it (``idegym_env/integrations/_mcp_early.py``), so its sandbox round
trip overlaps the SDK's dispatch: "our handler's own work" is then what the overlap leaves, and can
come out below zero.

How much it overlaps (stamps in the served process, 320 calls, two runs at load ~2, beyond the SDK's
round trip 4.4 and 2.4 %): from the message reaching the SDK's serving loop, the checks and the
start take 0.17-0.21 ms, the call's own path to its request written 0.24-0.29 ms (0.11 ms back to
back: cold caches again), so the request leaves 0.45 ms after the message; the SDK reaches the
handler 0.34 ms after that, and the sandbox answers 2.3-2.5 ms after it; the answer is written
0.18-0.21 ms later. Only those 0.34 ms overlap. Across full runs the target's figure was 18.5, 16.2 %
before the early start and 13.2, 5.0, 12.4, 9.8, 5.8, 11.5 % since: the part that decides it is the direct call
made from a second process (8-10 %), which a null server making the same call pays too.

``BENCH_INTEGRATIONS=mcp`` runs only the direct calls' and MCP's rows (``integrations_mcp``);
``BENCH_INTEGRATIONS=plugins`` only the framework plug-ins' (``integrations_plugins``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._common import Progress, Result, Stats, check_target, stats_table
from ._cpu import children, seconds_of, spent
from ._plugin_steps import SERVER_CPU
from ._servers import control_plane

N = int(os.environ.get("BENCH_N", "300"))
REPO = Path(__file__).resolve().parent.parent
HARBOR_PYTHON = REPO / ".venv-harbor" / "bin" / "python"
TASK = "python-roman-numerals"
DIRECT = "client Sandbox.bash (direct)"
ASYNC_DIRECT = "client AsyncSandbox.bash (direct, async client)"
TRL = "TRL IdeGymTRLEnv.bash"
SKYRL = "SkyRL IdeGymTextEnv.step"
MCP = "MCP call_tool bash (stdio, SDK client)"
MCP_LOCAL = "MCP call_tool bash (in-process SDK client, no transport)"
MCP_FLOOR = "MCP call_tool refused at argument validation (stdio, SDK client and server, no episode)"
MCP_NULL = "MCP call_tool to a null server (stdio, SDK client only)"
MCP_NULL_DIRECT = "MCP call_tool to a null server making the direct call (stdio: any server's floor)"
MCP_NULL_LOOP = "MCP call_tool to a null server making the direct call with the async client on its event loop"
HARBOR_DIRECT = "harbor: AsyncSandbox.bash (direct)"
HARBOR_EXEC = "harbor: IdeGymEnvironment.exec"
NULL_SERVER = Path(__file__).resolve().parent / "_mcp_null_server.py"
WARMUP = 20  # calls of each row before the measured ones
LOOP_PART = "the call made from an event loop (async client) instead of blocking"


def run() -> Result:
    from idegym_env.integrations._episode import close_shared_clients

    only = os.environ.get("BENCH_INTEGRATIONS")
    if only == "plugins":  # only the framework plug-ins' rows
        return _plugins_only()
    mcp_only = only == "mcp"  # only the direct call's and MCP's rows (results/integrations_mcp.json)
    result = Result("integrations_mcp" if mcp_only else "integrations",
                    "MCP against direct client calls" if mcp_only else
                    "Trainer adapters (TRL, SkyRL, MCP, Harbor) against direct client calls")
    result.notes.append("load average at start: " + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    with tempfile.TemporaryDirectory() as tmp, control_plane(Path(tmp) / "cp", ["--warm-pool", "0"]) as url:
        try:
            samples, cpu = asyncio.run(_measure(url, 20 * N, trainers=not mcp_only))
        finally:
            close_shared_clients()
        harbor = None if mcp_only else _harbor(url)
        plugins = {} if mcp_only else _plugins(url)
    stats = [Stats.of(label, s) for label, s in samples.items()]
    ours = len(stats)
    if harbor is not None:
        stats += [Stats.of(label, [ms / 1000 for ms in values]) for label, values in harbor.items()]
    result.stats = stats
    print()
    print(stats_table(stats[:ours], baseline=DIRECT))
    if harbor is not None:
        print(stats_table(stats[ours:], baseline=HARBOR_DIRECT))
    medians = {s.label: s.median_ms for s in stats}
    base = medians[DIRECT]

    def over(label: str) -> float:
        return (medians[label] / base - 1) * 100

    for label, name in ((TRL, "TRL"), (SKYRL, "SkyRL")) if not mcp_only else ():
        result.figures[f"{name} overhead %"] = round(over(label), 2)
        result.targets[name] = check_target(f"{name} adapter overhead over the direct call", over(label), 10.0,
                                            unit="%")
    # MCP's target is what our server adds beyond the SDK's own round trip (below): its whole
    # overhead, and the in-process SDK client's, are figures.
    result.figures["MCP overhead %"] = round(over(MCP), 2)
    result.figures["async client overhead over the sync client %"] = round(over(ASYNC_DIRECT), 2)
    result.figures["MCP in-process overhead %"] = round(over(MCP_LOCAL), 2)
    # MCP's excess over the direct call, in five parts that add up to it.
    client, floor, mcp = medians[MCP_NULL], medians[MCP_FLOOR], medians[MCP]
    any_server, on_loop = medians[MCP_NULL_DIRECT], medians[MCP_NULL_LOOP]
    parts = {"SDK client and stdio": client,  # the null server
             "direct call from a second process": any_server - client - base,  # the null server making it
             "SDK server": floor - client,  # the refused call, over the null server
             LOOP_PART: on_loop - any_server,  # the null server making it on its loop
             "our handler's own work": mcp - floor - (on_loop - client)}  # the rest
    for part, ms in parts.items():
        result.figures[f"MCP excess: {part} ms"] = round(ms, 3)
        result.figures[f"MCP excess: {part} %"] = round(ms / base * 100, 2)
    # The same split of the server processes' CPU time per call.
    cpu_parts = {"SDK server": cpu[MCP_FLOOR] - cpu[MCP_NULL],
                 LOOP_PART: cpu[MCP_NULL_LOOP] - cpu[MCP_NULL_DIRECT],
                 "our handler's own work": cpu[MCP] - cpu[MCP_FLOOR] - (cpu[MCP_NULL_LOOP] - cpu[MCP_NULL])}
    for label, seconds in cpu.items():
        result.figures[f"server CPU ms per call: {label}"] = round(seconds * 1000, 3)
    for part, seconds in cpu_parts.items():
        result.figures[f"MCP server CPU per call: {part} ms"] = round(seconds * 1000, 3)
    print("MCP server CPU per call: " + ", ".join(f"{part} {s * 1000:.3f} ms" for part, s in cpu_parts.items()))
    result.figures["MCP floor over stdio, any server (null server making the direct call) %"] = round(
        over(MCP_NULL_DIRECT), 2)
    print("MCP's excess over the direct call: " + ", ".join(f"{part} {ms:.2f} ms ({ms / base * 100:.0f} %)"
                                                           for part, ms in parts.items()))
    result.notes.append(f"MCP over stdio: a null server making the direct call itself is {over(MCP_NULL_DIRECT):.0f} % "
                        "over the direct call, the least any server costs with the SDK's client.")
    beyond = (mcp - floor) / base * 100 - 100
    print("beyond the SDK's round trip: " + " + ".join(f"{part} {parts[part] / base * 100:.0f} %" for part in (
        "direct call from a second process", LOOP_PART, "our handler's own work")))
    result.figures["MCP overhead beyond the SDK's tool-call round trip %"] = round(beyond, 2)
    # What is ours of it, the process boundary left out (a null server making the direct call pays it too)
    ours_alone = (parts[LOOP_PART] + parts["our handler's own work"]) / base * 100
    result.figures["MCP beyond the SDK's round trip and the second process's call (the loop and our handler) %"] = \
        round(ours_alone, 2)
    print(f"beyond the SDK's round trip and the second process's call (the loop and our handler): {ours_alone:.1f} %")
    result.figures["MCP SDK tool-call round trip ms"] = round(floor, 3)
    result.targets["MCP-beyond-SDK"] = check_target("MCP overhead beyond the SDK's own tool-call round trip", beyond,
                                                    10.0, unit="%")
    if harbor is not None:
        hdirect, hexec = medians[HARBOR_DIRECT], medians[HARBOR_EXEC]
        pct = (hexec / hdirect - 1) * 100
        result.figures["Harbor overhead %"] = round(pct, 2)
        result.targets["Harbor"] = check_target("Harbor adapter overhead over the direct call", pct, 10.0, unit="%")
    elif not mcp_only:
        result.notes.append("Harbor not measured: .venv-harbor is missing (make harbor-venv)")
    _add_plugins(result, plugins)
    result.notes.append("One asyncio loop times every row but Harbor's: the synchronous calls inline, the MCP "
                        "client's awaited (no thread hop in the benchmark). MCP's stdio figure includes JSON-RPC "
                        "to a server process; TRL and SkyRL run in-process.")
    for target in result.targets.values():
        print(target["text"])
    return result


async def _interleaved(calls: dict[str, Callable[[], Any]], n: int, warmup: int = WARMUP) -> dict[str, list[float]]:
    """``_common.interleaved`` for a mix of plain and async calls, in the running loop."""
    async def once(fn: Callable[[], Any]) -> None:
        answer = fn()
        if asyncio.iscoroutine(answer):
            await answer

    for fn in calls.values():
        for _ in range(warmup):
            await once(fn)
    samples: dict[str, list[float]] = {label: [] for label in calls}
    progress = Progress("adapters vs direct client call", n * len(calls))
    for _ in range(n):
        for label, fn in calls.items():
            started = time.perf_counter()
            await once(fn)
            samples[label].append(time.perf_counter() - started)
            progress.step()
    return samples


async def _measure(url: str, steps: int, trainers: bool = True) -> tuple[dict[str, list[float]], dict[str, float]]:
    """The rows' samples, and the CPU seconds per call of each MCP row's server process
    (``trainers``: TRL's and SkyRL's rows too)."""
    from contextlib import AsyncExitStack

    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    from idegym_env.client import AsyncIdeGymClient, IdeGymClient
    from idegym_env.env import IdeGymEnv
    from idegym_env.integrations.mcp import EpisodeServer
    from idegym_env.integrations.skyrl import IdeGymTextEnv
    from idegym_env.integrations.trl import IdeGymTRLEnv

    with IdeGymClient(url, name="bench-direct") as client:
        image = IdeGymEnv(TASK, client=client).image  # the task's image, built once
        direct = client.start(image, server_name="bench-direct", reuse="NONE")
        rows: dict[str, Callable[[], Any]] = {DIRECT: lambda: direct.bash("echo hello", timeout=120)}
        if trainers:
            trl_env = IdeGymTRLEnv(control_plane_url=url, max_steps=steps)
            trl_env.reset(task=TASK)
            sky = IdeGymTextEnv(env_config={"control_plane_url": url, "max_steps": steps},
                                extras={"task": TASK, "max_turns": steps})
            sky.init([{"role": "user", "content": "go"}])
            sky_action = '<tool_call>{"name": "bash", "arguments": {"command": "echo hello"}}</tool_call>'
        server = StdioServerParameters(command=sys.executable, env={**os.environ}, args=[
            "-m", "idegym_env.cli", "mcp", "serve", "--task", TASK, "--control-plane-url", url,
            "--max-steps", str(steps)])
        in_process = EpisodeServer(task=TASK, control_plane_url=url, max_steps=steps)
        async with AsyncIdeGymClient(url, name="bench-async") as aclient, AsyncExitStack() as stack:
            adirect = await aclient.start(image, server_name="bench-async", reuse="NONE")
            pids: dict[str, int] = {}

            async def started(label: str, params: StdioServerParameters) -> Client:
                before = children()
                client = await stack.enter_async_context(Client(params))
                pids[label], = children() - before
                return client

            mcp = await started(MCP, server)
            mcp_floor = await started(MCP_FLOOR, server)
            local = await stack.enter_async_context(Client(in_process.mcp))
            null = await started(MCP_NULL, StdioServerParameters(command=sys.executable, args=[str(NULL_SERVER)]))
            null_direct = await started(MCP_NULL_DIRECT, StdioServerParameters(
                command=sys.executable, args=[str(NULL_SERVER), url, image], env={**os.environ}))
            null_loop = await started(MCP_NULL_LOOP, StdioServerParameters(
                command=sys.executable, args=[str(NULL_SERVER), url, image, "loop"], env={**os.environ}))
            await mcp.call_tool("reset", {})
            await local.call_tool("reset", {})

            async def bash_through(client: Client) -> None:
                answer = await client.call_tool("bash", {"command": "echo hello"})
                assert not answer.is_error, answer

            async def refused() -> None:
                answer = await mcp_floor.call_tool("bash", {})  # no command: refused before any episode
                assert answer.is_error, answer

            cpu_before = seconds_of(pids)
            try:
                rows[ASYNC_DIRECT] = lambda: adirect.bash("echo hello", timeout=120)
                if trainers:
                    rows.update({TRL: lambda: trl_env.bash("echo hello"), SKYRL: lambda: sky.step(sky_action)})
                samples = await _interleaved({
                    **rows,
                    MCP: lambda: bash_through(mcp),
                    MCP_LOCAL: lambda: bash_through(local),
                    MCP_FLOOR: refused,
                    MCP_NULL: lambda: bash_through(null),
                    MCP_NULL_DIRECT: lambda: bash_through(null_direct),
                    MCP_NULL_LOOP: lambda: bash_through(null_loop),
                }, N)
            finally:
                await adirect.stop()
            cpu = {label: s / (N + WARMUP) for label, s in spent(cpu_before, seconds_of(pids)).items()}
        in_process.close()
        if trainers:
            trl_env.get_reward()
            sky.close()
        direct.stop()
    return samples, cpu


def _harbor(url: str) -> dict[str, list[float]] | None:
    if not HARBOR_PYTHON.exists():
        return None
    proc = subprocess.run([str(HARBOR_PYTHON), "-m", "benchmarks._harbor_steps", url, str(N)], cwd=REPO,
                          capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    if proc.returncode != 0:
        raise RuntimeError(f"the Harbor benchmark failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the framework plug-ins (mini-swe-agent, NeMo Gym, verl, verifiers) ----------------------------

# Each plug-in runs in its venv (benchmarks/_plugin_steps.py), its call interleaved with the direct
# call on its own sandbox; the row is the plug-in's median over that direct call's.
PLUGIN_PYTHONS = {"mini-swe-agent": REPO / ".venv" / "bin" / "python",
                  "nemo-gym": REPO / ".venv-nemo-gym" / "bin" / "python",
                  "verl": REPO / ".venv-verl" / "bin" / "python",
                  "verifiers": REPO / ".venv-verifiers" / "bin" / "python"}


def _plugins(url: str) -> dict[str, dict[str, list[float]] | None]:
    samples: dict[str, dict[str, list[float]] | None] = {}
    for plugin, python in PLUGIN_PYTHONS.items():
        if not python.exists():
            samples[plugin] = None
            continue
        proc = subprocess.run([str(python), "-m", "benchmarks._plugin_steps", plugin, url, str(N)], cwd=REPO,
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"the {plugin} benchmark failed:\n{proc.stderr[-3000:]}")
        samples[plugin] = json.loads(proc.stdout.strip().splitlines()[-1])
    return samples


def _add_plugins(result: Result, plugins: dict[str, dict[str, list[float]] | None]) -> None:
    for plugin, samples in plugins.items():
        if samples is None:
            result.notes.append(f"{plugin} not measured: its venv is missing (make test-deps)")
            continue
        cpu = {label: values[0] for label, values in samples.items() if label.startswith(SERVER_CPU)}
        stats = [Stats.of(label, [ms / 1000 for ms in values]) for label, values in samples.items()
                 if label not in cpu]
        result.stats += stats
        direct, through, *floor = stats
        print(stats_table(stats, baseline=direct.label))
        pct = (through.median_ms / direct.median_ms - 1) * 100
        result.figures[f"{plugin} overhead %"] = round(pct, 2)
        result.targets[plugin] = check_target(f"{plugin} plug-in overhead over the direct call", pct, 10.0, unit="%")
        if floor:  # verifiers' second route: the OpenEnv step; its state and a null OpenEnv server's step split it
            openenv, state, null = floor
            openenv_pct = (openenv.median_ms / direct.median_ms - 1) * 100
            result.figures[f"{plugin} OpenEnv route overhead %"] = round(openenv_pct, 2)
            print(f"{plugin}'s OpenEnv route (the second): {openenv_pct:.1f} % over the direct call")
            for part, ms in _verifiers_parts(direct.median_ms, openenv.median_ms, state.median_ms,
                                             null.median_ms).items():
                result.figures[f"{plugin} excess: {part} ms"] = round(ms, 3)
                result.figures[f"{plugin} excess: {part} %"] = round(ms / direct.median_ms * 100, 2)
                print(f"{plugin}'s excess over the direct call: {part} {ms:.3f} ms "
                      f"({ms / direct.median_ms * 100:.1f} %)")
            null_pct = (null.median_ms / direct.median_ms - 1) * 100
            result.figures[f"{plugin} floor: a null OpenEnv server making the direct call %"] = round(null_pct, 2)
            result.notes.append(f"{plugin}: a null OpenEnv server (openenv-core's app) making the direct call itself "
                                f"is {null_pct:.0f} % over the direct call, the least any OpenEnv server costs.")
            for label, ms in cpu.items():
                result.figures[label] = round(ms, 3)
            # the same split of the servers' CPU per step: a latency moves with the machine's load, this hardly
            own = cpu[SERVER_CPU + openenv.label] - cpu[SERVER_CPU + null.label]
            result.figures[f"{plugin} server CPU per step: our server's own work (ours over the null server) ms"] = \
                round(own, 3)
            print(f"{plugin} server CPU per call: step {cpu[SERVER_CPU + openenv.label]:.3f} ms, state "
                  f"{cpu[SERVER_CPU + state.label]:.3f} ms, null server's step {cpu[SERVER_CPU + null.label]:.3f} ms; "
                  f"our server's own work {own:.3f} ms")


def _verifiers_parts(direct: float, step: float, state: float, null_step: float) -> dict[str, float]:
    """verifiers' OpenEnv route's excess over the direct call (medians, ms) in parts that add up to it: OpenEnv's
    round trip (``state``: no step); the sandbox call made from a second process, on an OpenEnv
    server's loop (a null OpenEnv server making the direct call, over ``state`` and the direct
    call); our server's own work (``IdeGymOpenEnv``, ``IdeGymEnv``'s step, the observation: ours
    over the null server). The last two are the rest beyond OpenEnv's round trip."""
    return {"OpenEnv round trip (state)": state,
            "beyond OpenEnv's round trip": step - state - direct,
            "the call from the server's process (null OpenEnv server)": null_step - state - direct,
            "our server's own work (ours over the null server)": step - null_step}


def _plugins_only() -> Result:
    result = Result("integrations_plugins", "Framework plug-ins (mini-swe-agent, NeMo Gym, verl, verifiers) against "
                                            "direct client calls")
    result.notes.append("load average at start: " + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    with tempfile.TemporaryDirectory() as tmp, control_plane(Path(tmp) / "cp", ["--warm-pool", "0"]) as url:
        _add_plugins(result, _plugins(url))
    for target in result.targets.values():
        print(target["text"])
    return result
