"""The Ray executor (``use_ray``): each episode is a Ray task, at most ``parallel`` in flight.

A task makes its own env and returns the record; a task that overruns is cancelled with
``force=True``, which also ends an agent that never returns. Ctrl-C cancels the tasks in flight;
their episodes are not recorded, so a resume redoes them.

Placement, as for the vector env (``idegym_env.vector.placement``): the tasks are spread over
the live nodes; without ``control_plane_url`` an episode's sandbox lives on its task's node (the
run's embedded control plane on the driver's node, one started per node elsewhere), with a
shared URL on that control plane (a loopback one keeps every task on the driver's node).
An episode whose node is lost (its task fails with the node) is run again on another node, up
to ``MAX_RERUNS`` times, and its record counts the ``reruns``: a lost node is not the agent's
failure and not a result.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..tasks import Task
from ..urls import is_loopback_url
from .agents import FILE_MODULE_PREFIX, AgentFactory
from .episode import EvalAttempt, describe, run_standalone

if TYPE_CHECKING:
    from .runner import RunConfig, Runner

RAY_GRACE = 120.0  # seconds past the limit before a Ray task is cancelled by force
MAX_RERUNS = 2  # runs of one episode after the first that lost their node


def ray_episode(task: Task, attempt: int, config: RunConfig, url: str,
                agent_factory: AgentFactory) -> tuple[dict[str, Any], str]:
    """The body of one Ray task."""
    import ray

    record, text = run_standalone(task, attempt, config, url, agent_factory)
    record["worker"] = "ray"
    record["node"] = ray.get_runtime_context().get_node_id()
    return record, text


class RayExecutor:
    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.config = runner.config
        self._registry: Any = None

    def run(self, pending: list[tuple[Task, int]], url: str) -> bool:
        """Run the episodes; True when interrupted (Ctrl-C)."""
        try:
            import ray
        except ImportError as exc:
            raise RuntimeError("--ray needs Ray: pip install 'idegym[ray]'") from exc
        from ..vector.failures import lost_with_node
        from ..vector.local_ray import LOOPBACK, use_loopback, wants_local_ray
        from ..vector.placement import NodeSpreader, driver_node_id

        started_ray = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {}
            if wants_local_ray(self.config.ray_address):
                use_loopback()  # a Ray for this machine only
                kwargs["_node_ip_address"] = LOOPBACK
            ray.init(address=self.config.ray_address, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": _pythonpath()}}, **kwargs)
            started_ray = True
        _pickle_agent_modules_by_value(self.runner.agent_factory)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._local_node = driver_node_id()
        self._node_local = self.config.control_plane_url is None  # url is then the run's embedded one
        spreader: NodeSpreader | None = NodeSpreader(prefer=self._local_node)
        pinned = None
        if not self._node_local and is_loopback_url(url):
            # The control plane is only reachable from this machine: keep the episodes here.
            spreader, pinned = None, ray.get_runtime_context().get_node_id()
        remote = ray.remote(ray_episode)
        progress = self.runner.progress
        assert progress is not None
        todo = list(pending)
        reruns: dict[tuple[str, int], int] = {}
        in_flight: dict[Any, tuple[Task, int, float, str | None]] = {}
        try:
            while todo or in_flight:
                while todo and len(in_flight) < self.config.parallel:
                    task, attempt = todo.pop(0)
                    node = spreader.choose(n for *_, n in in_flight.values()) if spreader else pinned
                    options: dict[str, Any] = {"num_cpus": 0, "max_retries": 0}
                    if node is not None:
                        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node,
                                                                                        soft=False)
                    ref = remote.options(**options).remote(task, attempt, self.config,
                                                           self._url_on(node, url), self.runner.agent_factory)
                    in_flight[ref] = (task, attempt, time.perf_counter(), node)
                    if (task.id, attempt) not in reruns:
                        progress.started()
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.5)
                for ref in ready:
                    task, attempt, t0, node = in_flight.pop(ref)
                    key = (task.id, attempt)
                    try:
                        record, text = ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - the task died (node lost, worker crash, cancel)
                        if lost_with_node(exc) and reruns.get(key, 0) < MAX_RERUNS:
                            if spreader is not None:
                                spreader.suspect(node)
                            reruns[key] = reruns.get(key, 0) + 1
                            todo.insert(0, (task, attempt))  # again, on another node
                            continue
                        episode = EvalAttempt(task, attempt, self.config)
                        episode.fail("env", f"the Ray task failed: {describe(exc)}")
                        episode.record.update(worker="ray", node=node,
                                              wall_seconds=round(time.perf_counter() - t0, 3))
                        record, text = episode.record, episode.transcript()
                    record["reruns"] = reruns.get(key, 0)
                    self.runner.commit(record, text)
                limit = self.config.episode_timeout + RAY_GRACE
                for ref, (task, attempt, t0, node) in list(in_flight.items()):
                    if time.perf_counter() - t0 > limit:
                        ray.cancel(ref, force=True)
                        del in_flight[ref]
                        episode = EvalAttempt(task, attempt, self.config)
                        episode.fail("timeout", f"the Ray task exceeded {limit:g} s and was cancelled")
                        episode.record.update(worker="ray", node=node,
                                              reruns=reruns.get((task.id, attempt), 0),
                                              wall_seconds=round(time.perf_counter() - t0, 3))
                        self.runner.commit(episode.record, episode.transcript())
        except KeyboardInterrupt:
            self.runner.stop_recording()
            for ref in in_flight:
                ray.cancel(ref, force=True)
            return True
        finally:
            self._close_registry()
            if started_ray:
                ray.shutdown()
        return False

    def _url_on(self, node: str | None, url: str) -> str:
        """The control plane for an episode on ``node``."""
        if not self._node_local or node is None or node == self._local_node:
            return url
        import ray

        if self._registry is None:
            from ..vector.node_control_plane import start_registry

            self._registry = start_registry(self.config.warm_pool)
        return ray.get(self._registry.url_for.remote(node))

    def _close_registry(self) -> None:
        registry, self._registry = self._registry, None
        if registry is None:
            return
        from ..vector.node_control_plane import close_registry

        close_registry(registry)


def _pythonpath() -> str:
    parts = [str(Path.cwd()), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return os.pathsep.join(dict.fromkeys(parts))


def _pickle_agent_modules_by_value(factory: Any) -> None:
    """Agents loaded from a file path are not importable in a Ray worker: ship their module."""
    target = getattr(factory, "cls", None) or getattr(factory, "agent", None)
    module_name = getattr(target, "__module__", None) or getattr(type(target), "__module__", "")
    if module_name and module_name.startswith(FILE_MODULE_PREFIX) and module_name in sys.modules:
        from ray import cloudpickle  # Ray's own copy: the one that pickles task arguments

        cloudpickle.register_pickle_by_value(sys.modules[module_name])


__all__ = ["MAX_RERUNS", "RAY_GRACE", "RayExecutor", "ray_episode"]
