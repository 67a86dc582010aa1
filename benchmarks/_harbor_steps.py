"""Run in .venv-harbor by ``benchmarks/integrations.py``: ``IdeGymEnvironment.exec`` against
``AsyncSandbox.bash`` on the provider's own sandbox, interleaved; prints the samples (ms) as JSON."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from idegym_env.integrations.harbor import IdeGymEnvironment


async def main(url: str, n: int, work: Path) -> dict[str, list[float]]:
    (work / "environment").mkdir()
    (work / "environment" / "Dockerfile").write_text("FROM debian:bookworm\n")
    trial = TrialPaths(work / "trial")
    trial.mkdir()
    env = IdeGymEnvironment(work / "environment", "bench", "bench__1__env", trial, EnvironmentConfig(),
                            control_plane_url=url, image="idegym/builtin:latest",
                            network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
    await env.start(force_build=False)
    sandbox = env._sandbox  # the same sandbox, called directly: the baseline
    assert sandbox is not None
    calls = {
        "harbor: AsyncSandbox.bash (direct)": lambda: sandbox.bash("echo hello", timeout=120),
        "harbor: IdeGymEnvironment.exec": lambda: env.exec("echo hello", timeout_sec=120),
    }
    samples: dict[str, list[float]] = {label: [] for label in calls}
    try:
        for _ in range(20):
            for fn in calls.values():
                await fn()
        for _ in range(n):
            for label, fn in calls.items():
                started = time.perf_counter()
                await fn()
                samples[label].append((time.perf_counter() - started) * 1000)
    finally:
        await env.stop(delete=True)
    return samples


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(asyncio.run(main(sys.argv[1], int(sys.argv[2]), Path(tmp)))))
