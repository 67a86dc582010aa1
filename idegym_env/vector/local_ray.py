"""A Ray for this machine only: one node or a simulated cluster, every socket on 127.0.0.1.

Ray binds to the machine's interface address, and some of its ports to every address, unless
told otherwise; it also rewrites ``127.0.0.1`` in an address to the interface address when it
connects. Three settings keep it on loopback (measured with Ray 2.60): the environment variables
``RAY_NODE_IP_ADDRESS=127.0.0.1`` and ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (set before Ray
starts: its processes inherit them), ``_node_ip_address="127.0.0.1"`` in ``ray.init`` and
``node_ip_address="127.0.0.1"`` for every node of a :class:`ray.cluster_utils.Cluster`.

:class:`SimulatedCluster` runs several Ray nodes (raylets) on this host, which is how the tests
and the benchmarks exercise multi-node placement and node loss. :func:`non_loopback_listeners`
is the check that nothing Ray started listens anywhere but on loopback.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
LOOPBACK_ENV = {"RAY_NODE_IP_ADDRESS": LOOPBACK, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# Quiet, small Ray processes: no dashboard, no token warning on every start.
QUIET_ENV = {"RAY_AUTH_MODE": "disabled"}


def use_loopback() -> None:
    """Make every Ray started from this process from now on bind to 127.0.0.1."""
    os.environ.update(LOOPBACK_ENV)
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    # Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, when it is imported; its own processes
    # start fresh and read it from the environment, this one needs the constant set.
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False  # type: ignore[attr-defined]  # a ModuleType from sys.modules names none


def init_local(**kwargs: Any) -> None:
    """``ray.init`` of a new one-node Ray on loopback (``kwargs`` go to ``ray.init``): never a
    Ray that another process of this host started (``address="local"``)."""
    import ray

    use_loopback()
    ray.init(**{"address": "local", "include_dashboard": False, "_node_ip_address": LOOPBACK, **kwargs})


def wants_local_ray(address: str | None) -> bool:
    """True when ``ray.init(address=address)`` would start a new local Ray rather than join one."""
    return address in (None, "", "local") and not os.environ.get("RAY_ADDRESS")


def health_checks(node_death_s: float) -> dict[str, int]:
    """Ray's system config for GCS health checks that call a silent node dead after about
    ``node_death_s`` seconds (checks every quarter of it, four misses)."""
    if node_death_s <= 0:
        raise ValueError(f"node_death_s must be > 0, got {node_death_s}")
    period = max(int(node_death_s * 1000 / 4), 100)
    return {"health_check_initial_delay_ms": period, "health_check_period_ms": period,
            "health_check_timeout_ms": period, "health_check_failure_threshold": 4}


class SimulatedCluster:
    """``nodes`` Ray nodes on this host (a head and ``nodes - 1`` workers), connected as the driver.

    Each node has ``cpus_per_node`` CPUs and listens on 127.0.0.1 only; ``node_death_s`` (None:
    Ray's default, ~15 s) is how long a killed node is still called alive. ``remove(node)`` kills a
    node's processes the way a crash does (SIGKILL, unless ``graceful``); ``close()`` shuts the
    driver and every node down. A context manager.
    """

    def __init__(self, nodes: int = 3, cpus_per_node: int = 1, *, object_store_mb: int = 80,
                 node_death_s: float | None = None, **init_kwargs: Any) -> None:
        import ray
        from ray.cluster_utils import Cluster

        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        use_loopback()
        self._node_args: dict[str, Any] = {"num_cpus": cpus_per_node, "node_ip_address": LOOPBACK,
                           "object_store_memory": object_store_mb * 1024 * 1024}
        head_args: dict[str, Any] = {**self._node_args, "include_dashboard": False}
        if node_death_s is not None:  # Ray's default: a killed node is called dead after ~15 s
            head_args["_system_config"] = health_checks(node_death_s)
        self.cluster = Cluster(initialize_head=True, head_node_args=head_args)
        try:
            for _ in range(nodes - 1):
                self.cluster.add_node(**self._node_args)
            self.cluster.wait_for_nodes()
            ray.init(address=self.cluster.address, _node_ip_address=LOOPBACK,
                     **{"log_to_driver": False, "configure_logging": False, **init_kwargs})
        except BaseException:
            self.cluster.shutdown()
            raise

    @property
    def head(self) -> Any:
        return self.cluster.head_node

    @property
    def workers(self) -> list[Any]:
        """The worker nodes (``ray._private.node.Node``), in the order they were added."""
        return list(self.cluster.worker_nodes)

    def node(self, node_id: str) -> Any:
        for node in [self.head, *self.workers]:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no live node {node_id} in this cluster")

    def add(self) -> Any:
        node = self.cluster.add_node(**self._node_args)
        self.cluster.wait_for_nodes()
        return node

    def remove(self, node: Any, *, graceful: bool = False) -> None:
        self.cluster.remove_node(node, allow_graceful=graceful)

    def close(self) -> None:
        import ray

        try:
            ray.shutdown()
        finally:
            self.cluster.shutdown()

    def __enter__(self) -> SimulatedCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the check: what is listening, and where ------------------------------------------------------


def non_loopback_listeners(root: int | None = None) -> list[str]:
    """TCP sockets listening on anything but loopback, held by ``root`` (default: this process)
    or its descendants — which include every Ray process started from here, of one node or of a
    :class:`SimulatedCluster`. Each entry reads ``"<address>:<port> (pid <pid> <name>)"``."""
    pids = _descendants(os.getpid() if root is None else root)
    owners: dict[str, int] = {}
    for pid in pids:
        for inode in _socket_inodes(pid):
            owners.setdefault(inode, pid)
    out = []
    for address, port, inode in _listening():
        owner = owners.get(inode)
        if owner is None or _is_loopback(address):
            continue
        out.append(f"{address}:{port} (pid {owner} {_name(owner)})")
    return sorted(out)


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _socket_inodes(pid: int) -> Iterable[str]:
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return []
    inodes = []
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.append(target[8:-1])
    return inodes


def _listening() -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int, str]]:
    """``(address, port, inode)`` of every listening TCP socket in this network namespace."""
    out = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            hex_address, hex_port = fields[1].split(":")
            raw = b"".join(bytes.fromhex(hex_address[i:i + 8])[::-1] for i in range(0, width, 8))
            out.append((ipaddress.ip_address(raw), int(hex_port, 16), fields[9]))
    return out


def _is_loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


__all__ = ["LOOPBACK", "LOOPBACK_ENV", "SimulatedCluster", "health_checks", "init_local", "non_loopback_listeners",
           "use_loopback", "wants_local_ray"]
