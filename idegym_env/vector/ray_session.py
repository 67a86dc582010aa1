"""A Ray started on demand, shared by the vector envs that rely on it and shut down by the last one."""

from __future__ import annotations

import os
import threading
from typing import Any

import ray

from .local_ray import LOOPBACK, use_loopback, wants_local_ray

_lock = threading.Lock()
_users = 0  # RayVectorEnvs using a Ray that one of them started


def acquire_ray(init_kwargs: dict[str, Any] | None) -> bool:
    """Make sure Ray is up; True when this env relies on a Ray started here (and must release it)."""
    global _users
    with _lock:
        if ray.is_initialized():
            if _users == 0:
                return False  # somebody else's Ray (a cluster, RLlib, a test fixture)
        else:
            kwargs = {"include_dashboard": False, "ignore_reinit_error": True, **(init_kwargs or {})}
            if wants_local_ray(kwargs.get("address")):
                # A Ray for this machine only: nothing of it listens beyond loopback.
                if os.environ.get("RAY_NODE_IP_ADDRESS", LOOPBACK) == LOOPBACK:
                    use_loopback()
                kwargs.setdefault("_node_ip_address", LOOPBACK)
            ray.init(**kwargs)
            _users = 0
        _users += 1
        return True


def release_ray() -> None:
    """Drop one user of a Ray started here; the last one shuts it down."""
    global _users
    with _lock:
        _users = max(_users - 1, 0)
        if _users == 0 and ray.is_initialized():
            ray.shutdown()


def ray_usable() -> bool:
    """Ray is initialised (False at interpreter shutdown, when even asking may fail)."""
    try:
        return ray.is_initialized()
    except Exception:  # noqa: BLE001 - interpreter shutdown
        return False


__all__ = ["acquire_ray", "release_ray", "ray_usable"]
