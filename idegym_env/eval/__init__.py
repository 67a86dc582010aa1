"""``idegym eval``: a trustworthy pass rate for an agent on a set of tasks, without writing the loop.

    from idegym_env.eval import evaluate

    result = evaluate("bundled", "oracle", out="results/", parallel=4)
    print(result.table())                     # also in results/summary.md and summary.json
    assert result.pass_rate == 1.0

Every task is run ``attempts`` times as an IdeGym episode, ``parallel`` at a time (threads, or Ray
tasks with ``use_ray=True``), against one control plane (the embedded one unless
``control_plane_url`` is given). Each finished episode is appended to ``<out>/episodes.jsonl``;
running again into the same directory resumes: finished episodes are not redone. See
``docs/eval.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..tasks import Task, TaskSet
from .agents import Agent, AgentFactory, AgentSpecError, NoopAgent, OracleAgent, load_agent
from .manifest import ManifestMismatch, resolve_tasks, task_set_hash
from .runner import DEFAULT_EPISODE_TIMEOUT, EvalResult, RunConfig, Runner
from .summary import pass_at_k, summarize


def evaluate(
    tasks: str | Path | Task | TaskSet | Iterable[str | Path | Task],
    agent: str | Callable[..., Any],
    *,
    out: str | Path,
    agent_args: Mapping[str, Any] | None = None,
    attempts: int = 1,
    parallel: int = 1,
    episode_timeout: float = DEFAULT_EPISODE_TIMEOUT,
    max_steps: int | None = None,
    seed: int = 0,
    control_plane_url: str | None = None,
    use_ray: bool = False,
    ray_address: str | None = None,
    retry_errors: bool = False,
    overwrite: bool = False,
    pass_threshold: float | None = 1.0,
    progress: bool = True,
    print_summary: bool = False,
    bash_timeout: float = 120.0,
    agent_name: str | None = None,
) -> EvalResult:
    """Run every task ``attempts`` times with ``agent`` and return the results and their summary.

    ``tasks``: ``"bundled"``, a directory of tasks, a task directory, a bundled id, a
    comma-separated list of those, a ``TaskSet``, ``Task`` objects, or a list of any of these.
    ``agent``: ``"oracle"``, ``"noop"``, ``"openai"``, ``"module:Name"``, ``"file.py:Name"``, a class
    (one instance per episode, built with ``agent_args``) or a callable ``(observation, info) ->
    action`` shared by every episode. ``agent_name`` is how the run records an agent given as an
    object (default: its qualified name); a spec string records itself.

    An episode passes when its reward reaches ``pass_threshold`` (default 1.0); with
    ``pass_threshold=None`` when its task is solved — every check succeeded, whatever the reward
    (see :func:`episode.is_solved`; for rewards shaped so that 1.0 is out of reach).
    ``episode_timeout`` bounds each episode's wall time; an episode over it, or whose agent
    raises, is recorded as an error and the run goes on. Into a directory that holds a run,
    ``evaluate`` resumes it — or raises :class:`ManifestMismatch` if that run differs (tasks,
    agent, attempts, seed, step limit, pass criterion); ``overwrite=True`` discards it.
    """
    task_list = resolve_tasks(tasks)
    args = dict(agent_args or {})
    factory = load_agent(agent, args)
    if agent_name is None:
        agent_name = agent if isinstance(agent, str) else _qualname(agent)
    config = RunConfig(
        out=Path(out), agent_name=agent_name, agent_args=args, attempts=attempts, parallel=parallel,
        episode_timeout=episode_timeout, max_steps=max_steps, seed=seed, control_plane_url=control_plane_url,
        use_ray=use_ray, ray_address=ray_address, retry_errors=retry_errors, overwrite=overwrite,
        pass_threshold=pass_threshold, progress=progress, print_summary=print_summary,
        bash_timeout=bash_timeout)
    return Runner(task_list, factory, config).run()


def _qualname(obj: Any) -> str:
    target = obj if hasattr(obj, "__qualname__") else type(obj)
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"


__all__ = [
    "evaluate",
    "EvalResult",
    "Agent",
    "AgentFactory",
    "AgentSpecError",
    "OracleAgent",
    "NoopAgent",
    "load_agent",
    "resolve_tasks",
    "task_set_hash",
    "summarize",
    "pass_at_k",
    "ManifestMismatch",
]
