"""Deleting many servers at once on the Kubernetes backend, against the API-server simulator.

A trainer's close deletes all its servers at once. Each delete is three API calls (the pod, its
Service, its PodDisruptionBudget) and a wait, on the pod informer, until the pod is gone. The
API calls wait on the API server, so the threads they run on set the pace: the backend's own
(``kube.API_THREADS``, 32) against the loop's default executor (min(32, CPUs + 4): 6 on this
host), alternated in one run, against a simulator that answers every request after 20 ms (a
remote API server's round trip), with the loop's CPU seconds for the deletes.

The simulator's pods are bare pods labelled as the backend's own servers, with no node to run
on (no process each). ``BENCH_K8S_SERVERS`` (default 200), ``BENCH_K8S_ROUNDS`` (3).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import statistics
import tempfile
import time
from pathlib import Path

from ._common import Result, Stats, stats_table, table

SERVERS = int(os.environ.get("BENCH_K8S_SERVERS", "200"))
ROUNDS = int(os.environ.get("BENCH_K8S_ROUNDS", "3"))
LATENCY = 0.02
DEFAULT_THREADS = min(32, (os.cpu_count() or 1) + 4)


def _round(state: Path, threads: int) -> tuple[float, float]:
    """Delete ``SERVERS`` at once with API calls on ``threads`` threads: seconds, the loop's CPU
    seconds."""
    from kubernetes import client as k8s
    from kubernetes import config as kube_config

    from control_plane.backends.base import SandboxAddress, SandboxHandle
    from control_plane.backends.kubernetes import KubernetesBackend, kube
    from control_plane.backends.kubernetes.manifests import managed_labels
    from tests.k8s_sim.fixtures import SimulatorProcess

    state.mkdir()
    sim = SimulatorProcess(state, latency=LATENCY)
    try:
        config = sim.backend_config()
        backend = KubernetesBackend(config)
        api = kube_config.new_client_from_config(str(sim.kubeconfig))
        core = k8s.CoreV1Api(api)
        names = [f"bench-{i}" for i in range(SERVERS)]

        def make(name: str) -> None:
            core.create_namespaced_pod(config.namespace, {
                "metadata": {"name": name, "labels": managed_labels(name, backend.settings)},
                "spec": {"containers": [{"name": "main", "image": "registry.invalid/none:1"}],
                         "nodeSelector": {"example.com/no-such-node": "1"}}})

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(make, names))
        api.close()

        async def delete_all() -> tuple[float, float]:
            await backend.start()
            while len(backend.informers[config.namespace].pods()) < SERVERS:
                await asyncio.sleep(0.05)
            handles = [SandboxHandle(backend.name, n, SandboxAddress(""), {"namespace": config.namespace,
                                                                           "kind": "Pod"}) for n in names]
            saved, kube._threads = kube._threads, concurrent.futures.ThreadPoolExecutor(threads)
            try:
                cpu, began = time.thread_time(), time.perf_counter()
                await asyncio.gather(*(backend.delete(h) for h in handles))
                took, cpu = time.perf_counter() - began, time.thread_time() - cpu
            finally:
                kube._threads.shutdown()
                kube._threads = saved
                await backend.close()
            return took, cpu

        return asyncio.run(delete_all())
    finally:
        sim.stop()


def run() -> Result:
    result = Result("k8s_delete", f"Deleting {SERVERS} servers at once on the Kubernetes backend "
                                  f"(simulated API server, {LATENCY * 1e3:g} ms a request)")
    from control_plane.backends.kubernetes.kube import API_THREADS

    sides = {f"API calls on the loop's default executor ({DEFAULT_THREADS} threads)": DEFAULT_THREADS,
             f"API calls on the backend's own threads ({API_THREADS})": API_THREADS}
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="bench-k8s-") as tmp:
        for i in range(ROUNDS):
            for side, threads in (sides.items() if i % 2 == 0 else reversed(sides.items())):
                took, loop_cpu = _round(Path(tmp) / f"{i}-{threads}", threads)
                seconds[side].append(took)
                cpu[side].append(loop_cpu)
                print(f"  round {i + 1}/{ROUNDS}, {side}: {took:.2f} s", flush=True)
    result.stats = [Stats.of(f"{SERVERS} deletes, {side}", s) for side, s in seconds.items()]
    default, ours = (Stats.of(side, s).median_ms for side, s in seconds.items())
    result.figures["deletes per second, default executor / own threads"] = \
        f"{SERVERS / default * 1e3:.1f} / {SERVERS / ours * 1e3:.1f}"
    result.figures["own threads / default executor, deletes per second"] = round(default / ours, 2)
    for side in sides:
        result.figures[f"the loop's CPU seconds, {side} (median)"] = round(statistics.median(cpu[side]), 3)
    print(stats_table(result.stats, baseline=result.stats[0].label))
    print(table(["figure", "value"], list(result.figures.items())))
    return result
