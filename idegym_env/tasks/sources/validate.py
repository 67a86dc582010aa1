"""``idegym tasks list|show|validate SOURCE``: look at a task source and prove its tasks.

``validate`` runs, for every task, the oracle (the task's ``solution`` tool calls, then submit)
and the untouched agent (submit at once) — in sandboxes through ``IdeGymEnv`` by default, or
with ``--local`` on this machine (SWE: a venv with pytest, Harbor: bubblewrap with the host's
tools, problems: the judge without a sandbox) — in parallel, with a progress line, and prints a
table. The exit code is 1 when an oracle misses 1.0 or an untouched run reaches it, 2 when a run
could not be made at all (an infrastructure error, reported as such: never as a reward).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from ..task import Task, TaskError
from . import load_source_tasks, open_source

DESCRIPTION = "List, show and validate the tasks of a source (humaneval, swe[:FILE], harbor[:DIR], bundled)."
EPILOG = """\
sources:
  humaneval                  HumanEval's 164 problems (pip install 'idegym[humaneval]')
  swe | swe:FILE             SWE-style instances (the shipped set, or a SWE-bench JSON/JSONL file)
  harbor | harbor:DIR        Harbor task directories (the shipped ones, or yours)
  one task: humaneval/HumanEval/0, swe/<instance_id>, harbor:DIR#<task>

examples:
  idegym tasks list swe
  idegym tasks show harbor/js-slugify
  idegym tasks validate humaneval --parallel 4
  idegym tasks validate swe --local
