"""The pod informer against the Kubernetes simulator: a wait for one server's pods is woken by
its own pods' events only, so a mass delete of N servers costs O(N) checks, not O(N²)."""

from __future__ import annotations

import asyncio
import time
import uuid
from functools import partial

from kubernetes import client as k8s
from kubernetes import config as kube_config

from control_plane.backends.kubernetes.informer import PodInformer
from tests.k8s_sim.fixtures import SimulatorProcess

NS = "idegym"


def _pod(name: str, instance: str, *, placed: bool = True) -> dict:
    """A pod of its own app. An image the simulator does not have: placed, it keeps failing to
    pull (its status keeps changing, with no process); not placed (no node matches), it is
    reported unschedulable once and then stays as it is."""
    spec = {"containers": [{"name": "main", "image": "registry.invalid/none:1"}]}
    return {"metadata": {"name": name, "labels": {"app": name, "instance": instance}},
            "spec": spec if placed else {**spec, "nodeSelector": {"example.com/no-such-node": "1"}}}


def _unschedulable(pods: list[dict]) -> bool | None:
    conditions = [c for p in pods for c in (p.get("status") or {}).get("conditions") or []]
    return True if any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions) else None


def _present(informer: PodInformer, app: str) -> bool | None:
    return True if informer.pods(app) else None


def test_a_wait_wakes_on_its_own_pods_events_only(k8s_sim: SimulatorProcess) -> None:
    api = kube_config.new_client_from_config(str(k8s_sim.kubeconfig))
    core = k8s.CoreV1Api(api)
    instance = f"t{uuid.uuid4().hex[:10]}"
    others = [f"other-{i}" for i in range(12)]

    async def scenario() -> None:
        informer = PodInformer(core, NS, f"instance={instance}")
        informer.start()
        try:
            assert await informer.wait_synced(10)
            await asyncio.to_thread(core.create_namespaced_pod, NS, _pod("mine", instance, placed=False))
            assert await informer.wait_for(lambda: _unschedulable(informer.pods("mine")), 10, app="mine")

            checks = 0

            def gone() -> bool | None:
                nonlocal checks
                checks += 1
                return True if not informer.pods("mine") else None

            # recheck far beyond the test: only an event can wake the wait
            waiting = asyncio.create_task(informer.wait_for(gone, 60, recheck=60, app="mine"))
            await asyncio.sleep(0)
            for name in others:  # each: ADDED, then MODIFIED as the simulator schedules and pulls
                await asyncio.to_thread(core.create_namespaced_pod, NS, _pod(name, instance))
            for name in others:
                assert await informer.wait_for(partial(_present, informer, name), 10, app=name)
            for name in others:
                await asyncio.to_thread(core.delete_namespaced_pod, name, NS, grace_period_seconds=0)
            assert await informer.wait_for(lambda: True if not any(informer.pods(n) for n in others) else None,
                                           20, recheck=0.05)
            assert not waiting.done() and checks == 1, \
                f"the wait for 'mine' was checked {checks} times on {len(others)} other pods' events"

            started = time.monotonic()
            await asyncio.to_thread(core.delete_namespaced_pod, "mine", NS, grace_period_seconds=0)
            assert await asyncio.wait_for(waiting, 20) is True
            assert time.monotonic() - started < 10  # its own deletion woke it, not the 60 s recheck
            assert informer.pods() == [] and informer._app_changed == {}
        finally:
            await asyncio.to_thread(informer.stop)

    try:
        asyncio.run(scenario())
    finally:
        for pod in core.list_namespaced_pod(NS, label_selector=f"instance={instance}").items:
            core.delete_namespaced_pod(pod.metadata.name, NS, grace_period_seconds=0)
        api.close()
