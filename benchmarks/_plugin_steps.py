"""Run by ``benchmarks/integrations.py``, each plug-in in its own venv: one bash call (``echo hello``)
through the plug-in's per-call path, interleaved with the same call made with our client directly
on the plug-in's own sandbox (verifiers' OpenEnv rows: on sandboxes of the same image, as their
episodes live in the OpenEnv servers' processes); prints the samples (ms) as JSON.

``python -m benchmarks._plugin_steps PLUGIN URL N`` with PLUGIN one of ``mini-swe-agent``
(``IdeGymEnvironment.execute``), ``nemo-gym`` (NeMo Gym's ``AsyncSandbox.exec`` on the provider),
``verl`` (``IdeGymAgentLoop``'s bash tool: a verl ``BaseTool.execute``) and ``verifiers`` (our
native taskset's per-action work, ``IdeGymVerifiersEnv.act``: what its ``run()`` does with each
model reply; then the second route, the OpenEnv client's ``step``, what verifiers' OpenEnv taskset
sends per action, against ``idegym openenv serve``; also the client's ``state``, a message and its
answer with no step: OpenEnv's own round trip, the floor any OpenEnv server has; and the step
through a null OpenEnv server, ``_openenv_null_server.py``, that makes the direct call itself)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ._cpu import seconds_of
from ._servers import _wait_ready

REPO = Path(__file__).resolve().parent.parent
VERIFIERS_NATIVE = "verifiers: IdeGymVerifiersEnv.act (the native taskset's action)"
VERIFIERS_STEP = "verifiers: OpenEnv client step (its OpenEnv taskset's call)"
VERIFIERS_FLOOR = "verifiers: OpenEnv client state (OpenEnv's round trip, no step)"
SERVER_CPU = "server CPU ms per call: "
VERIFIERS_NULL = "verifiers: OpenEnv client step, null OpenEnv server making the direct call (any server's floor)"
TASK = "python-roman-numerals"
WARMUP = 20


async def interleaved(calls: dict[str, Callable[[], Any]], n: int,
                      cpu_of: dict[str, int] | None = None) -> dict[str, list[float]]:
    """The calls round-robin, ``n`` samples (ms) of each; with ``cpu_of`` (label: a server's pid)
    also, as ``SERVER_CPU + label``, the CPU milliseconds that server spent per call of the row
    (read around each call: a server's CPU hardly moves with what else loads the machine)."""
    async def once(fn: Callable[[], Any]) -> None:
        answer = fn()
        if isinstance(answer, Awaitable):
            await answer

    for fn in calls.values():
        for _ in range(WARMUP):
            await once(fn)
    cpu_of = cpu_of or {}
    samples: dict[str, list[float]] = {label: [] for label in calls}
    cpu = dict.fromkeys(cpu_of, 0.0)
    for _ in range(n):
        for label, fn in calls.items():
            before = seconds_of({label: cpu_of[label]}) if label in cpu_of else None
            started = time.perf_counter()
            await once(fn)
            samples[label].append((time.perf_counter() - started) * 1000)
            if before is not None:
                cpu[label] += seconds_of({label: cpu_of[label]})[label] - before[label]
    return {**samples, **{SERVER_CPU + label: [seconds / n * 1000] for label, seconds in cpu.items()}}


async def mini_swe_agent(url: str, n: int) -> dict[str, list[float]]:
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    from idegym_env.integrations.mini_swe_agent import IdeGymEnvironment

    env = IdeGymEnvironment(task=TASK, control_plane_url=url)
    sandbox = env.episode.env.sandbox
    try:
        return await interleaved({"mini-swe-agent: Sandbox.bash (direct)": lambda: sandbox.bash("echo hello"),
                                  "mini-swe-agent: IdeGymEnvironment.execute":
                                      lambda: env.execute({"command": "echo hello"})}, n)
    finally:
        env.cleanup()


async def nemo_gym(url: str, n: int) -> dict[str, list[float]]:
    from nemo_gym.sandbox import AsyncSandbox, SandboxSpec

    box = await AsyncSandbox({"idegym": {"control_plane_url": url}}).start(SandboxSpec(image=f"idegym-task:{TASK}"))
    sandbox = box._handle.raw.sandbox  # the provider's sandbox, called directly: the baseline
    try:
        return await interleaved({"nemo-gym: Sandbox.bash (direct)": lambda: sandbox.bash("echo hello"),
                                  "nemo-gym: AsyncSandbox.exec": lambda: box.exec("echo hello")}, n)
    finally:
        await box.stop()


async def verl(url: str, n: int) -> dict[str, list[float]]:
    from idegym_env.integrations._episode import ToolCallEpisode
    from idegym_env.integrations.verl import _EpisodeTool

    episode = ToolCallEpisode(control_plane_url=url, max_steps=10 * n)
    episode.start(TASK)
    tool = _EpisodeTool("bash", episode)
    sandbox = episode.env.sandbox
    try:
        return await interleaved({"verl: Sandbox.bash (direct)": lambda: sandbox.bash("echo hello"),
                                  "verl: IdeGymAgentLoop bash tool (BaseTool.execute)":
                                      lambda: tool.execute("bench", {"command": "echo hello"})}, n)
    finally:
        episode.end()


def _ready_port(argv: Callable[[int], list[str]]) -> tuple[subprocess.Popen, int]:
    """Start the command ``argv(fd)`` gives for the write end of a pipe and wait for its ``ready
    PORT`` line there; the process and PORT."""
    read_fd, write_fd = os.pipe()
    command = argv(write_fd)
    proc = subprocess.Popen(command, pass_fds=(write_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=REPO, start_new_session=True)
    os.close(write_fd)
    return proc, int(_wait_ready(read_fd, proc, " ".join(command[1:3])).split()[1])


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(90)


async def verifiers(url: str, n: int) -> dict[str, list[float]]:
    from openenv import GenericEnvClient

    from idegym_env.integrations._episode import ToolCallEpisode
    from idegym_env.integrations.verifiers import IdeGymVerifiersEnv

    python = str(REPO / ".venv" / "bin" / "python")
    episode = ToolCallEpisode(control_plane_url=url, max_steps=10 * n)
    episode.start(TASK)
    try:
        image = episode.env.image
        server, port = _ready_port(lambda fd: [python, "-m", "idegym_env.cli", "openenv", "serve", "--task", TASK,
                                               "--control-plane-url", url, "--port", "0", "--ready-fd", str(fd),
                                               "--max-steps", str(10 * n)])
        try:
            null, null_port = _ready_port(lambda fd: [python, str(REPO / "benchmarks" / "_openenv_null_server.py"),
                                                      url, image, str(fd)])
        except BaseException:
            _stop(server)
            raise
        try:
            sandbox = episode.env.sandbox
            async with GenericEnvClient(base_url=f"http://127.0.0.1:{port}", message_timeout_s=120) as env, \
                    GenericEnvClient(base_url=f"http://127.0.0.1:{null_port}", message_timeout_s=120) as floor:
                await env.reset()
                await floor.reset()
                action = {"tool": "bash", "arguments": {"command": "echo hello"}}
                reply = json.dumps(action)  # a model's reply, as the native taskset reads it
                return await interleaved({"verifiers: Sandbox.bash (direct)": lambda: sandbox.bash("echo hello"),
                                          VERIFIERS_NATIVE: lambda: IdeGymVerifiersEnv.act(episode, reply),
                                          VERIFIERS_STEP: lambda: env.step(action),
                                          VERIFIERS_FLOOR: lambda: env.state(),
                                          VERIFIERS_NULL: lambda: floor.step(action)}, n,
                                         cpu_of={VERIFIERS_STEP: server.pid, VERIFIERS_FLOOR: server.pid,
                                                 VERIFIERS_NULL: null.pid})
        finally:
            _stop(null)
            _stop(server)
    finally:
        episode.end()


PLUGINS: dict[str, Callable[[str, int], Awaitable[dict[str, list[float]]]]] = {
    "mini-swe-agent": mini_swe_agent, "nemo-gym": nemo_gym, "verl": verl, "verifiers": verifiers}


if __name__ == "__main__":
    plugin, url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print(json.dumps(asyncio.run(PLUGINS[plugin](url, n))))