"""


@dataclass
class Row:
    task_id: str
    oracle: float | None = None
    untouched: float | None = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def valid(self) -> bool:
        return self.error is None and self.oracle == 1.0 and self.untouched is not None and self.untouched < 1.0


def _episode(task: Task, *, oracle: bool, env_kwargs: dict[str, Any]) -> float:
    """One episode through the env; an infrastructure failure raises instead of scoring 0."""
    from ...env import IdeGymEnv

    env = IdeGymEnv(task, **env_kwargs)
    try:
        env.reset()
        info: dict[str, Any] = {}
        reward: Any = 0.0
        for call in task.solution if oracle else []:
            _, reward, terminated, truncated, info = env.step(call.model_dump(mode="json"))
            if terminated or truncated:
                break
        else:
            _, reward, _, _, info = env.step({"tool": "submit"})
        if info.get("infrastructure_error"):
            raise RuntimeError(f"infrastructure: {info['infrastructure_error']}")
        return float(reward)
    finally:
        env.close()


def _local(task: Task, *, oracle: bool) -> float:
    source = str(task.metadata.get("source", ""))
    if source.startswith("swe:"):
        from .swe_local import run_task_locally

        return run_task_locally(task, oracle=oracle)[0]
    if source.startswith("harbor:"):
        from .harbor_local import run_locally

        reward, output = run_locally(task, oracle=oracle)
        if reward is None:
            raise RuntimeError(f"the verifier wrote no reward: {output[-300:]}")
        return reward
    if task.test is not None and task.test.harness == "judge" and task.grading.hidden:
        from .problems import run_locally as run_problem

        return run_problem(task, oracle=oracle)[0]
    raise TaskError(f"task {task.id!r}: no local runner for it (run without --local)")


def validate(tasks: list[Task], *, parallel: int = 4, local: bool = False, progress: bool = True,
             env_kwargs: dict[str, Any] | None = None) -> list[Row]:
    """Oracle and untouched runs of every task (see the module docstring), in task order."""
    from ...eval.progress import Progress

    bar = Progress(len(tasks), enabled=progress)

    def one(task: Task) -> Row:
        bar.started()
        row = Row(task.id)
        started = time.perf_counter()
        try:
            run = (lambda o: _local(task, oracle=o)) if local else (
                lambda o: _episode(task, oracle=o, env_kwargs=env_kwargs or {}))
            row.oracle = run(True)
            row.untouched = run(False)
        except Exception as exc:  # noqa: BLE001 - one task's failure is a row, not the end of the run
            row.error = f"{type(exc).__name__}: {exc}"[:500]
        row.seconds = time.perf_counter() - started
        bar.finished({"id": task.id, "passed": row.valid, "error": row.error, "error_kind": "run",
                      "reward": row.oracle or 0.0, "wall_seconds": row.seconds})
        return row

    try:
        if not tasks:
            return []
        with ThreadPoolExecutor(max(1, min(parallel, len(tasks)))) as pool:
            return list(pool.map(one, tasks))
    finally:
        bar.close()


def format_table(rows: list[Row]) -> str:
    width = max([len("task")] + [len(r.task_id) for r in rows])
    lines = [f"{'task':<{width}}  oracle  untouched  verdict  seconds", "-" * (width + 37)]
    for r in rows:
        verdict = "error" if r.error else ("ok" if r.valid else "INVALID")
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(f"{r.task_id:<{width}}  {fmt(r.oracle):>6}  {fmt(r.untouched):>9}  {verdict:<7}  {r.seconds:7.1f}")
        if r.error:
            lines.append(f"{'':<{width}}  {r.error}")
    ok = sum(r.valid for r in rows)
    errors = sum(r.error is not None for r in rows)
    lines.append(f"{ok}/{len(rows)} valid, {len(rows) - ok - errors} invalid, {errors} errors")
    return "\n".join(lines)


def add_tasks_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="tasks_command", required=True, metavar="COMMAND")
    lister = sub.add_parser("list", help="the tasks of a source")
    lister.add_argument("source")
    lister.add_argument("--json", action="store_true", help="one JSON object per task")
    show = sub.add_parser("show", help="one task: instruction, checks, grading files")
    show.add_argument("task", help="e.g. humaneval/HumanEval/0, swe/<instance_id>, harbor:DIR#<task>")
    check = sub.add_parser("validate", help="run the oracle and the untouched agent on every task")
    check.add_argument("source")
    check.add_argument("--parallel", type=int, default=4)
    check.add_argument("--local", action="store_true",
                       help="run on this machine without sandboxes (SWE: a venv with pytest via "
                            "IDEGYM_SWE_PYTHON; Harbor: bubblewrap and the host's tools)")
    check.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    check.add_argument("--control-plane-url", default=None, help="default: the embedded local control plane")
    check.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")


def _tasks_of(spec: str) -> list[Task]:
    if spec == "bundled" or spec.startswith("bundled/"):
        from ..loader import bundled_tasks, load_task

        return bundled_tasks() if spec == "bundled" else [load_task(spec.split("/", 1)[1])]
    return load_source_tasks(spec)


def run_tasks_command(args: argparse.Namespace) -> int:
    try:
        if args.tasks_command == "list":
            if args.source == "bundled":
                tasks = _tasks_of("bundled")
                rows = [(t.id, t.id, t.title) for t in tasks]
            else:
                source = open_source(args.source)
                rows = [(i, i, "") for i in source.ids]
            for ident, _, title in rows:
                print(json.dumps({"id": ident, "title": title}) if args.json else
                      (f"{ident}  {title}" if title else ident))
            return 0
        if args.tasks_command == "show":
            from ..loader import load_task

            task = load_task(args.task)
            print(_describe(task))
            return 0
        tasks = _tasks_of(args.source)[: args.limit]
        kwargs = {"control_plane_url": args.control_plane_url} if args.control_plane_url else {}
        rows = validate(tasks, parallel=args.parallel, local=args.local, env_kwargs=kwargs)
        print(format_table(rows))
        if args.json:
            with open(args.json, "w") as handle:
                json.dump([asdict(r) | {"valid": r.valid} for r in rows], handle, indent=1)
        if any(r.error for r in rows):
            return 2
        return 0 if all(r.valid for r in rows) else 1
    except TaskError as exc:
        print(f"idegym tasks: {exc}", file=sys.stderr)
        return 2


def _describe(task: Task) -> str:
    parts = [f"id: {task.id}", f"title: {task.title}", f"language: {task.language}",
             f"source: {task.metadata.get('source', 'task directory')}"]
    if task.environment is not None:
        parts.append("environment (Dockerfile):\n  " + task.environment.dockerfile.strip().replace("\n", "\n  "))
    elif task.image:
        parts.append(f"image: {task.image}")
    if task.project is not None:
        parts.append(f"project: {task.project}")
    if task.files:
        parts.append(f"starting files (written at reset): {sorted(task.files)[:10]}")
    for name, script in task.stages():
        parts.append(f"{name} stage ({getattr(script, 'harness', 'in-process')}, user {script.user}, "
                     f"timeout {script.timeout:g} s): {script.script[:300]}{' …' if len(script.script) > 300 else ''}")
    if task.test is not None and task.test.expected:
        parts.append(f"expected tests: {len(task.test.expected)}")
    grading = task.grading
    if grading:
        parts.append(f"grading files: {sorted(grading.project)[:10]} hidden: {sorted(grading.hidden)[:10]}")
    parts.append(f"editable: {list(task.editable) if task.editable else 'every existing file'}; "
                 f"graded {'in place' if task.grade_in_place else 'in a fresh sandbox'}")
    parts.append(f"oracle: {len(task.solution)} tool call(s)")
    parts.append("instruction:\n  " + task.instruction.strip().replace("\n", "\n  "))
    return "\n".join(parts)


__all__ = ["validate", "Row", "format_table", "add_tasks_arguments", "run_tasks_command", "DESCRIPTION", "EPILOG"]
