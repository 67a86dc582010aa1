"""The run loop: every (task, attempt) as an IdeGym episode, N at a time, results as they finish.

Threads (the default): ``parallel`` workers pull episodes from one queue, ordered task by task so
a worker can keep its env (and sandbox) for the next attempt of the same task; every env talks
to the one control plane of the run. Each episode runs in a thread of its own that the worker
watches: past ``episode_timeout`` the episode is recorded as a ``timeout`` error, its sandbox is
stopped and the run goes on. An exception in the agent is recorded as an ``agent`` error, one in
the environment (image build, sandbox start, lost sandbox, grading) as an ``env`` error.

Ray (``use_ray``): each episode is a Ray task (at most ``parallel`` in flight) that makes its own
env against the same control plane and returns the record; a task that overruns is cancelled
with ``force=True``, which also ends an agent that never returns.

Ctrl-C stops the run: running episodes are abandoned (and not recorded, so a resume redoes
them), sandboxes are stopped, and the summary of what finished is written.
"""

from __future__ import annotations

import queue
import re
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..tasks import Task
from .agents import FILE_MODULE_PREFIX, AgentFactory, agent_source, agent_usage, reset_agent
from .manifest import ManifestMismatch, build_manifest, check_same_run, episode_seed, image_of, now
from .progress import Progress
from .records import ResultsDir, latest, new_record
from .summary import markdown, summarize, table, to_json

DEFAULT_EPISODE_TIMEOUT = 1800.0
RAY_GRACE = 120.0  # seconds past the limit before a Ray task is cancelled by force


@dataclass
class RunConfig:
    """Everything that shapes a run besides the tasks and the agent."""

    out: Path
    agent_name: str
    agent_args: Mapping[str, Any] = field(default_factory=dict)
    attempts: int = 1
    parallel: int = 1
    episode_timeout: float = DEFAULT_EPISODE_TIMEOUT
    max_steps: int | None = None
    seed: int = 0
    control_plane_url: str | None = None
    use_ray: bool = False
    ray_address: str | None = None
    retry_errors: bool = False
    overwrite: bool = False
    pass_threshold: float | None = 1.0  # None: passed = solved
    progress: bool = True
    print_summary: bool = True
    bash_timeout: float = 120.0
    warm_pool: int = 1


@dataclass
class EvalResult:
    """What :func:`idegym_env.eval.evaluate` returns."""

    out: Path
    summary: dict[str, Any]
    records: list[dict[str, Any]]  # the latest record of every finished episode
    ran: int  # episodes run by this call (the others were already done)
    interrupted: bool = False

    @property
    def pass_rate(self) -> float | None:
        return self.summary["overall"]["pass_rate"]

    def table(self) -> str:
        return table(self.summary)


# -- one episode ---------------------------------------------------------------------------------------


def is_solved(task: Task, components: Mapping[str, float]) -> bool:
    """Every check of the task succeeded: setup, compilation and — if it has tests — all tests.

    The same as reward 1.0 for any reward without shaping; unlike it, not lowered by a step
    penalty (a reward of ``pass fraction - 0.005 per step`` can never reach 1.0).
    """
    ok = components.get("setup_succeeds") == 1.0 and components.get("compiles") == 1.0
    if task.test is not None:
        ok = ok and components.get("all_tests_pass") == 1.0
    return bool(ok)


class _AgentFailed(Exception):
    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _describe(exc: BaseException) -> str:
    text = _ANSI.sub("", f"{type(exc).__name__}: {exc}".strip())
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        text += f" (at {Path(last.filename).name}:{last.lineno} in {last.name})"
    return text[:2000]


