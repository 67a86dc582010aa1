"""Cost of each trainer adapter: one bash tool call (``echo hello``) through TRL's environment
class, SkyRL's text env, the MCP server (the SDK's client over stdio) and Harbor's environment
provider, against the same call made with our client directly, in one run on one control plane.

TRL, SkyRL and MCP are timed round-robin (interleaved) with a direct ``Sandbox.bash`` on a
sandbox of the same image; Harbor runs in its own Python 3.12 venv, where ``env.exec`` is timed
interleaved with ``AsyncSandbox.bash`` on the provider's own sandbox. Target: each adapter at
most 10 % over its direct call (medians).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ._common import Result, Stats, check_target, interleaved, stats_table
from ._servers import control_plane

N = int(os.environ.get("BENCH_N", "300"))
REPO = Path(__file__).resolve().parent.parent
HARBOR_PYTHON = REPO / ".venv-harbor" / "bin" / "python"
TASK = "python-roman-numerals"
DIRECT = "client Sandbox.bash (direct)"
HARBOR_DIRECT = "harbor: AsyncSandbox.bash (direct)"
HARBOR_EXEC = "harbor: IdeGymEnvironment.exec"
MCP_LOCAL = "MCP call_tool bash (in-process SDK client, no transport)"
MCP_FLOOR = "MCP call_tool refused by the SDK's input validation (transport floor)"


def run() -> Result:
    from idegym_env.integrations._episode import close_shared_clients

    result = Result("integrations", "Trainer adapters (TRL, SkyRL, MCP, Harbor) against direct client calls")
    result.notes.append("load average at start: " + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    with tempfile.TemporaryDirectory() as tmp, control_plane(Path(tmp) / "cp", ["--warm-pool", "0"]) as url:
        try:
            samples = _measure(url, 20 * N)
        finally:
            close_shared_clients()
        harbor = _harbor(url)
    stats = [Stats.of(label, s) for label, s in samples.items()]
    if harbor is not None:
        stats += [Stats.of(label, [ms / 1000 for ms in values]) for label, values in harbor.items()]
    result.stats = stats
    print()
    print(stats_table(stats[:6], baseline=DIRECT))
    if harbor is not None:
        print(stats_table(stats[6:], baseline=HARBOR_DIRECT))
    base = stats[0].median_ms
    for s in stats[1:4]:
        name = s.label.split(" ", 1)[0]
        pct = (s.median_ms / base - 1) * 100
        result.figures[f"{name} overhead %"] = round(pct, 2)
        result.targets[name] = check_target(f"{name} adapter overhead over the direct call", pct, 10.0, unit="%")
    medians = {s.label: s.median_ms for s in stats}
    local = medians[MCP_LOCAL]
    result.figures["MCP in-process overhead %"] = round((local / base - 1) * 100, 2)
    result.targets["MCP-in-process"] = check_target("MCP adapter overhead, in-process SDK client (no transport)",
                                                    (local / base - 1) * 100, 10.0, unit="%")
    floor, mcp = medians[MCP_FLOOR], medians["MCP call_tool bash (stdio, SDK client)"]
    beyond = (mcp - floor) / base * 100 - 100
    result.figures["MCP overhead beyond the SDK's tool-call round trip %"] = round(beyond, 2)
    result.figures["MCP SDK tool-call round trip ms"] = round(floor, 3)
    result.targets["MCP-beyond-SDK"] = check_target("MCP overhead beyond the SDK's own tool-call round trip", beyond,
                                                    10.0, unit="%")
    if harbor is not None:
        hdirect, hexec = medians[HARBOR_DIRECT], medians[HARBOR_EXEC]
        pct = (hexec / hdirect - 1) * 100
        result.figures["Harbor overhead %"] = round(pct, 2)
        result.targets["Harbor"] = check_target("Harbor adapter overhead over the direct call", pct, 10.0, unit="%")
    else:
        result.notes.append("Harbor not measured: .venv-harbor is missing (make harbor-venv)")
    result.notes.append("MCP's figure includes the SDK's JSON-RPC over stdio to a server process and a portal "
                        "thread hop in the benchmark; TRL and SkyRL run in-process.")
    for target in result.targets.values():
        print(target["text"])
    return result


def _measure(url: str, steps: int) -> dict[str, list[float]]:
    import anyio.from_thread
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    from idegym_env.client import IdeGymClient
    from idegym_env.env import IdeGymEnv
    from idegym_env.integrations.mcp import EpisodeServer
    from idegym_env.integrations.skyrl import IdeGymTextEnv
    from idegym_env.integrations.trl import IdeGymTRLEnv

    with IdeGymClient(url, name="bench-direct") as client:
        image = IdeGymEnv(TASK, client=client).image  # the task's image, built once
        direct = client.start(image, server_name="bench-direct", reuse="NONE")
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
        with anyio.from_thread.start_blocking_portal() as portal, \
                portal.wrap_async_context_manager(Client(server)) as mcp, \
                portal.wrap_async_context_manager(Client(in_process.mcp)) as local:
            portal.call(mcp.call_tool, "reset", {})
            portal.call(local.call_tool, "reset", {})

            def bash_through(client: Client) -> None:
                answer = portal.call(client.call_tool, "bash", {"command": "echo hello"})
                assert not answer.is_error

            samples = interleaved({
                DIRECT: lambda: direct.bash("echo hello", timeout=120),
                "TRL IdeGymTRLEnv.bash": lambda: trl_env.bash("echo hello"),
                "SkyRL IdeGymTextEnv.step": lambda: sky.step(sky_action),
                "MCP call_tool bash (stdio, SDK client)": lambda: bash_through(mcp),
                MCP_LOCAL: lambda: bash_through(local),
                MCP_FLOOR: lambda: portal.call(mcp.call_tool, "bash", {}),  # refused by the SDK's schema check
            }, N, label="adapters vs direct client call")
        in_process.close()
        trl_env.get_reward()
        sky.close()
        direct.stop()
    return samples


def _harbor(url: str) -> dict[str, list[float]] | None:
    if not HARBOR_PYTHON.exists():
        return None
    proc = subprocess.run([str(HARBOR_PYTHON), "-m", "benchmarks._harbor_steps", url, str(N)], cwd=REPO,
                          capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    if proc.returncode != 0:
        raise RuntimeError(f"the Harbor benchmark failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
