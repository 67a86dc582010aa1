"""The run loop: every (task, attempt) as an IdeGym episode, N at a time, results as they finish.

The :class:`Runner` decides what is left to do (a resume skips finished episodes), starts the
embedded control plane unless a URL is given, hands the episodes to an executor — threads
(``threads.py``, the default) or Ray tasks (``ray_tasks.py``, ``use_ray``) — records each
episode as it finishes, and writes the summary. One episode itself is ``episode.py``.

Ctrl-C stops the run: running episodes are abandoned (and not recorded, so a resume redoes
them), sandboxes are stopped, and the summary of what finished is written.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import IdeGymError
from ..tasks import Task
from .agents import AgentFactory, agent_source
from .episode import EvalAttempt, is_solved, run_standalone
from .manifest import ManifestMismatch, build_manifest, check_same_run, now
from .progress import Progress
from .ray_tasks import RayExecutor
from .records import ResultsDir, latest
from .summary import INFRASTRUCTURE, markdown, summarize, table, to_json
from .threads import ThreadExecutor

DEFAULT_EPISODE_TIMEOUT = 1800.0


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
        self._cancelled = False  # after Ctrl-C: what still finishes is not recorded
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
        else:
            broken = sum(1 for r in finished.values() if r.get("error_kind") in INFRASTRUCTURE)
            if broken:
                print(f"[eval] {broken} episode(s) already recorded ended in an infrastructure error and are not "
                      "run again; add --retry-errors to run them again", file=sys.stderr)
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
            else:
                preflight(url)
            executor = RayExecutor(self) if self.config.use_ray else ThreadExecutor(self)
            return executor.run(pending, url)
        finally:
            if embedded is not None:
                embedded.close()

    # -- recording -----------------------------------------------------------------------------------------

    def commit(self, record: dict[str, Any], transcript: str) -> None:
        """Record a finished episode (its transcript, its line in episodes.jsonl, the progress)."""
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

    def stop_recording(self) -> None:
        """The run is interrupted: episodes that finish from now on are not recorded."""
        with self._lock:
            self._cancelled = True


class ControlPlaneUnavailable(IdeGymError, RuntimeError):
    """The run's control plane cannot be used (unreachable, not a control plane, refused the
    credentials): nothing was run."""


def preflight(url: str) -> None:
    """Register and drop a client at ``url`` before any episode starts, so that a wrong URL or
    credentials fail the run at once with the client's own explanation instead of every episode."""
    from ..client import IdeGymClient, ServiceError

    try:
        with IdeGymClient(url, name="idegym-eval-preflight"):
            pass
    except (ServiceError, ValueError) as exc:
        raise ControlPlaneUnavailable(f"the control plane at {url.rpartition('@')[2]} cannot be used: {exc}") from exc


__all__ = ["Runner", "ControlPlaneUnavailable", "RunConfig", "EvalResult", "EvalAttempt", "is_solved", "run_standalone",
           "DEFAULT_EPISODE_TIMEOUT"]