class Episode:
    """One (task, attempt): its record, filled in as it runs, and the env it runs in."""

    def __init__(self, task: Task, attempt: int, config: RunConfig) -> None:
        self.task = task
        self.attempt = attempt
        self.seed = episode_seed(config.seed, task.id, attempt)
        self.config = config
        self.record = new_record(task.id, attempt, agent=config.agent_name, seed=self.seed,
                                 image=image_of(task), started_at=now())
        self.env: Any = None
        self.agent: Any = None
        self.done = threading.Event()
        self.abandoned = False
        self.lock = threading.Lock()
        self.started = time.perf_counter()
        self.tools: Counter[str] = Counter()

    # Runs in the episode's own thread (or in a Ray task). Once the episode is abandoned (timeout,
    # Ctrl-C) the thread writes nothing more: the record belongs to the watcher then.
    def play(self, get_env: Callable[[], Any], agent_factory: AgentFactory) -> None:
        try:
            self._play(get_env, agent_factory)
        except _AgentFailed as failed:
            self._fail_if_live("agent", _describe(failed.exc))
        except BaseException as exc:  # noqa: BLE001 - anything else is the environment's failure
            self._fail_if_live("env", _describe(exc))
        finally:
            with self.lock:
                if not self.abandoned:
                    self._stamp()
            self.done.set()

    def _stamp(self) -> None:
        self.record["wall_seconds"] = round(time.perf_counter() - self.started, 3)
        self.record["tokens"] = agent_usage(self.agent) if self.agent is not None else None
        self.record["tool_calls"] = dict(self.tools)

    def _fail_if_live(self, kind: str, message: str) -> None:
        with self.lock:
            if not self.abandoned:
                self.fail(kind, message)

    def _play(self, get_env: Callable[[], Any], agent_factory: AgentFactory) -> None:
        env = get_env()
        with self.lock:
            self.env = env
            if self.abandoned:
                kill_env(env)
                return
        try:
            self.agent = agent_factory()
            reset_agent(self.agent, self.task, self.seed)
        except BaseException as exc:  # noqa: BLE001 - even SystemExit: the agent's failure, not ours
            raise _AgentFailed(exc) from exc
        observation, info = env.reset(seed=self.seed)
        with self.lock:
            self.record["sandbox"] = info.get("sandbox")
            self.record["setup_seconds"] = round(time.perf_counter() - self.started, 3)
        info = {**info, "task": self.task.id, "attempt": self.attempt, "seed": self.seed}
        while not self.abandoned:
            try:
                action = self.agent(observation, info)
            except BaseException as exc:  # noqa: BLE001
                raise _AgentFailed(exc) from exc
            if self.abandoned:
                return
            observation, reward, terminated, truncated, info = env.step(action)
            with self.lock:
                if self.abandoned:
                    return
                self.record["steps"] += 1
                if info.get("invalid_action"):
                    self.record["invalid_actions"] += 1
                    self.tools["<invalid>"] += 1
                else:
                    self.tools[str(info.get("tool"))] += 1
                if terminated or truncated:
                    self._graded(float(reward), info, bool(terminated), bool(truncated))
                    return

    def _graded(self, reward: float, info: Mapping[str, Any], terminated: bool, truncated: bool) -> None:
        components = dict(info.get("reward_components") or {})
        solved = is_solved(self.task, components) if components else False
        threshold = self.config.pass_threshold
        self.record.update(
            reward=reward, reward_components=components or None, truncated=truncated, solved=solved,
            submitted=bool(info.get("submitted", terminated)),
            passed=solved if threshold is None else reward >= threshold - 1e-9,
            checks=_checks(info.get("checks") or {}))
        if info.get("sandbox_lost"):
            self.record.update(error=str(info.get("error")), error_kind="env", passed=False, reward=None)
        elif info.get("grading_errors"):
            self.record.update(error="; ".join(map(str, info["grading_errors"]))[:2000], error_kind="grading",
                               passed=False)

    def fail(self, kind: str, message: str) -> None:
        self.record.update(error=message, error_kind=kind, reward=None, passed=False, solved=False)

    def abandon(self) -> None:
        """Give up on the episode (from the watching thread): its env is stopped, not reused, and
        the episode's thread writes nothing more to the record."""
        with self.lock:
            self.abandoned = True
            env = self.env
        if env is not None:
            kill_env(env)

    def transcript(self) -> str:
        r = self.record
        head = (f"# episode {r['id']}  agent {r['agent']}  seed {r['seed']}  image {r['image']}\n"
                f"# started {r['started_at']}\n")
        body = ""
        if self.env is not None:
            try:
                body = self.env.render() or ""
            except Exception:  # noqa: BLE001 - a transcript is best effort
                body = ""
        said = _assistant_text(self.agent)
        if said:
            body += "\n\n# what the agent said (its messages that carried text)\n" + said
        if r.get("error"):
            tail = f"\n# ERROR ({r['error_kind']}): {r['error']}\n"
        else:
            tail = f"\n# reward {r['reward']}  passed {r['passed']}  steps {r['steps']}\n"
        return head + "\n" + body + tail


