"""Fork on the Kubernetes backend, against the simulator: a GKE pod snapshot of the parent restored
into each child; the snapshot lives while a child stands on it (the simulator's kubelet restores
a pod's project directory: memory and processes are not modelled, nor copied by our fork)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import pytest

from control_plane.backends.base import BackendError, ForkChild
from control_plane.backends.kubernetes import KubernetesBackend
from control_plane.backends.kubernetes.fork import FORK_DATA
from control_plane.backends.kubernetes.manifests import RESTORE_ANNOTATION
from tests.k8s_sim.fixtures import SimulatorProcess
from tests.test_k8s_backend import bash, inspect, leftovers, request, run, spec_for

pytestmark = pytest.mark.kubernetes


async def _snapshots(backend: KubernetesBackend) -> set[str]:
    data = await asyncio.to_thread(inspect(backend).custom.list_namespaced_custom_object, "podsnapshot.gke.io",
                                   "v1", "idegym", "podsnapshots")
    return {s["metadata"]["name"] for s in data["items"]}


def _children(parent_spec, count: int) -> list[ForkChild]:
    out = []
    for _ in range(count):
        server_id = int(uuid.uuid4().int % 100_000) + 1
        out.append(ForkChild(replace(parent_spec, server_id=server_id,
                                     generated_name=f"{parent_spec.request.server_name}-{server_id}")))
    return out


def test_fork_restores_a_pod_snapshot_of_the_parent_into_each_child(k8s_sim: SimulatorProcess) -> None:
    k8s_sim.set_snapshots(True)

    async def scenario(backend: KubernetesBackend) -> None:
        assert backend.capabilities.fork
        parent_spec = spec_for(request())
        parent = await backend.create(parent_spec, 30)
        await bash(backend, parent, "echo at-the-fork > state.txt")
        before = await _snapshots(backend)
        children = await backend.fork(parent, _children(parent_spec, 3), 30)
        (snapshot,) = await _snapshots(backend) - before
        assert {c.data[FORK_DATA]["name"] for c in children} == {snapshot}
        for child in children:
            assert (await bash(backend, child, "cat state.txt"))["stdout"] == "at-the-fork\n"
            pod = backend.informers["idegym"].pods(child.name)[0]
            assert pod["metadata"]["annotations"][RESTORE_ANNOTATION] == snapshot
        # isolation both ways
        await bash(backend, parent, "echo parent-later > state.txt")
        await bash(backend, children[0], "echo child > state.txt")
        assert (await bash(backend, children[1], "cat state.txt"))["stdout"] == "at-the-fork\n"
        assert (await bash(backend, parent, "cat state.txt"))["stdout"] == "parent-later\n"
        # the parent goes; the children stay; the snapshot goes with the last child that stands on it
        await backend.delete(parent)
        assert (await bash(backend, children[1], "cat state.txt"))["stdout"] == "at-the-fork\n"
        restarted = await backend.restart(children[2], replace(parent_spec, server_id=children[2].data["server_id"],
                                                               generated_name=children[2].name), 30)
        assert (await bash(backend, restarted, "ls state.txt 2>&1"))["stdout"].count("No such") == 1  # the image
        await backend.delete(children[0])
        assert snapshot in await _snapshots(backend)
        await backend.delete(children[1])
        assert snapshot not in await _snapshots(backend)
        await backend.delete(restarted)
        for handle in (parent, *children):
            assert await leftovers(backend, handle.name) == []

    run(scenario, k8s_sim.backend_config(snapshots=True))


def test_fork_without_pod_snapshots_says_why(k8s_sim: SimulatorProcess) -> None:
    async def scenario(backend: KubernetesBackend) -> None:
        assert not backend.capabilities.fork
        parent_spec = spec_for(request())
        parent = await backend.create(parent_spec, 30)
        with pytest.raises(BackendError) as err:
            await backend.fork(parent, _children(parent_spec, 1), 30)
        assert err.value.status == 400 and "configuration" in err.value.message
        await backend.delete(parent)

    run(scenario, k8s_sim.backend_config(snapshots=False))
