"""The Ray executor (``use_ray``): each episode is a Ray task, at most ``parallel`` in flight.

A task makes its own env against the run's control plane and returns the record; a task that
overruns is cancelled with ``force=True``, which also ends an agent that never returns. Ctrl-C
cancels the tasks in flight; their episodes are not recorded, so a resume redoes them.
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
from .episode import Episode, describe, run_standalone

if TYPE_CHECKING:
    from .runner import RunConfig, Runner

RAY_GRACE = 120.0  # seconds past the limit before a Ray task is cancelled by force


def ray_episode(task: Task, attempt: int, config: RunConfig, url: str,
                agent_factory: AgentFactory) -> tuple[dict[str, Any], str]:
    """The body of one Ray task."""
    record, text = run_standalone(task, attempt, config, url, agent_factory)
    record["worker"] = "ray"
    return record, text


class RayExecutor:
    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.config = runner.config

    def run(self, pending: list[tuple[Task, int]], url: str) -> bool:
        """Run the episodes; True when interrupted (Ctrl-C)."""
        try:
            import ray
        except ImportError as exc:
            raise RuntimeError("--ray needs Ray: pip install 'idegym[ray]'") from exc
        started_ray = False
        if not ray.is_initialized():
            ray.init(address=self.config.ray_address, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": _pythonpath()}})
            started_ray = True
        _pickle_agent_modules_by_value(self.runner.agent_factory)
        options: dict[str, Any] = {"num_cpus": 0, "max_retries": 0}
        if is_loopback_url(url):
            # The control plane is only reachable from this machine: keep the episodes here.
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                node_id=ray.get_runtime_context().get_node_id(), soft=False)
        remote = ray.remote(ray_episode).options(**options)
        progress = self.runner.progress
        assert progress is not None
        todo = list(pending)
        in_flight: dict[Any, tuple[Task, int, float]] = {}
        try:
            while todo or in_flight:
                while todo and len(in_flight) < self.config.parallel:
                    task, attempt = todo.pop(0)
                    ref = remote.remote(task, attempt, self.config, url, self.runner.agent_factory)
                    in_flight[ref] = (task, attempt, time.perf_counter())
                    progress.started()
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.5)
                for ref in ready:
                    task, attempt, t0 = in_flight.pop(ref)
                    try:
                        record, text = ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - the task died (worker crash, cancel)
                        episode = Episode(task, attempt, self.config)
                        episode.fail("env", f"the Ray task failed: {describe(exc)}")
                        episode.record.update(worker="ray", wall_seconds=round(time.perf_counter() - t0, 3))
                        record, text = episode.record, episode.transcript()
                    self.runner.commit(record, text)
                limit = self.config.episode_timeout + RAY_GRACE
                for ref, (task, attempt, t0) in list(in_flight.items()):
                    if time.perf_counter() - t0 > limit:
                        ray.cancel(ref, force=True)
                        del in_flight[ref]
                        episode = Episode(task, attempt, self.config)
                        episode.fail("timeout", f"the Ray task exceeded {limit:g} s and was cancelled")
                        episode.record.update(worker="ray", wall_seconds=round(time.perf_counter() - t0, 3))
                        self.runner.commit(episode.record, episode.transcript())
        except KeyboardInterrupt:
            self.runner.stop_recording()
            for ref in in_flight:
                ray.cancel(ref, force=True)
            return True
        finally:
            if started_ray:
                ray.shutdown()
        return False


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


__all__ = ["RayExecutor", "ray_episode", "RAY_GRACE"]
