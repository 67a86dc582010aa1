"""Control planes per Ray node: the sandboxes of a sub-env live on the node of its actor.

* :class:`NodeControlPlane`, a Ray actor pinned to one node, holds that node's embedded control
  plane (local backend) through a detached keeper process (see ``node_keeper.py`` for why).
  Its URL is a loopback address: only the actors of that node use it.
* :class:`ControlPlaneRegistry`, one async actor per vector env (or eval run), starts the
  control plane of a node the first time an actor on that node asks for it (``url_for``), starts
  it again if it died, and stops them all on ``close``. The registry owns the node actors, and
  the driver owns the registry: when the driver goes, Ray ends them, and each keeper then stops
  its control plane.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import ray
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..ready_pipe import read_ready

START_TIMEOUT = 120.0  # a control plane's first start on a busy node, imports included
STOP_TIMEOUT = 60.0

# Forks once and lets the parent exit, so that the keeper is not a child of the Ray worker.
_DETACH = ("import os, sys\nif os.fork():\n    os._exit(0)\n"
           "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n")


def process_alive(pid: int) -> bool:
    """``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class NodeControlPlane:
    """The embedded control plane of the node this actor runs on (``ray.remote(NodeControlPlane)``)."""

    def __init__(self, warm_pool: int = 1) -> None:
        self.node_id = ray.get_runtime_context().get_node_id()
        lifeline_r, self._lifeline = os.pipe()  # the write end stays here, never inherited
        ready_r, ready_w = os.pipe()
        errors = tempfile.TemporaryFile(prefix="idegym-keeper-")
        try:
            subprocess.run([sys.executable, "-c", _DETACH, "-m", "idegym_env.vector.node_keeper",
                            "--lifeline-fd", str(lifeline_r), "--ready-fd", str(ready_w),
                            "--warm-pool", str(warm_pool)],
                           pass_fds=(lifeline_r, ready_w), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True, check=True,
                           timeout=30)
        finally:
            os.close(lifeline_r)
            os.close(ready_w)
        line = read_ready(ready_r, START_TIMEOUT, 65536).decode()
        answer: dict[str, Any] = json.loads(line) if line.strip() else {}
        if "url" not in answer:
            errors.seek(0)
            detail = answer.get("error") or errors.read().decode(errors="replace")[-2000:] or "no answer"
            os.close(self._lifeline)
            raise RuntimeError(f"the control plane of node {self.node_id} did not start within "
                               f"{START_TIMEOUT:g} s: {detail}")
        errors.close()
        self.url: str = answer["url"]
        self.pid: int = answer["pid"]
        self.keeper_pid: int = answer["keeper_pid"]
        self.state_dir: str = answer["state_dir"]
        self._stopped = False

    def describe(self) -> dict[str, Any]:
        """Where it is; raises when its control plane is no longer running."""
        if self._stopped or not process_alive(self.pid):
            raise RuntimeError(f"the control plane of node {self.node_id} (pid {self.pid}) is not running")
        return {"node_id": self.node_id, "url": self.url, "pid": self.pid, "keeper_pid": self.keeper_pid,
                "actor_pid": os.getpid(), "state_dir": self.state_dir}

    def stop_clients(self, client_ids: list[str]) -> None:
        """Stop these clients now (their actor died), so their sandboxes go without waiting for the reaper."""
        for client_id in client_ids:
            stop_client(self.url, client_id)

    def stop(self) -> bool:
        """Stop the control plane (it deletes its sandboxes); True once it and its keeper are gone."""
        if not self._stopped:
            self._stopped = True
            os.close(self._lifeline)
        deadline = time.monotonic() + STOP_TIMEOUT
        while time.monotonic() < deadline and (process_alive(self.pid) or process_alive(self.keeper_pid)):
            time.sleep(0.05)
        return not (process_alive(self.pid) or process_alive(self.keeper_pid))


RemoteNodeControlPlane = ray.remote(NodeControlPlane)


