"""``make demo`` / ``idegym demo``: real episodes on bundled tasks, end to end, printed as they run.

The embedded control plane starts; for each task a scripted agent (it applies the task's known
fix, runs the tests, submits) and a do-nothing agent (it submits at once) play one episode each
in a real sandbox. Each episode prints its steps, the check results, the reward and the time.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from sandbox_server.models import TestReport

from .rewards import CheckResults

DEMO_TASKS = ("python-roman-numerals", "js-query-string", "c-ring-buffer")


def _short(text: str, width: int = 96) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def _scripted(env: Any) -> list[dict[str, Any]]:
    """The task's known fix, a look at the tests, then submit."""
    calls = [{"tool": "bash", "arguments": {"command": "ls -R | head -20"}}]
    calls += [call.to_action() for call in env.task.solution]
    if env.task.test is not None:
        build = f"{env.task.compilation.script} && " if env.task.compilation is not None else ""
        calls.append({"tool": "bash", "arguments": {"command": build + env.task.test.script}})
    return calls + [{"tool": "submit", "arguments": {}}]


def _do_nothing(env: Any) -> list[dict[str, Any]]:
    return [{"tool": "submit", "arguments": {}}]


def _episode(env: Any, agent: str, number: int, total: int) -> dict[str, Any]:
    print(f"\n[episode {number}/{total}] task {env.task.id} — {agent} agent", flush=True)
    started = time.perf_counter()
    _, info = env.reset(seed=number)
    print(f"  reset: sandbox {info['sandbox']} (server {info['server_id']}) in "
          f"{info.get('reset_seconds', 0) * 1000:.0f} ms", flush=True)
    plan = _scripted(env) if agent == "scripted" else _do_nothing(env)
    reward, info, steps = 0.0, {}, 0
    for action in plan:
        steps += 1
        obs, reward, terminated, truncated, info = env.step(action)
        args = action["arguments"]
        what = args.get("command") or args.get("path") or ""
        print(f"  step {steps}: {action['tool']} {_short(str(what), 48)}"
              + (f" → {_short(obs, 60)}" if action["tool"] != "submit" else ""), flush=True)
        if terminated or truncated:
            break
    for stage, answer in CheckResults.from_responses(**info.get("checks", {})).stages().items():
        counts = f" ({answer.scores.passed}/{answer.scores.total} passed)" if isinstance(answer, TestReport) else ""
        print(f"  check {stage}: {answer.status.value}{counts}")
    seconds = time.perf_counter() - started
    print(f"  reward {reward:.3f} after {steps} steps in {seconds:.1f} s", flush=True)
    return {"task": env.task.id, "agent": agent, "steps": steps, "reward": reward, "seconds": seconds}


def main() -> int:
    from . import embedded
    from .env import IdeGymEnv

    print("starting the embedded control plane (sandboxes are local, isolated processes) …", flush=True)
    started = time.perf_counter()
    control_plane = embedded.acquire()
    print(f"  ready at {control_plane.address} in {time.perf_counter() - started:.1f} s", flush=True)
    rows = []
    try:
        total = 2 * len(DEMO_TASKS)
        number = 0
        for task in DEMO_TASKS:
            print(f"\npreparing task {task} (its project becomes an image) …", flush=True)
            env = IdeGymEnv(task, control_plane_url=control_plane.url)
            try:
                for agent in ("scripted", "do-nothing"):
                    number += 1
                    rows.append(_episode(env, agent, number, total))
            finally:
                env.close()
    finally:
        embedded.release()
    print("\nsummary")
    print(f"  {'task':<24}{'agent':<12}{'steps':>6}{'reward':>9}{'seconds':>9}")
    for r in rows:
        print(f"  {r['task']:<24}{r['agent']:<12}{r['steps']:>6}{r['reward']:>9.3f}{r['seconds']:>9.1f}")
    solved = all(r["reward"] == 1.0 for r in rows if r["agent"] == "scripted")
    unsolved = all(r["reward"] < 1.0 for r in rows if r["agent"] == "do-nothing")
    print("\nthe scripted agent solved every task and doing nothing did not: the rewards mean what they say"
          if solved and unsolved else "\nunexpected rewards: see the episodes above")
    print("the control plane is stopped and its sandboxes are gone.")
    return 0 if solved and unsolved else 1


if __name__ == "__main__":
    sys.exit(main())