def _assistant_text(agent: Any) -> str:
    """The text of a chat agent's assistant messages (an agent with a ``messages`` list), if any."""
    messages = getattr(agent, "messages", None)
    if not isinstance(messages, list):
        return ""
    said = [m["content"] for m in messages
            if isinstance(m, Mapping) and m.get("role") == "assistant" and isinstance(m.get("content"), str)
            and m["content"].strip()]
    return "\n".join(f"> {text.strip()}" for text in said)


def _checks(checks: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for stage, answer in checks.items():
        if not isinstance(answer, Mapping):
            continue
        entry: dict[str, Any] = {"status": answer.get("status")}
        scores = answer.get("scores")
        if isinstance(scores, Mapping):
            entry.update({k: scores.get(k) for k in ("total", "passed", "failed", "skipped")})
        out[stage] = entry
    return out


def make_env(task: Task, config: RunConfig, url: str) -> Any:
    from ..env import IdeGymEnv

    return IdeGymEnv(task, control_plane_url=url, max_steps=config.max_steps, render_mode="ansi",
                     bash_timeout=config.bash_timeout)


def kill_env(env: Any) -> None:
    """Stop the env's sandbox (ending whatever runs in it) and close the env."""
    sandbox = getattr(env, "sandbox", None)
    if sandbox is not None:
        try:
            sandbox.stop()
        except Exception:  # noqa: BLE001 - already gone
            pass
    close_env(env)


def close_env(env: Any) -> None:
    try:
        env.close()
    except Exception:  # noqa: BLE001 - closing is best effort
        pass


def close_agent(agent: Any) -> None:
    close = getattr(agent, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001
            pass


def run_standalone(task: Task, attempt: int, config: RunConfig, url: str,
                   agent_factory: AgentFactory) -> tuple[dict[str, Any], str]:
    """One episode with its own env, under the time limit; used by Ray tasks."""
    episode = Episode(task, attempt, config)
    thread = threading.Thread(target=episode.play, args=(lambda: make_env(task, config, url), agent_factory),
                              name=f"episode-{task.id}-{attempt}", daemon=True)
    thread.start()
    if not episode.done.wait(config.episode_timeout):
        episode.abandon()
        _timed_out(episode)
    elif episode.env is not None:
        close_env(episode.env)
    close_agent(episode.agent)
    return episode.record, episode.transcript()


def _timed_out(episode: Episode) -> None:
    """Record an abandoned episode as a timeout (call after ``abandon()``)."""
    with episode.lock:
        limit = episode.config.episode_timeout
        episode.fail("timeout", f"the episode exceeded the time limit of {limit:g} s "
                                f"(after {episode.record['steps']} steps); its sandbox was stopped")
        episode._stamp()


def _ray_episode(task: Task, attempt: int, config: RunConfig, url: str,
                 agent_factory: AgentFactory) -> tuple[dict[str, Any], str]:
    record, text = run_standalone(task, attempt, config, url, agent_factory)
    record["worker"] = "ray"
    return record, text


# -- the run ---------------------------------------------------------------------------------------------


class Runner:
    def __init__(self, tasks: Sequence[Task], agent_factory: AgentFactory, config: RunConfig) -> None:
        if config.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if config.parallel < 1:
            raise ValueError("parallel must be at least 1")
        if config.episode_timeout <= 0:
            raise ValueError("episode_timeout must be positive")
        self.tasks = list(tasks)
        self.agent_factory = agent_factory
        self.config = config
        self.results = ResultsDir(config.out)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._cancelled = False
        self._running: dict[int, Episode] = {}
        self.progress: Progress | None = None
        self.ran = 0

    # -- set-up ------------------------------------------------------------------------------------------

    def _manifest(self) -> dict[str, Any]:
        c = self.config
        manifest = build_manifest(
            self.tasks, agent=c.agent_name, agent_args=c.agent_args, attempts=c.attempts, seed=c.seed,
            max_steps=c.max_steps, parallel=c.parallel, executor="ray" if c.use_ray else "threads",
            episode_timeout=c.episode_timeout, control_plane=c.control_plane_url or "embedded",
            pass_threshold=c.pass_threshold, agent_source=agent_source(self.agent_factory))
        if c.overwrite:
            self.results.clear()
        old = self.results.read_manifest()
        if old is None:
            if self.results.episodes.exists() and self.results.load():
                raise ManifestMismatch(
                    f"{self.results.episodes} exists but {self.results.manifest_path} does not: cannot tell "
                    "which run those episodes belong to; use another --out directory or --overwrite")
            self.results.write_manifest(manifest)
            return manifest
        check_same_run(old, manifest, self.results.root)
        source, was = manifest.get("agent_source"), old.get("agent_source")
        if source and was and source != was:
            print(f"[eval] warning: {manifest['agent_source']['file']} changed since this run started; "
                  "its results will mix both versions of the agent (use a new --out to keep them apart)",
                  file=sys.stderr)
        old.setdefault("resumed_at", []).append(now())
        self.results.write_manifest(old)
        return old

    def run(self) -> EvalResult:
        manifest = self._manifest()
        finished = latest(self.results.load())
        wanted = {(t.id, a) for t in self.tasks for a in range(self.config.attempts)}
        finished = {k: v for k, v in finished.items() if k in wanted}
        if self.config.retry_errors:
            finished = {k: v for k, v in finished.items() if not v.get("error")}
        pending = [(t, a) for t in self.tasks for a in range(self.config.attempts)
                   if (t.id, a) not in finished]
        self.progress = Progress(len(wanted), skipped=len(finished),
                                 passed=sum(bool(r.get("passed")) for r in finished.values()),
                                 failed=sum(bool(r.get("error")) for r in finished.values()),
                                 enabled=self.config.progress)
        interrupted = False
        try:
            if pending:
                interrupted = self._run_pending(pending)
        finally:
            self.progress.close()
        records = [r for k, r in latest(self.results.load()).items() if k in wanted]
        records.sort(key=lambda r: (r["task"], int(r["attempt"])))
        summary = summarize(records, manifest)
        self.results.write_text("summary.json", to_json(summary))
        self.results.write_text("summary.md", markdown(summary))
        if self.config.print_summary:
            print(markdown(summary), flush=True)
        return EvalResult(self.results.root, summary, records, self.ran, interrupted)

    def _run_pending(self, pending: list[tuple[Task, int]]) -> bool:
        """Run the episodes; True when interrupted (Ctrl-C)."""
        embedded = None
        url = self.config.control_plane_url
        try:
            if url is None:
                from ..embedded import EmbeddedControlPlane

                embedded = EmbeddedControlPlane(warm_pool=self.config.warm_pool)
                url = embedded.url
            if self.config.use_ray:
                return self._run_ray(pending, url)
            return self._run_threads(pending, url)
        finally:
            if embedded is not None:
                embedded.close()

    # -- recording -----------------------------------------------------------------------------------------

    def _commit(self, record: dict[str, Any], transcript: str) -> None:
        with self._lock:
            if self._cancelled:
                return
            try:
                record["transcript"] = self.results.write_transcript(record["task"], int(record["attempt"]),
                                                                    transcript)
            except OSError as exc:
                record["transcript"] = None
                print(f"[eval] cannot write the transcript of {record['id']}: {exc}", file=sys.stderr)
            self.results.append(record)
            self.ran += 1
            assert self.progress is not None
            self.progress.finished(record)

    # -- threads ---------------------------------------------------------------------------------------------

    def _run_threads(self, pending: list[tuple[Task, int]], url: str) -> bool:
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
            self._cancel()
            for w in workers:
                w.join(15)
            return True
        return False

    def _cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            self._stop.set()
            running = list(self._running.values())
        for episode in running:
            episode.abandon()

    def _worker(self, index: int, work: queue.Queue[tuple[Task, int]], url: str) -> None:
        # The env this worker keeps for the next attempt of the same task (at most one). Each
        # episode gets the cache as an argument: an abandoned episode keeps the old one.
        cache: dict[str, Any] = {}

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
            episode = Episode(task, attempt, self.config)
            episode.record["worker"] = f"thread-{index}"
            with self._lock:
                if self._stop.is_set():
                    break
                self._running[index] = episode
            assert self.progress is not None
            self.progress.started()
            thread = threading.Thread(target=episode.play,
                                      args=(lambda t=task, c=cache: env_for(t, c), self.agent_factory),
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
                    self.progress.finished(episode.record, counted=False)
                    break
                _timed_out(episode)
            elif episode.record.get("error_kind") in ("env", "grading"):
                if episode.env is not None:
                    kill_env(episode.env)
            elif episode.record.get("error") and episode.env is not None:
                close_env(episode.env)
            elif episode.env is not None:
                cache[task.id] = episode.env  # kept for the next attempt of this task
            close_agent(episode.agent)
            self._commit(episode.record, episode.transcript())
        for env in cache.values():
            close_env(env)

    # -- Ray ------------------------------------------------------------------------------------------

    def _run_ray(self, pending: list[tuple[Task, int]], url: str) -> bool:
        try:
            import ray
        except ImportError as exc:
            raise RuntimeError("--ray needs Ray: pip install 'idegym[ray]'") from exc
        started_ray = False
        if not ray.is_initialized():
            ray.init(address=self.config.ray_address, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": _pythonpath()}})
            started_ray = True
        _pickle_agent_modules_by_value(self.agent_factory)
        options: dict[str, Any] = {"num_cpus": 0, "max_retries": 0}
        if _is_loopback(url):
            # The control plane is only reachable from this machine: keep the episodes here.
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                node_id=ray.get_runtime_context().get_node_id(), soft=False)
        remote = ray.remote(_ray_episode).options(**options)
        todo = list(pending)
        in_flight: dict[Any, tuple[Task, int, float]] = {}
        try:
            while todo or in_flight:
                while todo and len(in_flight) < self.config.parallel:
                    task, attempt = todo.pop(0)
                    ref = remote.remote(task, attempt, self.config, url, self.agent_factory)
                    in_flight[ref] = (task, attempt, time.perf_counter())
                    assert self.progress is not None
                    self.progress.started()
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.5)
                for ref in ready:
                    task, attempt, t0 = in_flight.pop(ref)
                    try:
                        record, text = ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - the task died (worker crash, cancel)
                        episode = Episode(task, attempt, self.config)
                        episode.fail("env", f"the Ray task failed: {_describe(exc)}")
                        episode.record.update(worker="ray", wall_seconds=round(time.perf_counter() - t0, 3))
                        record, text = episode.record, episode.transcript()
                    self._commit(record, text)
                limit = self.config.episode_timeout + RAY_GRACE
                for ref, (task, attempt, t0) in list(in_flight.items()):
                    if time.perf_counter() - t0 > limit:
                        ray.cancel(ref, force=True)
                        del in_flight[ref]
                        episode = Episode(task, attempt, self.config)
                        episode.fail("timeout", f"the Ray task exceeded {limit:g} s and was cancelled")
                        episode.record.update(worker="ray", wall_seconds=round(time.perf_counter() - t0, 3))
                        self._commit(episode.record, episode.transcript())
        except KeyboardInterrupt:
            with self._lock:
                self._cancelled = True
            for ref in in_flight:
                ray.cancel(ref, force=True)
            return True
        finally:
            if started_ray:
                ray.shutdown()
        return False


def _is_loopback(url: str) -> bool:
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "::1") or host.startswith("127.")


def _pythonpath() -> str:
    import os

    parts = [str(Path.cwd()), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return os.pathsep.join(dict.fromkeys(parts))


def _pickle_agent_modules_by_value(factory: Any) -> None:
    """Agents loaded from a file path are not importable in a Ray worker: ship their module."""
    target = getattr(factory, "cls", None) or getattr(factory, "agent", None)
    module_name = getattr(target, "__module__", None) or getattr(type(target), "__module__", "")
    if module_name and module_name.startswith(FILE_MODULE_PREFIX) and module_name in sys.modules:
        from ray import cloudpickle  # Ray's own copy: the one that pickles task arguments

        cloudpickle.register_pickle_by_value(sys.modules[module_name])


__all__ = ["Runner", "RunConfig", "EvalResult", "Episode", "is_solved", "run_standalone",
           "DEFAULT_EPISODE_TIMEOUT"]
