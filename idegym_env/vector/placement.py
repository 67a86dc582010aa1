"""Where sub-envs run and where their sandboxes live.

Two placements (``info["placement"]`` of every reset):

* ``"node"`` (no ``control_plane_url``): a sub-env's sandboxes live on the node of its actor,
  in that node's embedded control plane with the local backend. On the driver's own node that
  is the driver's embedded control plane; on any other node a :class:`NodeControlPlane` that
  the registry starts when the first actor there asks for it.
* ``"shared"`` (``control_plane_url`` given): every actor uses that control plane, and its
  backend decides where the sandboxes live (the Kubernetes backend at scale).

Actors are spread over the nodes explicitly (:class:`NodeSpreader`): Ray's default scheduling
packs actors that reserve no CPU onto one node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import ray

NODE = "node"
SHARED = "shared"


@dataclass(frozen=True)
class Placement:
    """What an actor needs to find its control plane; pickled into each actor."""

    mode: str  # NODE or SHARED
    url: str | None = None  # SHARED: the control plane of every actor
    registry: Any = None  # NODE: the ControlPlaneRegistry actor (None when every actor is on the local node)
    local_node: str | None = None  # NODE: the driver's node, whose control plane is the driver's own
    local_url: str | None = None

    def control_plane_url(self) -> str:
        """The URL for an actor running here (the registry may start this node's control plane)."""
        if self.mode == SHARED:
            assert self.url is not None
            return self.url
        node = ray.get_runtime_context().get_node_id()
        if node == self.local_node and self.local_url:
            return self.local_url
        if self.registry is None:
            raise RuntimeError(f"this actor runs on node {node}, which has no control plane for it; "
                               "pass control_plane_url or let the vector env place its actors")
        return ray.get(self.registry.url_for.remote(node))


def driver_node_id() -> str | None:
    """The node this process runs on when it is a Ray driver on a node (not a worker, not Ray Client)."""
    try:
        from ray.util.client import ray as client_ray

        if client_ray.is_connected():
            return None
    except ImportError:  # pragma: no cover - older Ray
        pass
    context = ray.get_runtime_context()
    if context.worker.mode != ray.SCRIPT_MODE:  # inside a task or an actor (e.g. an RLlib EnvRunner)
        return None
    return context.get_node_id()


def own_node_id() -> str | None:
    """The node this process runs on, driver or worker (an RLlib EnvRunner); None under Ray Client,
    whose driver runs elsewhere."""
    try:
        from ray.util.client import ray as client_ray

        if client_ray.is_connected():
            return None
    except ImportError:  # pragma: no cover - older Ray
        pass
    return ray.get_runtime_context().get_node_id()


def required_resources(options: Mapping[str, Any]) -> dict[str, float]:
    """The resources an actor or task with these ``.options()`` needs on its node."""
    need = {"CPU": options.get("num_cpus") or 0, "GPU": options.get("num_gpus") or 0,
            "memory": options.get("memory") or 0, **(options.get("resources") or {})}
    return {k: float(v) for k, v in need.items() if v}


def alive_nodes(need: Mapping[str, float] | None = None) -> list[str]:
    """Ids of the live nodes that have ``need`` (in total, not necessarily free), in Ray's order."""
    out = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        have = node.get("Resources") or {}
        if all(have.get(k, 0.0) >= v for k, v in (need or {}).items()):
            out.append(node["NodeID"])
    return out


class NodeSpreader:
    """Picks the node for the next actor (or task): the live, eligible node with the fewest of ours.

    Ties go to the driver's node, then to Ray's node order. A node where an actor was lost with
    its node (:meth:`suspect`) is avoided from then on — Ray itself calls a SIGKILLed node alive
    for about 15 s — unless no other node is left.
    """

    def __init__(self, need: Mapping[str, float] | None = None, prefer: str | None = None) -> None:
        self.need = dict(need or {})
        self.prefer = prefer
        self.suspects: set[str] = set()

    def suspect(self, node_id: str | None) -> None:
        if node_id:
            self.suspects.add(node_id)

    def choose(self, placed: Iterable[str | None]) -> str:
        nodes = alive_nodes(self.need)
        if not nodes:
            raise RuntimeError(f"no live Ray node has the resources these actors ask for: {self.need}")
        healthy = [n for n in nodes if n not in self.suspects] or nodes
        counts = Counter(n for n in placed if n)
        order = {n: i for i, n in enumerate(healthy)}
        return min(healthy, key=lambda n: (counts[n], n != self.prefer, order[n]))


__all__ = ["NODE", "SHARED", "NodeSpreader", "Placement", "alive_nodes", "driver_node_id",
           "required_resources"]
