"""Per-task and overall numbers of a run: pass rate, pass@k, mean reward, episode times.

* pass rate — passed episodes / episodes. Passed: reward 1.0 (or the run's ``--pass-threshold``;
  ``solved``: every check of the task succeeded, whatever the reward). An episode that errored
  (agent crash, timeout, broken environment) counts as not passed.
* pass@k — the unbiased estimator of Chen et al. (2021): with ``n`` attempts of which ``c`` passed,
  ``1 - C(n-c, k) / C(n, k)``; per task, and overall the mean over tasks (tasks with fewer than
  ``k`` finished attempts are left out of it).
* mean reward — over episodes, an errored episode counting 0.
* errors — episodes that ended in an error; infrastructure errors are those the environment
  failed (image build, sandbox start, a lost sandbox, a grading that could not run): the first line
  of the summary counts them, and ``idegym eval`` exits with status 1 when there is any.
* p50 / p95 — of the episodes' wall time (linear interpolation between ranks).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# The error kinds of episodes that neither the agent nor the task failed: the environment (sandbox,
# image, grading run) or the agent's model endpoint.
INFRASTRUCTURE = ("env", "model")


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """Probability that at least one of ``k`` attempts drawn from ``n`` (``c`` passed) passes."""
    if k < 1 or n < k:
        return None
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else None


def _stats(records: Sequence[Mapping[str, Any]], ks: Sequence[int]) -> dict[str, Any]:
    n = len(records)
    passed = sum(1 for r in records if r.get("passed"))
    errors = sum(1 for r in records if r.get("error"))
    infrastructure = sum(1 for r in records if r.get("error") and r.get("error_kind") in INFRASTRUCTURE)
    rewards = [float(r["reward"]) if r.get("reward") is not None else 0.0 for r in records]
    times = [float(r["wall_seconds"]) for r in records if r.get("wall_seconds") is not None]
    tokens = [r["tokens"].get("total_tokens") for r in records if isinstance(r.get("tokens"), Mapping)]
    tokens = [t for t in tokens if isinstance(t, int)]
    return {
        "episodes": n,
        "passed": passed,
        "errors": errors,
        "infrastructure_errors": infrastructure,
        "pass_rate": passed / n if n else None,
        "pass_at_k": {str(k): pass_at_k(n, passed, k) for k in ks},
        "mean_reward": float(np.mean(rewards)) if rewards else None,
        "p50_seconds": _percentile(times, 50),
        "p95_seconds": _percentile(times, 95),
        "mean_steps": float(np.mean([r.get("steps") or 0 for r in records])) if records else None,
        "total_tokens": sum(tokens) if tokens else None,
    }


def summarize(records: Sequence[Mapping[str, Any]], manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The summary of ``records`` (latest record per episode) of the run ``manifest`` describes."""
    attempts = int(manifest.get("attempts", 1))
    ks = sorted({1, attempts})
    task_ids = [t["id"] for t in manifest.get("tasks", [])] or sorted({r["task"] for r in records})
    by_task: dict[str, list[Mapping[str, Any]]] = {t: [] for t in task_ids}
    for record in records:
        by_task.setdefault(record["task"], []).append(record)
    tasks = {tid: _stats(rs, ks) for tid, rs in by_task.items()}
    overall = _stats(list(records), ks)
    for k in ks:  # overall pass@k: the mean over tasks, not over pooled episodes
        values = [s["pass_at_k"][str(k)] for s in tasks.values() if s["pass_at_k"][str(k)] is not None]
        overall["pass_at_k"][str(k)] = float(np.mean(values)) if values else None
    expected = len(task_ids) * attempts
    return {
        "agent": manifest.get("agent"),
        "task_set_hash": manifest.get("task_set_hash"),
        "attempts": attempts,
        "seed": manifest.get("seed"),
        "pass_criterion": manifest.get("pass_criterion"),
        "idegym": manifest.get("idegym"),
        "started_at": manifest.get("started_at"),
        "episodes_expected": expected,
        "episodes_done": len(records),
        "complete": len(records) >= expected,
        "overall": overall,
        "tasks": tasks,
    }


def _fmt(value: Any, kind: str = "") -> str:
    if value is None:
        return "–"
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "s":
        return f"{value:.1f}"
    if kind == "r":
        return f"{value:.3f}"
    return str(value)


def table(summary: Mapping[str, Any]) -> str:
    """The summary as a Markdown table (which also reads well in a terminal)."""
    ks = [k for k in summary["overall"]["pass_at_k"]]
    k_cols = [f"pass@{k}" for k in ks if k != "1"]
    tokens = summary["overall"].get("total_tokens") is not None
    header = ["task", "episodes", "passed", "pass rate", *k_cols, "mean reward", "errors", "p50 s", "p95 s",
              *(["tokens"] if tokens else [])]
    rows = []
    for name, stats in [*summary["tasks"].items(), ("**overall**", summary["overall"])]:
        row = [name, str(stats["episodes"]), str(stats["passed"]), _fmt(stats["pass_rate"], "pct")]
        row += [_fmt(stats["pass_at_k"][k], "pct") for k in ks if k != "1"]
        row += [_fmt(stats["mean_reward"], "r"), str(stats["errors"]), _fmt(stats["p50_seconds"], "s"),
                _fmt(stats["p95_seconds"], "s")]
        if tokens:
            row.append(_fmt(stats.get("total_tokens")))
        rows.append(row)
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    right = [i > 0 for i in range(len(header))]

    def line(cells: list[str]) -> str:
        padded = (c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True))
        return "| " + " | ".join(padded) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if r else (":" + "-" * (w + 1))
                         for w, r in zip(widths, right, strict=True)) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def markdown(summary: Mapping[str, Any]) -> str:
    version = summary.get("idegym") or {}
    ver = version.get("version", "?")
    if version.get("git_commit"):
        ver += f" ({version['git_commit'][:12]}{', dirty' if version.get('git_dirty') else ''})"
    state = "complete" if summary["complete"] else \
        f"INCOMPLETE: {summary['episodes_done']} of {summary['episodes_expected']} episodes"
    title = "# IdeGym evaluation"
    broken = summary["overall"].get("infrastructure_errors") or 0
    if broken:
        title += (f": {broken} of {summary['episodes_done']} episodes ended in an INFRASTRUCTURE ERROR (not scored; "
                  "see their error in episodes.jsonl)")
    head = [
        title,
        "",
        f"* agent: `{summary['agent']}`",
        f"* tasks: {len(summary['tasks'])} (task-set sha256 `{(summary['task_set_hash'] or '')[:16]}…`), "
        f"{summary['attempts']} attempt(s) each, seed {summary['seed']}",
        f"* passed means: {summary['pass_criterion']}",
        f"* idegym {ver}, started {summary.get('started_at')}",
        f"* episodes: {summary['episodes_done']} ({state})",
        "",
        "",
    ]
    return "\n".join(head) + table(summary) + "\n"


def to_json(summary: Mapping[str, Any]) -> str:
    return json.dumps(summary, indent=2) + "\n"


__all__ = ["pass_at_k", "summarize", "table", "markdown", "to_json"]
