"""Vector-env throughput: environment steps per second against the number of sub-envs.

Measured in one run, against one embedded control plane on the local backend, for 1, 2, 4, 8 and
16 sub-envs:

* ``RayVectorEnv``: one Ray actor and one sandbox per sub-env, all stepped at once (the default);
* ``RayVectorEnv`` with one actor per CPU (``envs_per_actor=ceil(n / CPUs)``): the sub-envs of
  an actor step on threads there, so a vector step costs one call per actor (over its channel);
* ``RayVectorEnv`` with one actor for all (``envs_per_actor=n``): one call per vector step;
* the same one actor per CPU with ``direct_channels=False``: a Ray call per actor and step, what
  the channel (``idegym_env/vector/channel.py``) replaces;
* ``SyncVectorEnv``: gymnasium's own, ``n`` ``IdeGymEnv`` stepped one after the other in this
  process (the baseline a user gets from ``gym.make_vec(..., vectorization_mode="sync")``);
* raw calls, the ceiling: ``n`` threads, each with its own client and sandbox, calling
  ``sandbox.bash`` in a loop as fast as it answers — no env, no Ray, no lockstep;
* raw calls in lockstep (for the record, not a target): the same threads, but each round waits
  for all ``n`` calls, as a vector env's ``step`` must. The gap between the two raw figures is
  the cost of lockstep itself; the gap between this one and RayVectorEnv is the cost of Ray
  and the env.

Every sub-env runs the same bash action (``echo hello``), and no episode ends during a
measurement (the step budget is out of reach), so the numbers are tool-call throughput. The
methods take turns in short rounds (``BENCH_ROUNDS`` of ``BENCH_SECONDS`` each) so that load from
elsewhere hits all of them alike: a rate is the median over the rounds, a ratio the median of
the per-round ratios. Ray runs with ``num_cpus=2`` (the actors reserve none) and listens on 127.0.0.1
only. The load average
before and after is recorded: on a shared 2-core machine other work moves the numbers.
Target: at 8 sub-envs RayVectorEnv (one actor per CPU) reaches at least 80 % of the raw-call
ceiling; the default's ratio is reported next to it. Writes
``results/vector_throughput.json`` and ``results/vector_throughput.png``.

Where the time goes at that size: the CPU time our processes spend per env step (``_cpu.py``),
for both grouped layouts and for the raw calls, split into this process (the raw calls' threads;
Ray's driver), each grouped env's actors, the control plane with its sandboxes, and Ray's other
processes (raylet, GCS, the default env's idle actors). On 2 shared cores the calls are
CPU-bound, so the ratio of the two totals bounds what RayVectorEnv can reach, and lockstep takes
its own share (``raw calls, lockstep``).
"""

from __future__ import annotations

import concurrent.futures
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from ._common import RESULTS, Progress, Result, Stats, check_target, table
from ._cpu import REST, ROOT, cpu_by_part, spent

