"""Agents for the ``idegym eval`` tests, loaded by the CLI as ``tests.eval_fixtures.agents:NAME``."""

from __future__ import annotations

import os
import time
from typing import Any

from idegym_env.eval.agents import SUBMIT, OracleAgent
from idegym_env.tasks import Task


class CrashOn(OracleAgent):
    """The oracle, except on task ``task`` where it raises after its first tool call."""

    def __init__(self, task: str) -> None:
        super().__init__()
        self.crash_task = task
        self.calls = 0
        self.current = ""

    def reset(self, task: Task, *, seed: int | None = None) -> None:
        super().reset(task, seed=seed)
        self.current = task.id

    def __call__(self, observation: str, info: dict[str, Any]) -> Any:
        self.calls += 1
        if self.current == self.crash_task and self.calls > 1:
            raise RuntimeError(f"agent bug: cannot handle {self.current}")
        return super().__call__(observation, info)


class HangOnFirstAttempt(OracleAgent):
    """The oracle, except that attempt 0 of every task never returns from its first step."""

    def __call__(self, observation: str, info: dict[str, Any]) -> Any:
        if info.get("attempt") == 0:
            time.sleep(3600)
        return super().__call__(observation, info)


class GatedOracle(OracleAgent):
    """The oracle, that starts attempt ``a`` only once the number in the file ``$IDEGYM_TEST_GATE``
    is above ``a``: a test lets exactly the attempts it wants finish before it interrupts a run."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = os.environ["IDEGYM_TEST_GATE"]

    def __call__(self, observation: str, info: dict[str, Any]) -> Any:
        deadline = time.monotonic() + 300
        while int(open(self.gate).read() or 0) <= int(info.get("attempt", 0)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"attempt {info.get('attempt')} was never let through {self.gate}")
            time.sleep(0.02)
        return super().__call__(observation, info)


def submit_now(observation: str, info: dict[str, Any]) -> dict[str, Any]:
    """A stateless agent given as a plain function: it shares nothing, so one serves every episode."""
    return SUBMIT


class MarkNodeThenOracle(OracleAgent):
    """The oracle, that first leaves a marker naming its attempt and Ray node in ``marker_dir`` and
    waits ``delay`` seconds, so that a test can take the node away in the middle of the episode."""

    def __init__(self, marker_dir: str, delay: float = 6.0) -> None:
        super().__init__()
        self.marker_dir = marker_dir
        self.delay = delay
        self.first = True

    def reset(self, task: Task, *, seed: int | None = None) -> None:
        super().reset(task, seed=seed)
        self.first = True

    def __call__(self, observation: str, info: dict[str, Any]) -> Any:
        if self.first:
            self.first = False
            import os
            from pathlib import Path

            import ray

            node = ray.get_runtime_context().get_node_id()
            Path(self.marker_dir, f"{info['attempt']}-{node}-{os.getpid()}").touch()
            time.sleep(self.delay)
        return super().__call__(observation, info)