class ControlPlaneRegistry:
    """Starts, finds and stops the control planes of the nodes (``ray.remote(ControlPlaneRegistry)``)."""

    def __init__(self, warm_pool: int = 1) -> None:
        self._warm_pool = warm_pool
        self._planes: dict[str, Any] = {}  # node id -> NodeControlPlane actor
        self._locks: dict[str, asyncio.Lock] = {}
        self._closed = False

    async def url_for(self, node_id: str) -> str:
        """The URL of ``node_id``'s control plane, started if it is not running."""
        return (await self._describe(node_id))["url"]

    async def _describe(self, node_id: str) -> dict[str, Any]:
        if self._closed:
            raise RuntimeError("the control planes of this vector env are closed")
        async with self._locks.setdefault(node_id, asyncio.Lock()):
            plane = self._planes.get(node_id)
            if plane is not None:
                try:
                    return await plane.describe.remote()
                except (RayError, RuntimeError):
                    self._forget(node_id)
            plane = RemoteNodeControlPlane.options(
                num_cpus=0, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            ).remote(self._warm_pool)
            self._planes[node_id] = plane
            try:
                return await plane.describe.remote()
            except BaseException:
                self._forget(node_id)
                raise

    async def describe(self) -> dict[str, dict[str, Any]]:
        """The running control planes by node id (the ones that answer)."""
        out = {}
        for node_id, plane in list(self._planes.items()):
            try:
                out[node_id] = await plane.describe.remote()
            except (RayError, RuntimeError):
                pass
        return out

    async def stop_clients(self, node_id: str, client_ids: list[str]) -> None:
        plane = self._planes.get(node_id)
        if plane is not None:
            try:
                await plane.stop_clients.remote(client_ids)
            except (RayError, RuntimeError):
                pass  # that node's control plane is gone, and its sandboxes with it

    async def close(self) -> None:
        """Stop every node's control plane, and with them their sandboxes."""
        self._closed = True
        planes, self._planes = list(self._planes.values()), {}
        refs = [plane.stop.remote() for plane in planes]
        if refs:
            await asyncio.wait([asyncio.ensure_future(_quiet(r)) for r in refs], timeout=STOP_TIMEOUT + 5)
        for plane in planes:
            try:
                ray.kill(plane, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass

    def _forget(self, node_id: str) -> None:
        plane = self._planes.pop(node_id, None)
        if plane is not None:
            try:
                ray.kill(plane, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass


async def _quiet(ref: Any) -> Any:
    try:
        return await ref
    except Exception:  # noqa: BLE001 - a node that is gone took its control plane with it
        return None


RemoteControlPlaneRegistry = ray.remote(ControlPlaneRegistry)


def start_registry(warm_pool: int) -> Any:
    """A ``ControlPlaneRegistry`` actor on this process's own node: it must not go with another node."""
    here = ray.get_runtime_context().get_node_id()
    return RemoteControlPlaneRegistry.options(
        num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
    ).remote(warm_pool)


def close_registry(registry: Any) -> None:
    """Stop the other nodes' control planes (once the sandboxes are handed back), then ``registry``."""
    try:
        ray.get(registry.close.remote(), timeout=STOP_TIMEOUT + 10)
    except Exception:  # noqa: BLE001 - killed below; each keeper then stops its control plane
        pass
    try:
        ray.kill(registry, no_restart=True)
    except Exception:  # noqa: BLE001
        pass


def stop_client(url: str, client_id: str) -> None:
    """Best effort: stop a dead actor's client so that its sandboxes go now, not when its heartbeat
    times out."""
    from ..client import Settings, _plans
    from ..client._http import HTTPSession
    from ..client._sync import drive

    try:
        settings = Settings.resolve(url)
        http = HTTPSession(settings.url, unix_socket=settings.unix_socket, auth=settings.auth, default_timeout=10.0)
        try:
            drive(http, _plans.stop_client(client_id, "idegym"))
        finally:
            http.close()
    except Exception:  # noqa: BLE001 - the control plane's reaper gets it eventually
        pass


__all__ = ["ControlPlaneRegistry", "NodeControlPlane", "RemoteControlPlaneRegistry", "RemoteNodeControlPlane",
           "close_registry", "process_alive", "start_registry", "stop_client"]
