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
import re
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from sandbox_server.grading.models import GradedTests
from sandbox_server.models import Status

from ...rewards import CheckResults
from ...settings import add_control_plane_argument
from ..task import Task, TaskError
from . import _split, is_source_spec, load_source_tasks, open_source

DESCRIPTION = "List, show and validate the tasks of a source (humaneval, swe[:FILE], harbor[:DIR], bundled)."
EPILOG = """\
sources:
  humaneval                  HumanEval's 164 problems (pip install 'idegym[humaneval]')
  swe | swe:FILE             SWE-style instances (the shipped set, or a SWE-bench JSON/JSONL file)
  harbor | harbor:DIR        Harbor task directories (the shipped ones, or yours)
  one task: humaneval/HumanEval/0, swe/<instance_id>, harbor:DIR#<task>, a task directory,
            a bundled task's name; `validate` also takes a directory of task directories

examples:
  idegym tasks list swe                     (task specs, one a line)
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
    why: str | None = None  # why the oracle missed 1.0, from its checks
    seconds: float = 0.0

    @property
    def valid(self) -> bool:
        return self.error is None and self.oracle == 1.0 and self.untouched is not None and self.untouched < 1.0


# Grading runs Python with PYTHONSAFEPATH=1: the directory pytest or python starts in is not put on
# sys.path, so a test that imports a module at the project's top level needs the test layout to
# put it there.
SAFE_PATH_HINT = (
    "grading runs Python with PYTHONSAFEPATH=1, so the project directory is not on sys.path by itself "
    "(`python -m pytest` adds it only in your shell): give the tests a `tests/__init__.py` (pytest then "
    "puts the project root on sys.path) or `pythonpath = .` in the project's pytest.ini")


def diagnose(checks: Mapping[str, Any], reward: float) -> str | None:
    """Why an oracle run missed 1.0, in one line: the first failing stage and its cause
    (``checks`` is ``info["checks"]``, read back into the sandbox's models)."""
    if reward >= 1.0:
        return None
    for stage, check in CheckResults.from_responses(**checks).stages().items():
        if check.status == Status.SUCCESS:
            continue
        output = check.output
        cases = check.cases if isinstance(check, GradedTests) else []
        collection = any("collection" in c.message.lower() for c in cases) or (
            "error during collection" in output or "errors during collection" in output)
        if stage == "tests" and collection:
            missing = re.search(r"(ModuleNotFoundError|ImportError): [^\n]+", output)
            cause = f" ({missing.group(0)})" if missing else ""
            hint = f": {SAFE_PATH_HINT}" if missing else ""
            return f"the oracle's tests failed at collection{cause}{hint}"
        if check.timed_out:
            return f"the {stage} check timed out"
        failed = [c for c in cases if c.outcome not in ("passed", "skipped")]
        if failed:
            names = ", ".join(c.name for c in failed[:3]) + (" …" if len(failed) > 3 else "")
            return f"the {stage} check failed: {len(failed)} test(s) did not pass ({names})"
        skipped = [c for c in cases if c.outcome == "skipped"]
        if skipped:
            return (f"{len(skipped)} expected test(s) were skipped in the sandbox "
                    f"({', '.join(c.name for c in skipped[:3])}…): a skipped test counts as not passed")
        tail = output.strip().splitlines()[-1:] or [""]
        return f"the {stage} check failed (exit code {check.exit_code}): {tail[0][:200]}"
    return f"reward {reward:.3f} < 1.0 with every check passing: see the task's reward spec"


def _episode(task: Task, *, oracle: bool, env_kwargs: dict[str, Any]) -> tuple[float, str | None]:
    """One episode through the env, and why it missed 1.0 (``diagnose``); an infrastructure
    failure raises instead of scoring 0."""
    from ...env import DEFAULT_BASH_TIMEOUT, IdeGymEnv
    from ...tools import BashCall

    asked = [c.arguments.timeout for c in task.solution if isinstance(c, BashCall) and c.arguments.timeout]
    if oracle and asked:  # the task author's own calls get the time they name (an agent's are capped)
        env_kwargs = {**env_kwargs, "bash_timeout": max(env_kwargs.get("bash_timeout", DEFAULT_BASH_TIMEOUT), *asked)}
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
        return float(reward), diagnose(info.get("checks") or {}, float(reward))
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
            if local:
                row.oracle, row.untouched = _local(task, oracle=True), _local(task, oracle=False)
            else:
                row.oracle, row.why = _episode(task, oracle=True, env_kwargs=env_kwargs or {})
                row.untouched = _episode(task, oracle=False, env_kwargs=env_kwargs or {})[0]
        except Exception as exc:  # noqa: BLE001 - one task's failure is a row, not the end of the run
            row.error = f"{type(exc).__name__}: {exc}"
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
        if r.error:  # its head says what failed (the table shows that much; --json has all of it)
            lines.append(f"{'':<{width}}  {_head(r.error)}")
        elif r.why and not r.valid:
            lines.append(f"{'':<{width}}  {r.why}")
    ok = sum(r.valid for r in rows)
    errors = sum(r.error is not None for r in rows)
    lines.append(f"{ok}/{len(rows)} valid, {len(rows) - ok - errors} invalid, {errors} errors")
    return "\n".join(lines)


def _head(text: str, lines: int = 12, chars: int = 1500) -> str:
    kept = "\n".join(text.splitlines()[:lines])[:chars]
    return kept if kept == text else kept + " […]"


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
    add_control_plane_argument(check)
    check.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")


def _tasks_of(spec: str) -> list[Task]:
    """The tasks a source spec (``humaneval``, ``swe:FILE``, ``bundled``, a directory of task
    directories) or a task spec (anything ``gym.make`` takes as ``task=``) names."""
    from pathlib import Path

    from ..loader import TASK_FILE, TaskSet, bundled_tasks, load_task

    if spec == "bundled":
        return bundled_tasks()
    if spec.startswith("bundled/"):
        return [load_task(spec.split("/", 1)[1])]
    if is_source_spec(spec):
        return load_source_tasks(spec)
    path = Path(spec).expanduser()
    if path.is_dir() and not (path / TASK_FILE).is_file() and any(path.glob(f"*/{TASK_FILE}")):
        return list(TaskSet(path))  # a directory of task directories
    if not path.exists() and ":" in spec.split("/", 1)[0]:
        open_source(spec)  # `kind:where` of no kind we know: says which sources there are
    return [load_task(spec)]


def _listing(spec: str) -> list[tuple[str, str]]:
    """(task spec, title) of every task ``spec`` names: each spec is what ``gym.make(task=...)``,
    ``tasks show`` and ``tasks validate`` take."""
    if is_source_spec(spec) and _split(spec)[1] is None:
        source = open_source(spec)
        joint = "#" if ":" in spec else "/"
        return [(f"{spec}{joint}{i}", "") for i in source.ids]
    if spec == "bundled":
        return [(t.id, t.title) for t in _tasks_of(spec)]
    tasks = _tasks_of(spec)
    if len(tasks) == 1:
        return [(spec, tasks[0].title)]
    return [(str(t.root), t.title) for t in tasks]  # a directory of task directories


def run_tasks_command(args: argparse.Namespace) -> int:
    try:
        if args.tasks_command == "list":
            for spec, title in _listing(args.source):
                print(json.dumps({"task": spec, "title": title}) if args.json else
                      (f"{spec}  {title}" if title else spec))
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
