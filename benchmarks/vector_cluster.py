"""RayVectorEnv on a multi-node Ray: the same 6 sub-envs on 1, 2 and 3 simulated nodes.

Each size runs on a fresh :class:`~idegym_env.vector.local_ray.SimulatedCluster` (``nodes``
raylets on this host, one logical CPU each, everything on 127.0.0.1) with the default placement:
each sub-env's sandbox on the node of its actor, in that node's embedded control plane. This
host has 2 cores, so more nodes cannot mean more speed: the figures are the *overhead* of
spreading (more raylets, one control plane per node), not a speed-up.

* steps/s: vector steps of ``echo hello`` in every sub-env, in rounds of ``BENCH_SECONDS``;
* per-step overhead: the median vector step minus the median round of the same 6 calls made
  directly, on the same layout without Ray: one embedded control plane per simulated node, the
  sandboxes split among them as the sub-envs are, 6 threads, each round waiting for all 6 —
  measured in rounds alternating with the vector env's. (One control plane is one Python
  process: spreading the sandboxes over several spreads its work over both cores too, which is
  why the layout of the baseline must match.)
* recovery from a node loss (2 and 3 nodes): while the env steps in a loop, a worker node is
  SIGKILLed; *detected* is the time until the step that reports its sub-envs truncated,
  *recovered* until the first step in which every sub-env steps normally again, *cleaned* until
  the lost node's control plane and sandboxes are gone;
* memory per node: the RSS of a node's control plane, keeper and their actor, and of one sandbox.

Writes ``results/vector_cluster.json``.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from ._common import RESULTS, Progress, Result, Stats, table
from .vector_throughput import ACTION, COMMAND, NO_END, TASK, RawCalls, Round, timed

SIZES = [int(s) for s in os.environ.get("BENCH_NODES", "1,2,3").split(",")]
SUB_ENVS = int(os.environ.get("BENCH_SUB_ENVS", "6"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "2"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))


def _actions(n: int) -> np.ndarray:
    out = np.empty(n, dtype=object)
    for i in range(n):
        out[i] = ACTION
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _rss_mib(pid: int | None) -> float:
    if not pid:
        return 0.0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _sandbox_pids(state_dir: str) -> list[int]:
    import json

    out = []
    for path in Path(state_dir, "sandboxes").glob("*/sandbox.json"):
        try:
            out.append(int(json.loads(path.read_text())["server"][0]))
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            pass
    return out


def ray_describe(env: Any) -> list[dict[str, Any]]:
    import ray

    return [d for a in {id(env.actor(i)): env.actor(i) for i in range(env.num_envs)}.values()
            for d in ray.get(a.describe.remote())]


def _recover(env: Any, sim: Any, actions: np.ndarray) -> dict[str, float]:
    """Lose a worker node while stepping; seconds until detected, recovered and cleaned up."""
    victim = sim.workers[-1]
    plane = env.control_planes()[victim.node_id]
    doomed = [plane["pid"], plane["keeper_pid"], *_sandbox_pids(plane["state_dir"])]
    env.step(actions)
    removed = time.perf_counter()
    sim.remove(victim)
    detected = recovered = None
    lost: set[int] = set()
    while recovered is None and time.perf_counter() - removed < 120:
        _, _, _, truncated, infos = env.step(actions)
        now = time.perf_counter() - removed
        # The lost node's actors answer until their worker processes notice the raylet is gone
        # (under a second), so its sub-envs may be reported over more than one step.
        lost.update(int(i) for i in np.flatnonzero(truncated))
        if detected is None:
            if truncated.any():
                detected = now
            continue
        resetting = infos.get("_sandbox")
        if not truncated.any() and (resetting is None or not resetting.any()):
            recovered = now
    while any(_alive(p) for p in doomed) and time.perf_counter() - removed < 180:
        time.sleep(0.1)
    cleaned = time.perf_counter() - removed
    return {"detected_s": round(detected or float("nan"), 3),
            "recovered_s": round(recovered or float("nan"), 3),
            "cleaned_s": round(cleaned, 3), "sub_envs_lost": len(lost),
            "left_behind": sum(_alive(p) for p in doomed)}


class Direct:
    """The baseline: ``per_node`` sandboxes on each of ``nodes`` embedded control planes of this
    process, called from one thread each, in lockstep rounds."""

    def __init__(self, per_node: list[int]) -> None:
        from idegym_env.embedded import EmbeddedControlPlane
        from idegym_env.env import IdeGymEnv

        self.planes = [EmbeddedControlPlane(warm_pool=1) for _ in per_node]
        self.calls: list[RawCalls] = []
        try:
            for plane, n in zip(self.planes, per_node, strict=True):
                probe = IdeGymEnv(TASK, control_plane_url=plane.url)  # builds the task's image there
                image = probe.image
                probe.close()
                self.calls.append(RawCalls(plane.url, image, n))
        except BaseException:
            self.close()
            raise
        self.sandboxes = [sb for c in self.calls for sb in c.sandboxes]

    def run_lockstep(self, seconds: float) -> Round:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(len(self.sandboxes)) as pool:
            def one_round() -> None:
                for result in pool.map(lambda sb: sb.bash(COMMAND), self.sandboxes):
                    assert result.exit_code == 0

            return timed(one_round, len(self.sandboxes), seconds)

    def close(self) -> None:
        for c in self.calls:
            c.close()
        for plane in self.planes:
            plane.close()


def measure(nodes: int) -> dict[str, Any]:
    from idegym_env.vector import RayVectorEnv
    from idegym_env.vector.local_ray import SimulatedCluster, non_loopback_listeners

    print(f"\n{nodes} node{'s' if nodes > 1 else ''}: starting the cluster and {SUB_ENVS} sub-envs ...",
          flush=True)
    started = time.perf_counter()
    sim = SimulatedCluster(nodes, cpus_per_node=1)
    try:
        cluster_s = time.perf_counter() - started
        started = time.perf_counter()
        env = RayVectorEnv(SUB_ENVS, task=TASK, max_steps=NO_END)
        try:
            env.reset(seed=0)
            env_s = time.perf_counter() - started
            actions = _actions(SUB_ENVS)
            placed = [env.node_of(i) for i in range(SUB_ENVS)]
            per_node = sorted((placed.count(n) for n in set(placed)), reverse=True)
            raw = Direct([placed.count(n) for n in dict.fromkeys(placed)])
            try:
                timed(lambda: env.step(actions), SUB_ENVS, 0.5)  # warm-up
                raw.run_lockstep(0.5)
                vector: list[Round] = []
                direct: list[Round] = []
                progress = Progress(f"{nodes} nodes: {ROUNDS} rounds x 2 x {SECONDS:g} s", 2 * ROUNDS)
                for _ in range(ROUNDS):
                    vector.append(timed(lambda: env.step(actions), SUB_ENVS, SECONDS))
                    progress.step()
                    direct.append(raw.run_lockstep(SECONDS))
                    progress.step()
                planes = env.control_planes()
                actor_mib = statistics.median(_rss_mib(d["actor_pid"]) for d in ray_describe(env))
                memory = {node[:8]: {"control_plane_mib": round(_rss_mib(p["pid"]), 1),
                                     "keeper_mib": round(_rss_mib(p.get("keeper_pid")), 1),
                                     "its_actor_mib": round(_rss_mib(p.get("actor_pid")), 1),
                                     "sandbox_mib": round(statistics.median(
                                         [_rss_mib(s) for s in _sandbox_pids(p["state_dir"])] or [0.0]), 1)}
                          for node, p in planes.items()}
                listeners = non_loopback_listeners()
            finally:
                raw.close()
            recovery = _recover(env, sim, actions) if nodes > 1 else None
        finally:
            env.close()
    finally:
        sim.close()
    step = [x for r in vector for x in r.latencies]
    base = [x for r in direct for x in r.latencies]
    return {
        "nodes": nodes, "sub_envs_per_node": per_node, "cluster_start_s": round(cluster_s, 2),
        "env_start_s": round(env_s, 2),
        "steps_per_s": statistics.median(r.rate for r in vector),
        "direct_steps_per_s": statistics.median(r.rate for r in direct),
        "step_ms": statistics.median(step) * 1000, "direct_round_ms": statistics.median(base) * 1000,
        "overhead_ms": (statistics.median(step) - statistics.median(base)) * 1000,
        "stats": [Stats.of(f"{nodes} nodes: vector step ({SUB_ENVS} sub-envs)", step),
                  Stats.of(f"{nodes} nodes: direct lockstep round ({SUB_ENVS} calls)", base)],
        "memory_per_node": memory, "sub_env_actor_mib": round(actor_mib, 1),
        "non_loopback_listeners": listeners, "recovery": recovery,
    }


def run() -> Result:
    from idegym_env.vector.local_ray import use_loopback

    use_loopback()
    result = Result("vector_cluster", f"RayVectorEnv, {SUB_ENVS} sub-envs on 1-3 simulated Ray nodes")
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    for nodes in SIZES:
        rows.append(measure(nodes))
        print(f"  {rows[-1]['steps_per_s']:.1f} steps/s, overhead {rows[-1]['overhead_ms']:.1f} ms per step",
              flush=True)
    load_after = os.getloadavg()

    base = rows[0]["steps_per_s"]
    print(f"\n{SUB_ENVS} sub-envs, {COMMAND!r} each; medians of {ROUNDS} rounds of {SECONDS:g} s; "
          "overhead = vector step - direct round of the same calls:")
    print(table(["nodes", "sub-envs per node", "steps/s", "vs 1 node", "direct steps/s", "step ms",
                 "direct round ms", "overhead ms", "env start s"],
                [[r["nodes"], "+".join(map(str, r["sub_envs_per_node"])), r["steps_per_s"],
                  f"{r['steps_per_s'] / base:.2f}x", r["direct_steps_per_s"], r["step_ms"],
                  r["direct_round_ms"], r["overhead_ms"], r["env_start_s"]] for r in rows]))
    losses = [r for r in rows if r["recovery"]]
    if losses:
        print("\nnode loss while stepping (a worker node SIGKILLed):")
        print(table(["nodes", "sub-envs lost", "detected s", "recovered s", "cleaned up s", "left behind"],
                    [[r["nodes"], r["recovery"]["sub_envs_lost"], r["recovery"]["detected_s"],
                      r["recovery"]["recovered_s"], r["recovery"]["cleaned_s"], r["recovery"]["left_behind"]]
                     for r in losses]))
    print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f} "
          f"on {os.cpu_count()} CPUs")

    for r in rows:
        result.stats.extend(r.pop("stats"))
    result.figures["by_nodes"] = {str(r["nodes"]): {k: (round(v, 3) if isinstance(v, float) else v)
                                                    for k, v in r.items()} for r in rows}
    result.figures["throughput"] = [
        {"nodes": r["nodes"], "sub-envs per node": "+".join(map(str, r["sub_envs_per_node"])),
         "steps/s": round(r["steps_per_s"], 1), "vs 1 node": round(r["steps_per_s"] / base, 3),
         "direct steps/s": round(r["direct_steps_per_s"], 1),
         "step ms": round(r["step_ms"], 2), "direct round ms": round(r["direct_round_ms"], 2),
         "overhead ms": round(r["overhead_ms"], 2)} for r in rows]
    if losses:
        result.figures["node_loss"] = [{"nodes": r["nodes"], **r["recovery"]} for r in losses]
    result.figures["settings"] = {"sub_envs": SUB_ENVS, "command": COMMAND, "task": TASK, "rounds": ROUNDS,
                                  "seconds_per_round": SECONDS, "cpus_per_node": 1, "placement": "node"}
    result.figures["load_average"] = {"before": [round(x, 2) for x in load_before],
                                      "after": [round(x, 2) for x in load_after]}
    result.notes.append("Simulated nodes share this host's 2 cores: the figures are overhead, not speed-up.")
    if any(r["non_loopback_listeners"] for r in rows):
        result.notes.append("Ray listened beyond loopback: " + "; ".join(
            ", ".join(r["non_loopback_listeners"]) for r in rows if r["non_loopback_listeners"]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    return result


if __name__ == "__main__":
    run().write()
