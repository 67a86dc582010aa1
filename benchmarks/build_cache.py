"""The host's build cache (``docs/images.md``): the first episode of an SWE task on a new control
plane (an embedded one, its own state directory, as each new trainer process has) with the host's
build cache cold (empty: the set's Dockerfile environment, ``apt-get`` and all, and the instance's
project image are built) against warm (another control plane of the host built them: taken from
the cache), alternated, ``BENCH_BUILD_CACHE_N`` pairs (default 3). Target: warm / cold <= 0.5.

Each pair has a build cache of its own (a temporary ``IDEGYM_BUILD_CACHE_DIR``); the bases come
from the host's image cache (a first, untimed episode makes sure they are there). The episode is
timed in two parts: up to a reset sandbox (the env's images ensured, the sandbox started) and its
steps (the gold solution, then ``submit``: grading in a fresh sandbox).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

from ._common import Result, check_target, table

N = int(os.environ.get("BENCH_BUILD_CACHE_N", "3"))
TASK = "swe/inflection__ordinal-teens"


def _first_episode(build_cache: Path) -> tuple[float, float, float]:
    """(seconds to a reset sandbox, seconds of the steps and grading, reward) on a new control plane."""
    from idegym_env.embedded import EmbeddedControlPlane
    from idegym_env.env import IdeGymEnv
    from idegym_env.tasks import load_task

    task = load_task(TASK)
    os.environ["IDEGYM_BUILD_CACHE_DIR"] = str(build_cache)
    cp = EmbeddedControlPlane()
    try:
        started = time.perf_counter()
        env = IdeGymEnv(task, control_plane_url=cp.url)
        try:
            env.reset()
            up = time.perf_counter() - started
            for call in task.solution:
                env.step(call.model_dump(mode="json"))
            _, reward, *_ = env.step({"tool": "submit"})
        finally:
            env.close()
        return up, time.perf_counter() - started - up, float(reward)
    finally:
        cp.close()


def run() -> Result:
    result = Result("build_cache", "The host's build cache: an SWE task's first episode on a new control plane")
    root = Path(tempfile.mkdtemp(prefix="idegym-bench-build-cache-"))
    environment = mock.patch.dict(os.environ)  # each episode points IDEGYM_BUILD_CACHE_DIR at its cache
    environment.start()
    rows: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
    built: list[dict] = []  # what the cold episodes built, in how many seconds
    try:
        _first_episode(root / "warm-up")  # the bases in the host's image cache, untimed
        for index in range(N):
            cache = root / f"cache-{index}"
            for label in ("cold", "warm"):  # the warm one takes what the cold one published
                up, steps, reward = _first_episode(cache)
                assert reward == 1.0, (label, reward)
                rows[label].append((up, steps))
                print(f"pair {index + 1}/{N} {label}: {up + steps:.1f} s (reset {up:.1f} s, steps {steps:.1f} s)",
                      flush=True)
            built += [json.loads(p.read_text()) for p in sorted(cache.glob("*.json"))]
    finally:
        environment.stop()
        shutil.rmtree(root, ignore_errors=True)

    def median(label: str, part: int | None = None) -> float:
        return statistics.median(sum(r) if part is None else r[part] for r in rows[label])

    ratio = median("warm") / median("cold")
    result.figures = {
        "task": TASK, "pairs": N,
        "cold_first_episode_s": [round(sum(r), 2) for r in rows["cold"]],
        "warm_first_episode_s": [round(sum(r), 2) for r in rows["warm"]],
        "cold_reset_s_median": round(median("cold", 0), 2), "warm_reset_s_median": round(median("warm", 0), 2),
        "cold_steps_s_median": round(median("cold", 1), 2), "warm_steps_s_median": round(median("warm", 1), 2),
        "warm_over_cold": round(ratio, 3), "load_average": os.getloadavg(),
        "builds": [{k: r.get(k) for k in ("tag", "seconds")} for r in built],
    }
    result.targets = {"warm_over_cold": check_target("first episode, warm cache / cold cache", ratio, 0.5, "x")}
    print(table(["first episode on a new control plane", "median s", "to a reset sandbox", "steps + grading"], [
        [f"build cache cold (n={N})", median("cold"), median("cold", 0), median("cold", 1)],
        [f"build cache warm (n={N})", median("warm"), median("warm", 0), median("warm", 1)],
    ]))
    for record in built:
        print(f"cold: built {record['tag']} in {record['seconds']} s")
    for target in result.targets.values():
        print(target["text"])
    print(f"load average during the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return result