SIZES = [int(s) for s in os.environ.get("BENCH_SIZES", "1,2,4,8,16").split(",")]
SECONDS = float(os.environ.get("BENCH_SECONDS", "2"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
TASK = "python-roman-numerals"
COMMAND = "echo hello"
ACTION = {"tool": "bash", "arguments": {"command": COMMAND}}
NO_END = 10**9  # step budget: no episode ends (and gets graded) during a measurement
RAW = "raw calls (ceiling)"
GROUPED = "RayVectorEnv, one actor per CPU"
ONE_ACTOR = "RayVectorEnv, one actor"
BY_RAY = "RayVectorEnv, one actor per CPU, Ray calls"
CPUS = os.cpu_count() or 1
LOCKSTEP = "raw calls, lockstep"
METHODS = ["RayVectorEnv", GROUPED, ONE_ACTOR, BY_RAY, "SyncVectorEnv", RAW, LOCKSTEP]
TARGET_AT = 8
TARGET_RATIO = 0.80
CONTROL_PLANE = "control plane and sandboxes"
CPU_METHODS = (GROUPED, ONE_ACTOR, RAW, LOCKSTEP)  # whose CPU per step is measured at TARGET_AT
LAYOUTS = (GROUPED, ONE_ACTOR)


def actors_of(method: str) -> str:
    return f"actors of {method}"


class Round:
    """One measurement: ``steps`` env steps in ``seconds``, and the latency of each call or vector step."""

    def __init__(self, steps: int, seconds: float, latencies: list[float]) -> None:
        self.steps, self.seconds, self.latencies = steps, seconds, latencies

    @property
    def rate(self) -> float:
        return self.steps / self.seconds


def timed(step: Callable[[], Any], per_step: int, seconds: float) -> Round:
    """Call ``step`` (worth ``per_step`` env steps) until ``seconds`` have passed."""
    latencies = []
    started = time.perf_counter()
    deadline = started + seconds
    while (t := time.perf_counter()) < deadline:
        step()
        latencies.append(time.perf_counter() - t)
    return Round(per_step * len(latencies), time.perf_counter() - started, latencies)


def run_vector(env: gym.vector.VectorEnv, n: int, seconds: float) -> Round:
    actions = np.empty(n, dtype=object)
    for i in range(n):
        actions[i] = ACTION
    return timed(lambda: env.step(actions), n, seconds)


class RawCalls:
    """``n`` clients with a sandbox each, called from ``n`` threads."""

    def __init__(self, url: str, image: str, n: int) -> None:
        from idegym_env.client import IdeGymClient

        self.clients = []
        self.sandboxes = []
        for _ in range(n):
            client = IdeGymClient(url, name="bench-raw")
            client.register()
            self.clients.append(client)
            self.sandboxes.append(client.start(image, server_name="bench-raw"))
        for sandbox in self.sandboxes:
            sandbox.bash(COMMAND)

    def run(self, seconds: float) -> Round:
        n = len(self.sandboxes)
        counts = [0] * n
        latencies: list[list[float]] = [[] for _ in range(n)]
        ends = [0.0] * n
        gate = threading.Barrier(n + 1)
        deadline = [0.0]

        def loop(i: int) -> None:
            sandbox = self.sandboxes[i]
            gate.wait()
            while True:
                t = time.perf_counter()
                if t >= deadline[0]:
                    break
                result = sandbox.bash(COMMAND)
                assert result.exit_code == 0
                latencies[i].append(time.perf_counter() - t)
                counts[i] += 1
            ends[i] = time.perf_counter()

        threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(n)]
        for th in threads:
            th.start()
        started = time.perf_counter()
        deadline[0] = started + seconds
        gate.wait()
        for th in threads:
            th.join()
        return Round(sum(counts), max(ends) - started, [x for lat in latencies for x in lat])

    def run_lockstep(self, seconds: float) -> Round:
        """Rounds of ``n`` concurrent calls, each round waiting for all of them."""
        n = len(self.sandboxes)
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            def one_round() -> None:
                for result in pool.map(lambda sb: sb.bash(COMMAND), self.sandboxes):
                    assert result.exit_code == 0

            return timed(one_round, n, seconds)

    def close(self) -> None:
        for client in self.clients:
            try:
                client.close(stop=True)
            except Exception:  # noqa: BLE001 - the ephemeral control plane removes them anyway
                pass


def actor_pids(env: Any) -> set[int]:
    import ray

    actors = {id(env.actor(i)): env.actor(i) for i in range(env.num_envs)}.values()
    return {d["actor_pid"] for a in actors for d in ray.get(a.describe.remote())}


def measure_size(url: str, image: str, n: int, control_plane_pid: int
                 ) -> tuple[dict[str, list[Round]], dict[str, dict[str, float]]]:
    """Each method's rounds, and at ``TARGET_AT`` the CPU seconds per env step of each part, by method."""
    from idegym_env.env import IdeGymEnv
    from idegym_env.vector import RayVectorEnv

    print(f"\n{n} sub-env{'s' if n > 1 else ''}: starting 5 vector envs and {n} raw sandboxes ...", flush=True)
    ray_env = RayVectorEnv(n, task=TASK, control_plane_url=url, max_steps=NO_END)
    grouped_env = RayVectorEnv(n, task=TASK, control_plane_url=url, max_steps=NO_END,
                               envs_per_actor=-(-n // CPUS))
    one_actor_env = RayVectorEnv(n, task=TASK, control_plane_url=url, max_steps=NO_END, envs_per_actor=n)
    by_ray_env = RayVectorEnv(n, task=TASK, control_plane_url=url, max_steps=NO_END, envs_per_actor=-(-n // CPUS),
                              direct_channels=False)
    sync_env = gym.vector.SyncVectorEnv(
        [lambda: IdeGymEnv(TASK, control_plane_url=url, max_steps=NO_END) for _ in range(n)])
    raw = RawCalls(url, image, n)
    try:
        for env in (ray_env, grouped_env, one_actor_env, by_ray_env, sync_env):
            env.reset(seed=0)
            run_vector(env, n, 0.5)  # warm-up: connections, caches
        raw.run(0.5)
        raw.run_lockstep(0.5)
        runs: dict[str, Callable[[], Round]] = {
            "RayVectorEnv": lambda: run_vector(ray_env, n, SECONDS),
            GROUPED: lambda: run_vector(grouped_env, n, SECONDS),
            ONE_ACTOR: lambda: run_vector(one_actor_env, n, SECONDS),
            BY_RAY: lambda: run_vector(by_ray_env, n, SECONDS),
            "SyncVectorEnv": lambda: run_vector(sync_env, n, SECONDS),
            RAW: lambda: raw.run(SECONDS),
            LOCKSTEP: lambda: raw.run_lockstep(SECONDS),
        }
        rounds: dict[str, list[Round]] = {m: [] for m in METHODS}
        parts = {actors_of(GROUPED): actor_pids(grouped_env), actors_of(ONE_ACTOR): actor_pids(one_actor_env),
                 CONTROL_PLANE: {control_plane_pid}}
        cpu: dict[str, dict[str, float]] = {}
        progress = Progress(f"n={n}: {ROUNDS} rounds x {len(METHODS)} x {SECONDS:g} s", ROUNDS * len(METHODS))
        for _ in range(ROUNDS):
            for method in METHODS:
                counted = n == TARGET_AT and method in CPU_METHODS
                before = cpu_by_part(parts) if counted else {}
                rounds[method].append(runs[method]())
                if counted:
                    for part, seconds in spent(before, cpu_by_part(parts)).items():
                        cpu.setdefault(method, {})[part] = cpu.get(method, {}).get(part, 0.0) + seconds
                progress.step()
        steps = {m: sum(r.steps for r in rounds[m]) for m in cpu}
        return rounds, {m: {part: seconds / steps[m] for part, seconds in by_part.items()}
                        for m, by_part in cpu.items()}
    finally:
        ray_env.close()
        grouped_env.close()
        one_actor_env.close()
        by_ray_env.close()
        sync_env.close()
        raw.close()


def median_rate(rounds: list[Round]) -> float:
    return statistics.median(r.rate for r in rounds)


def median_ratio(rounds: list[Round], baseline: list[Round]) -> float:
    """Median of the per-round ratios: neighbouring rounds share the machine's load of the moment."""
    return statistics.median(a.rate / b.rate for a, b in zip(rounds, baseline, strict=True))


def add_cpu_breakdown(result: Result, cpu: dict[str, dict[str, float]], ratios: dict[str, dict[int, float]]) -> None:
    """CPU ms per env step at ``TARGET_AT``, by part and method; what RayVectorEnv spends beyond the raw calls."""
    parts = list(cpu[RAW])
    rows = [[part, *(f"{cpu[m].get(part, 0.0) * 1000:.3f}" for m in CPU_METHODS)] for part in parts]
    totals = {m: sum(cpu[m].values()) for m in CPU_METHODS}
    rows.append(["total", *(f"{totals[m] * 1000:.3f}" for m in CPU_METHODS)])
    print(f"\nCPU ms per env step at {TARGET_AT} sub-envs, by process:")
    print(table(["part", *CPU_METHODS], rows))
    # rows (a list of objects): the report renders them as a table
    result.figures[f"CPU ms per env step at {TARGET_AT}, by process"] = [
        {"part": part, **{m: round(cpu[m].get(part, 0.0) * 1000, 3) for m in CPU_METHODS}} for part in parts
    ] + [{"part": "total", **{m: round(totals[m] * 1000, 3) for m in CPU_METHODS}}]
    # The client side of a call: what makes and waits for it (Ray's driver and the env's own actors;
    # the raw threads). The other env's actors idle meanwhile: they count with Ray's other processes.
    idle = {m: sum(cpu[m][actors_of(other)] for other in LAYOUTS if other != m) for m in CPU_METHODS}
    client = {m: cpu[m][ROOT] + (cpu[m][actors_of(m)] if m in LAYOUTS else 0.0) for m in CPU_METHODS}
    for layout in LAYOUTS:
        extra = {"client side (driver and actors against the raw threads)": client[layout] - client[RAW],
                 "Ray's other processes": cpu[layout][REST] + idle[layout] - cpu[RAW][REST] - idle[RAW],
                 CONTROL_PLANE: cpu[layout][CONTROL_PLANE] - cpu[RAW][CONTROL_PLANE]}
        for part, seconds in extra.items():
            result.figures[f"{layout}: extra CPU per env step at {TARGET_AT}, {part} ms"] = round(seconds * 1000, 3)
        bound = totals[RAW] / totals[layout]
        result.figures[f"raw / {layout} CPU per env step at {TARGET_AT} (the CPU-bound ceiling of its ratio)"] = \
            round(bound, 4)
        result.notes.append(
            f"At {TARGET_AT} sub-envs {layout} spends {totals[layout] * 1000:.2f} ms of CPU per env step, the raw "
            f"calls {totals[RAW] * 1000:.2f}: CPU-bound, its ratio can be at most {bound:.0%}.")
    result.notes.append(f"Lockstep alone reaches {ratios[LOCKSTEP][TARGET_AT]:.0%} of the raw calls at {TARGET_AT}.")


def plot(rates: dict[str, dict[int, float]], ratio_at_target: float | None, path: Any) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    styles = {"RayVectorEnv": ("o-", "tab:blue"), GROUPED: ("D-", "tab:green"), ONE_ACTOR: ("P-", "tab:purple"),
              BY_RAY: ("x--", "tab:red"),
              "SyncVectorEnv": ("s--", "tab:orange"),
              RAW: ("^:", "black"), LOCKSTEP: ("v:", "tab:gray")}
    for method, by_n in rates.items():
        xs = sorted(by_n)
        marker, color = styles.get(method, ("o-", None))
        ax.plot(xs, [by_n[x] for x in xs], marker, color=color, label=method)
    ax.set_xscale("log", base=2)
    ax.set_xticks(SIZES)
    ax.set_xticklabels([str(s) for s in SIZES])
    ax.set_xlabel("sub-envs")
    ax.set_ylabel(f"env steps per second ({COMMAND!r})")
    title = f"IdeGym vector env throughput, {os.cpu_count()} CPUs"
    if ratio_at_target is not None:
        title += f"\nRayVectorEnv (one actor per CPU) at {TARGET_AT} = {ratio_at_target:.0%} of the raw-call ceiling"
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def run() -> Result:
    import ray

    from idegym_env.embedded import EmbeddedControlPlane
    from idegym_env.env import IdeGymEnv
    from idegym_env.vector.local_ray import init_local, non_loopback_listeners

    result = Result("vector_throughput", "Vector env steps/s: RayVectorEnv vs SyncVectorEnv vs raw sandbox calls")
    load_before = os.getloadavg()
    started_ray = False
    if not ray.is_initialized():
        init_local(num_cpus=2, log_to_driver=False, configure_logging=False)  # on 127.0.0.1 only
        started_ray = True
    rates: dict[str, dict[int, float]] = {m: {} for m in METHODS}
    ratios: dict[str, dict[int, float]] = {m: {} for m in METHODS if m != RAW}
    cpu: dict[str, dict[str, float]] = {}
    try:
        with EmbeddedControlPlane(warm_pool=2) as cp:
            probe = IdeGymEnv(TASK, control_plane_url=cp.url)  # builds the task's image once
            image = probe.image
            probe.close()
            for n in SIZES:
                rounds, cpu_at_n = measure_size(cp.url, image, n, cp.process.pid)
                cpu = cpu_at_n or cpu
                for method in METHODS:
                    rates[method][n] = median_rate(rounds[method])
                    if method != RAW:
                        ratios[method][n] = median_ratio(rounds[method], rounds[RAW])
                    unit = "call" if method == RAW else "vector step"
                    result.stats.append(Stats.of(f"{method} n={n}: latency per {unit}",
                                                 [x for r in rounds[method] for x in r.latencies]))
                print("  " + "  ".join(f"{m}: {rates[m][n]:.1f}/s" for m in METHODS), flush=True)
        listeners = non_loopback_listeners()
        if listeners:
            result.notes.append("Ray listened beyond loopback: " + ", ".join(listeners))
    finally:
        if started_ray:
            ray.shutdown()
    load_after = os.getloadavg()

    rows = []
    for n in SIZES:
        rows.append([n, rates["RayVectorEnv"][n], rates[GROUPED][n], rates[ONE_ACTOR][n], rates[BY_RAY][n],
                     rates["SyncVectorEnv"][n], rates[RAW][n], rates[LOCKSTEP][n], f"{ratios['RayVectorEnv'][n]:.0%}",
                     f"{ratios[GROUPED][n]:.0%}", f"{ratios[ONE_ACTOR][n]:.0%}", f"{ratios[BY_RAY][n]:.0%}",
                     f"{ratios['SyncVectorEnv'][n]:.0%}", f"{ratios[LOCKSTEP][n]:.0%}"])
    print(f"\nenv steps per second ({COMMAND!r}; medians of {ROUNDS} rounds of {SECONDS:g} s; "
          f"ratios against the raw-call ceiling):")
    print(table(["sub-envs", "RayVectorEnv", "Ray, actor/CPU", "Ray, one actor", "actor/CPU, Ray calls",
                 "SyncVectorEnv", "raw calls", "raw lockstep", "Ray / raw", "Ray actor/CPU / raw",
                 "Ray one actor / raw", "Ray calls / raw", "Sync / raw", "lockstep / raw"], rows))
    print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f} on {os.cpu_count()} CPUs")

    result.figures["steps_per_second"] = {m: {str(n): round(v, 2) for n, v in by_n.items()}
                                          for m, by_n in rates.items()}
    result.figures["ratio_to_raw"] = {m: {str(n): round(v, 4) for n, v in by_n.items()} for m, by_n in ratios.items()}
    result.figures["ray_over_sync"] = {str(n): round(rates["RayVectorEnv"][n] / rates["SyncVectorEnv"][n], 3)
                                       for n in SIZES}
    result.figures["settings"] = {"command": COMMAND, "task": TASK, "seconds_per_round": SECONDS, "rounds": ROUNDS,
                                  "ray_num_cpus": 2, "actor_num_cpus": 0}
    result.figures["load_average"] = {"before": [round(x, 2) for x in load_before],
                                      "after": [round(x, 2) for x in load_after]}
    ratio = None
    if TARGET_AT in SIZES:
        ratio = ratios[GROUPED][TARGET_AT]
        result.figures[f"default RayVectorEnv / raw at {TARGET_AT}"] = f"{ratios['RayVectorEnv'][TARGET_AT]:.0%}"
        result.figures[f"RayVectorEnv, one actor / raw at {TARGET_AT}"] = f"{ratios[ONE_ACTOR][TARGET_AT]:.0%}"
        result.figures[f"{BY_RAY} / raw at {TARGET_AT}"] = f"{ratios[BY_RAY][TARGET_AT]:.0%}"
        result.figures[f"one actor per CPU, channel / Ray calls at {TARGET_AT} (median rates)"] = round(
            rates[GROUPED][TARGET_AT] / rates[BY_RAY][TARGET_AT], 3)
        target = check_target(f"RayVectorEnv (one actor per CPU) / raw-call ceiling at {TARGET_AT} sub-envs",
                              ratio * 100, TARGET_RATIO * 100, unit="%", lower_is_better=False)
        result.targets["ray_vs_raw_at_8"] = target
        print("\n" + target["text"])
    if cpu:
        add_cpu_breakdown(result, cpu, ratios)
    RESULTS.mkdir(parents=True, exist_ok=True)
    png = RESULTS / "vector_throughput.png"
    if plot(rates, ratio, png):
        result.figures["plot"] = str(png.relative_to(RESULTS.parent.parent))
        print(f"plot: {png}")
    return result


if __name__ == "__main__":
    run().write()
