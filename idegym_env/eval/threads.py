"""The thread executor (the default): ``parallel`` workers pull episodes from one queue.

The queue is ordered task by task so that a worker can keep its env (and sandbox) for the next
attempt of the same task; every env talks to the one control plane of the run. Each episode
runs in a thread of its own that the worker watches: past ``episode_timeout`` the episode is
recorded as a ``timeout`` error, its sandbox is stopped and the run goes on. Ctrl-C abandons the
running episodes (not recorded, so a resume redoes them) and stops their sandboxes.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from ..tasks import Task
from .episode import EvalAttempt, close_agent, close_env, kill_env, make_env, timed_out

if TYPE_CHECKING:
    from .runner import Runner

INTERRUPT_GRACE = 5.0  # seconds a Ctrl-C waits for running episodes' workers (their sandboxes go at once)


class ThreadExecutor:
    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.config = runner.config
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._running: dict[int, EvalAttempt] = {}

    def run(self, pending: list[tuple[Task, int]], url: str) -> bool:
        """Run the episodes; True when interrupted (Ctrl-C)."""
        work: queue.Queue[tuple[Task, int]] = queue.Queue()
        for item in pending:
            work.put(item)
        workers = [threading.Thread(target=self._worker, args=(i, work, url), name=f"eval-worker-{i}",
                                    daemon=True)
                   for i in range(min(self.config.parallel, len(pending)))]
        for w in workers:
            w.start()
        try:
            for w in workers:
                while w.is_alive():
                    w.join(0.2)
        except KeyboardInterrupt:
            # Stopping the running episodes' sandboxes and an agent blocked in its own call (a
            # model request) get one grace in all; the workers are daemons, and a sandbox still
            # running past it ends by the control plane's reaper once this client is gone.
            deadline = time.monotonic() + INTERRUPT_GRACE
            for t in [*self._cancel(), *workers]:
                t.join(max(deadline - time.monotonic(), 0.0))
            return True
        return False

    def _cancel(self) -> list[threading.Thread]:
        """Stop recording and abandon the running episodes, each from a thread of its own."""
        self.runner.stop_recording()
        with self._lock:
            self._stop.set()
            running = list(self._running.values())
        stoppers = [threading.Thread(target=episode.abandon, name="eval-abandon", daemon=True) for episode in running]
        for t in stoppers:
            t.start()
        return stoppers

    def _worker(self, index: int, work: queue.Queue[tuple[Task, int]], url: str) -> None:
        # The env this worker keeps for the next attempt of the same task (at most one). Each
        # episode gets the cache as an argument: an abandoned episode keeps the old one.
        cache: dict[str, Any] = {}
        progress = self.runner.progress
        assert progress is not None

        def env_for(task: Task, envs: dict[str, Any]) -> Any:
            env = envs.pop(task.id, None)
            for other in envs.values():
                close_env(other)  # finished: the control plane can hand its sandbox to someone else
            envs.clear()
            return env if env is not None else make_env(task, self.config, url)

        while not self._stop.is_set():
            try:
                task, attempt = work.get_nowait()
            except queue.Empty:
                break
            episode = EvalAttempt(task, attempt, self.config)
            episode.record["worker"] = f"thread-{index}"
            with self._lock:
                if self._stop.is_set():
                    break
                self._running[index] = episode
            progress.started()
            thread = threading.Thread(target=episode.play,
                                      args=(lambda t=task, c=cache: env_for(t, c), self.runner.agent_factory),
                                      name=f"episode-{task.id}-{attempt}", daemon=True)
            thread.start()
            deadline = episode.started + self.config.episode_timeout
            while not episode.done.wait(min(0.25, max(deadline - time.perf_counter(), 0.0))):
                if self._stop.is_set() or time.perf_counter() >= deadline:
                    break
            with self._lock:
                self._running.pop(index, None)
            if not episode.done.is_set():
                episode.abandon()
                cache = {}
                if self._stop.is_set():
                    progress.finished(episode.record, counted=False)
                    break
                timed_out(episode)
            elif episode.record.get("error_kind") in ("env", "grading"):
                if episode.env is not None:
                    kill_env(episode.env)
            elif episode.record.get("error") and episode.env is not None:
                close_env(episode.env)
            elif episode.env is not None:
                cache[task.id] = episode.env  # kept for the next attempt of this task
            close_agent(episode.agent)
            self.runner.commit(episode.record, episode.transcript())
        for env in cache.values():
            close_env(env)


__all__ = ["ThreadExecutor"]
