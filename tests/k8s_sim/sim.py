"""Wiring of the simulator: store, API server, controllers, kubelet; plus ``/_sim`` test hooks.

``/_sim`` endpoints (no auth, test-only, not Kubernetes):
  GET  /_sim/state                  → {"snapshots": bool, "pods": {"ns/name": {"pid", "ip", "dir"}}}
  POST /_sim/snapshots?enabled=1|0  → switch the GKE pod-snapshot CRDs on or off
  GET  /_sim/audit                  → [[user-agent, verb, group, resource], ...] as RBAC sees requests
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

from .api import ApiServer
from .controllers import DeploymentController, GarbageCollector, JobController, SnapshotController
from .images import ImageCatalog
from .kubelet import Kubelet
from .store import Store


class Simulator:
    def __init__(self, state_dir: Path, *, token: str | None = None, nodes: int = 3,
                 node_labels: dict[str, str] | None = None, snapshots: bool = False,
                 namespaces: tuple[str, ...] = ("default", "idegym"),
                 images: ImageCatalog | None = None, latency: float = 0.0) -> None:
        self.state_dir = state_dir
        self.token = token
        self.latency = latency  # added to every API request but a watch: a remote API server's round trip
        self.store = Store()
        self.images = images or ImageCatalog()
        self._nodes = nodes
        self._node_labels = node_labels or {}
        self._namespaces = namespaces
        self._snapshots = snapshots
        self.kubelet: Kubelet
        self.api = ApiServer(self)

    @property
    def snapshots_enabled(self) -> bool:
        return self.kubelet.snapshots_enabled

    async def start(self) -> None:
        """Create the controllers (they need the running loop), nodes and namespaces."""
        self.kubelet = Kubelet(self.store, self.state_dir, self.images)
        self.kubelet.snapshots_enabled = self._snapshots
        self.controllers = [DeploymentController(self.store), JobController(self.store)]
        GarbageCollector(self.store)
        SnapshotController(self.store, self.kubelet)
        for ns in self._namespaces:
            self.store.create("namespaces", "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns},
                                                 "status": {"phase": "Active"}})
        for i in range(self._nodes):
            name = f"sim-node-{i}"
            self.store.create("nodes", "", {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                      "kubernetes.io/arch": "amd64", **self._node_labels}},
                "spec": {},
                "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                           "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}},
            })

    async def stop(self) -> None:
        await self.kubelet.shutdown()
        for controller in self.controllers:
            controller.task.cancel()

    async def admin(self, request: web.Request) -> web.Response:
        tail = request.match_info["tail"]
        if tail == "state" and request.method == "GET":
            pods: dict[str, Any] = {}
            for uid, runtime in self.kubelet.runtimes.items():
                pods[f"{runtime.ns}/{runtime.name}"] = {"pid": self.kubelet.pids.get(uid), "ip": runtime.ip,
                                                        "dir": str(runtime.dir), "uid": uid}
            return web.json_response({"snapshots": self.snapshots_enabled, "pods": pods})
        if tail == "audit" and request.method == "GET":
            return web.json_response(sorted(self.api.audit))
        if tail == "snapshots" and request.method == "POST":
            self.kubelet.snapshots_enabled = request.query.get("enabled") in ("1", "true")
            return web.json_response({"snapshots": self.snapshots_enabled})
        return web.json_response({"error": f"unknown simulator hook {tail}"}, status=404)


async def serve(sim: Simulator, host: str, port: int, ready: asyncio.Future[int] | None = None,
                stop: asyncio.Event | None = None) -> None:
    await sim.start()
    runner = web.AppRunner(sim.api.app(), access_log=None, handle_signals=False, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    if ready is not None:
        ready.set_result(bound)
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        await sim.stop()
        await runner.cleanup()
