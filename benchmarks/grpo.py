"""GRPO rollouts: prompts × a group of children forked from one sandbox, against the raw ceiling.

What a GRPO trainer waits on (``RayVectorEnv(group_size=k)``, ``vector/sub_envs.py``): per prompt,
one ``IdeGymEnv.reset()`` (the group's leader gets a sandbox), ``env.fork(k - 1)`` (the rest of the
group continues from there), then every member plays its own episode — 10 tool calls through the
real tools (bash, read_file, write_file, edit_file: ``env.step``) — and is graded
(``{"tool": "submit"}``: the task's checks on a fresh sandbox); the forks are then discarded
(stopped). Full run: 16 prompts × a group of 8 on a generated Python package of 5,000 small files
with judge-run tests, at 8, 32 and 128 children in flight (``in flight / group`` groups at a time).
Half the members fix the bug, half make a wrong fix: a group's rewards differ, as GRPO needs.

The control plane is the one a user gets by default: an embedded control plane (``warm_pool=2``,
``warm_pool_max=8``), a new one for each level, first warmed by one episode so that its pool
watches the task's image (a trainer's state after its first episode); no pool is sized for the
benchmark.

Baseline, in the same run and at the same concurrency: the raw ceiling — the same commands as
direct subprocesses on the host, no isolation: a group's start is a copy of the project, its fork
7 more copies (``cp -a``, in parallel), bash calls are ``bash -c`` in the copy, file tools are file
operations in this process, grading runs the task's test script (the judge) in the child's copy
and reads its JUnit report. Every child's reward must be the task's expected one on every side.
At the target's level the ceiling is measured twice: from where this process runs (the target's
baseline), and from a cpu cgroup beside the sandboxes' (``beside_the_sandboxes``): all sandboxes
of the host weigh as one group against its other processes (docs/security.md: a CPU burner next
door), which decides the CPU they get on a busy host.

Reported: rollouts per second (children graded per second of wall time) and the ratio to the
ceiling (target ≥ 60 % at 32 in flight); p50/p95 per step (by tool, the first call on a new child
apart) and per grade; the pool under load (leaders and fork children served by a ready pool
sandbox, and how many waited on a sandbox start); and where the time goes: seconds per rollout in
start, fork, each tool and grade on every side; from the control plane's ``/metrics`` (the same
run) the time of each route at the control plane against the sandbox's own round trip; and each
call one at a time on an idle sandbox (the client's round trip, the command's time in the
sandbox, the raw call; a grade's restart apart from the rest).
``--quick``: 2 prompts × a group of 4 on 200 files at 8 in flight (a smoke run).
Writes ``results/grpo.json`` and ``results/grpo.png`` (``--results DIR`` elsewhere).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from control_plane.pool import MEMBER_PREFIX

from ._common import RESULTS, Result, Stats, check_target, percentile, table

TARGET_AT = 32
TARGET_RATIO = 0.60
POOL_PREFIX = f"{MEMBER_PREFIX}-"  # a sandbox the warm pool made (its name tells; a fork child keeps it)
BUG_LINE = "        return low  # above the range\n"
FIXES = ("        return high\n", "        return value\n")  # even members fix it, odd ones do not


@dataclass(frozen=True)
class Plan:
    prompts: int
    group: int
    levels: tuple[int, ...]
    files: int


FULL = Plan(prompts=16, group=8, levels=(8, 32, 128), files=5000)
QUICK = Plan(prompts=2, group=4, levels=(8,), files=200)

# -- the task -------------------------------------------------------------------------------------

CORE = '''"""Numeric helpers of mathpkg."""
from mathpkg.pkg00.mod0 import file0


def clamp(value, low, high):
    """``value`` limited to ``[low, high]``."""
    if value < low:
        return low
    if value > high:
''' + BUG_LINE + '''    return value


def base():
    return file0.value()
'''

TESTS = '''import unittest

from idegym_judge import subject

core = subject.module("mathpkg.core")


class ClampTest(unittest.TestCase):
    def test_below(self):
        self.assertEqual(core.clamp(-5, 0, 10), 0)

    def test_inside(self):
        self.assertEqual(core.clamp(5, 0, 10), 5)

    def test_above(self):
        self.assertEqual(core.clamp(15, 0, 10), 10)

    def test_package(self):
        self.assertEqual(core.base(), 0)
'''

TASK_YAML = '''id: grpo-clamp
title: "clamp: values above the range"
language: python
instruction: |
  `mathpkg.core.clamp(value, low, high)` returns `low` for values above the range. Fix it.
  Run the tests with `$IDEGYM_JUDGE tests/`. Only your changes to `mathpkg/core.py` are graded.
test:
  script: $IDEGYM_JUDGE tests/
  harness: judge
  timeout: 120
reward: test_pass_fraction
max_steps: 50
expected_tests: 4
protected_paths: [tests]
editable: [mathpkg/core.py]
'''
EXPECTED_TESTS = 4


def module_path(i: int) -> str:
    return f"mathpkg/pkg{i % 50:02d}/mod{i % 7}/file{i}.py"


def make_task(root: Path, files: int) -> Path:
    """A task directory: a Python package of ``files`` small modules (plus its ``__init__``
    files), ``mathpkg/core.py`` with the bug, and judge-run tests."""
    task = root / "grpo-clamp"
    project = task / "project"
    for i in range(files):
        path = project / module_path(i)
        if not path.parent.exists():
            path.parent.mkdir(parents=True)
            (path.parent / "__init__.py").write_text("")
            (path.parent.parent / "__init__.py").write_text("")
        path.write_text(f"VALUE = {i}\n\n\ndef value():\n    return VALUE\n\n\ndef double(x):\n    return 2 * x\n")
    (project / "mathpkg" / "__init__.py").write_text("")
    (project / "mathpkg" / "core.py").write_text(CORE)
    (project / "tests").mkdir()
    (project / "tests" / "test_core.py").write_text(TESTS)
    (task / "task.yaml").write_text(TASK_YAML)
    return task


def actions(prompt: int, member: int, files: int) -> list[dict[str, Any]]:
    """A member's 10 tool calls: 4 bash, 3 read_file, 2 edit_file, 1 write_file."""
    k = (prompt * 8 + member) % files
    bug = CORE.splitlines(keepends=True).index(BUG_LINE) + 1
    script = ("import mathpkg.core as c\n"
              f"print(c.clamp(-1, 0, 3), c.clamp(2, 0, 3), c.clamp({member + 4}, 0, 3), c.base())\n")
    return [
        {"tool": "bash", "arguments": {"command": f"grep -rl 'VALUE = {k}$' mathpkg | head -3; "
                                                  "grep -n 'def clamp' mathpkg/core.py"}},
        {"tool": "read_file", "arguments": {"path": "mathpkg/core.py"}},
        {"tool": "bash", "arguments": {"command": "find mathpkg -name '*.py' | wc -l"}},
        {"tool": "read_file", "arguments": {"path": module_path(k)}},
        {"tool": "edit_file", "arguments": {"path": "mathpkg/core.py", "start_line": bug, "end_line": bug,
                                            "new_content": FIXES[member % 2]}},
        {"tool": "write_file", "arguments": {"path": f"scratch/attempt{member}.py", "content": script}},
        {"tool": "bash", "arguments": {"command": f"python3 scratch/attempt{member}.py"}},
        {"tool": "edit_file", "arguments": {"path": module_path(k), "start_line": 1, "end_line": 1,
                                            "new_content": f"VALUE = {k}  # read by member {member}"}},
        {"tool": "bash", "arguments": {"command": "$IDEGYM_JUDGE tests/ 2>&1 | tail -3"}},
        {"tool": "read_file", "arguments": {"path": "mathpkg/core.py"}},
    ]


def expected_reward(member: int) -> float:
    return 1.0 if member % 2 == 0 else (EXPECTED_TESTS - 1) / EXPECTED_TESTS


# -- what one level records ------------------------------------------------------------------------

@dataclass
class Level:
    """One side (IdeGym or raw) at one concurrency."""

    side: str
    in_flight: int
    wall: float = 0.0
    rollouts: int = 0
    phases: dict[str, list[float]] = field(default_factory=dict)  # phase -> seconds (per event)
    rewards: dict[tuple[int, int], float] = field(default_factory=dict)
    pool: dict[str, int] = field(default_factory=dict)
    routes: dict[str, dict[str, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, phase: str, seconds: float) -> None:
        with self._lock:
            self.phases.setdefault(phase, []).append(seconds)

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.pool[what] = self.pool.get(what, 0) + n

    @property
    def rate(self) -> float:
        return self.rollouts / self.wall


def timed(level: Level, phase: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    started = time.perf_counter()
    value = fn(*args, **kwargs)
    level.add(phase, time.perf_counter() - started)
    return value


def run_groups(plan: Plan, in_flight: int, group: Callable[[int], None]) -> float:
    """Every prompt's group, ``in_flight // plan.group`` groups at a time; the wall time."""
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max(1, in_flight // plan.group)) as groups:
        for future in [groups.submit(group, p) for p in range(plan.prompts)]:
            future.result()
    return time.perf_counter() - started


def members(plan: Plan, work: Callable[[int], None]) -> None:
    with concurrent.futures.ThreadPoolExecutor(plan.group) as threads:
        for future in [threads.submit(work, m) for m in range(plan.group)]:
            future.result()


def tool_phase(action: dict[str, Any], first: bool) -> str:
    return "first call" if first else action["tool"]


# -- IdeGym ------------------------------------------------------------------------------------

def metrics(url: str) -> dict[str, float]:
    """The control plane's histogram sums and counts: ``route -> seconds``, ``route#n -> count``."""
    out: dict[str, float] = {}
    pattern = re.compile(r'^idegym_(http_request|forward)_seconds_(sum|count)(?:\{route="([^"]*)"\})? (\S+)$')
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if m := pattern.match(line):
            key = m.group(3) or "sandbox round trip (forwarded calls)"
            out[key if m.group(2) == "sum" else f"{key}#n"] = float(m.group(4))
    return out


def route_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, dict[str, float]]:
    routes = {}
    for key, total in after.items():
        if key.endswith("#n"):
            continue
        n = after.get(f"{key}#n", 0.0) - before.get(f"{key}#n", 0.0)
        if n > 0 and key != "/metrics":
            routes[key] = {"calls": int(n), "mean_ms": round((total - before.get(key, 0.0)) / n * 1e3, 2)}
    return routes


def idegym_level(plan: Plan, task: Any, in_flight: int, url: str) -> Level:
    """The level on a new embedded control plane at ``url``, after one episode that makes its
    pool watch the task's image (a trainer's state after its first episode)."""
    from idegym_env.env import IdeGymEnv

    level = Level("IdeGym", in_flight)
    warm = IdeGymEnv(task, control_plane_url=url)  # builds the image
    try:
        warm.reset(seed=0)
    finally:
        warm.close()
    leaders = [IdeGymEnv(task, control_plane_url=url) for _ in range(plan.prompts)]

    def group(prompt: int) -> None:
        leader = leaders[prompt]
        timed(level, "start (reset)", leader.reset, seed=prompt)
        assert leader.sandbox is not None and leader.sandbox.info is not None
        level.count("leaders from the pool" if (leader.sandbox.info.service_name or "").startswith(POOL_PREFIX)
                    else "leaders that waited on a start")
        forks = timed(level, "fork", leader.fork, plan.group - 1)
        pooled = sum(1 for f in forks if (f.sandbox.info.service_name or "").startswith(POOL_PREFIX))
        level.count("fork children from the pool", pooled)
        level.count("fork children that waited on a start", len(forks) - pooled)
        envs = [leader, *forks]

        def play(member: int) -> None:
            env = envs[member]
            for i, action in enumerate(actions(prompt, member, plan.files)):
                _obs, _r, terminated, truncated, info = timed(level, tool_phase(action, i == 0), env.step, action)
                assert not (terminated or truncated) and "error" not in info, info
            _obs, reward, terminated, _t, info = timed(level, "grade", env.step, {"tool": "submit"})
            assert terminated and not info.get("infrastructure_error"), info
            level.rewards[(prompt, member)] = float(reward)
            if member:
                timed(level, "discard fork", _discard, env)

        members(plan, play)

    before = metrics(url)
    try:
        level.wall = run_groups(plan, in_flight, group)
    finally:
        level.routes = route_deltas(before, metrics(url))
        for env in leaders:
            env.close()
    level.rollouts = len(level.rewards)
    return level


def _discard(env: Any) -> None:
    """What ``RayVectorEnv`` does with a fork the next group reset replaces: stop its sandbox."""
    if env.sandbox is not None:
        env.sandbox.stop()
        env.sandbox = None
    env.close()


# -- the raw ceiling -----------------------------------------------------------------------------

def raw_env() -> dict[str, str]:
    from sandbox_server.judge import judge_env

    path = "/usr/local/bin:/usr/bin:/bin"
    return {"PATH": path, "HOME": tempfile.gettempdir(), "LANG": "C.UTF-8", **judge_env(path)}


def raw_bash(cwd: Path, command: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, timeout=120,
                          start_new_session=True)


def raw_tool(cwd: Path, action: dict[str, Any], env: dict[str, str]) -> str:
    args = action["arguments"]
    if action["tool"] == "bash":
        done = raw_bash(cwd, args["command"], env)
        return done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
    path = cwd / args["path"]
    if action["tool"] == "read_file":
        return path.read_bytes().decode(errors="replace")
    if action["tool"] == "write_file":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(args["content"])
        return ""
    if action["tool"] == "edit_file":
        lines = path.read_text().splitlines(keepends=True)
        new = args["new_content"] if args["new_content"].endswith("\n") else args["new_content"] + "\n"
        lines[args["start_line"] - 1:args["end_line"]] = [new]
        path.write_text("".join(lines))
        return ""
    raise ValueError(f"no raw form of tool {action['tool']!r}")


def raw_grade(cwd: Path, env: dict[str, str], script: str) -> float:
    """The task's test script in the child's copy; the pass fraction from its JUnit report."""
    from sandbox_server.junit import parse_report

    with tempfile.TemporaryDirectory(prefix="grpo-report-") as reports:
        raw_bash(cwd, script, {**env, "IDEGYM_REPORT_DIR": reports})
        counts = parse_report(Path(reports) / "judge.xml")
    return counts.passed / EXPECTED_TESTS


CPU_ROOT = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller, where the local backend weighs sandboxes
SANDBOXES_TOP = "idegym"  # the local backend's top group: every control plane's sandboxes of the host below it
WEIGHTED = "raw, beside the sandboxes"


@contextlib.contextmanager
def beside_the_sandboxes() -> Iterator[bool]:
    """This process (and what it starts) in a cpu cgroup of its own where a control plane's
    sandboxes are: under the backend's top group, with a control plane group's weight. Every
    sandbox of the host (all control planes') shares that top group's weight against the host's
    other processes, so on a busy host a ceiling measured from the root group gets more of the
    CPU than the sandboxes can; measured from here it gets what they get. False (nothing moved)
    without cgroup v1's cpu controller or root."""
    procs = CPU_ROOT / "cgroup.procs"
    if not procs.exists() or os.geteuid() != 0:
        yield False
        return
    top = CPU_ROOT / SANDBOXES_TOP
    made_top = not top.exists()
    group = top / f"bench-raw-{os.getpid()}"
    group.mkdir(parents=True, exist_ok=True)
    try:
        (group / "cgroup.procs").write_text(str(os.getpid()))
        try:
            yield True
        finally:
            procs.write_text(str(os.getpid()))
    finally:
        group.rmdir()
        if made_top:
            with contextlib.suppress(OSError):  # a control plane's sandboxes are there by now
                top.rmdir()


def raw_level(plan: Plan, task_dir: Path, script: str, in_flight: int, scratch: Path, side: str = "raw") -> Level:
    level = Level(side, in_flight)
    env = raw_env()
    pristine = task_dir / "project"

    def copy(src: Path, dst: Path) -> None:
        done = subprocess.run(["cp", "-a", str(src), str(dst)], capture_output=True)
        assert done.returncode == 0, done.stderr

    def group(prompt: int) -> None:
        root = scratch / f"c{in_flight}-p{prompt}"
        root.mkdir()
        dirs = [root / f"m{m}" for m in range(plan.group)]
        timed(level, "start (reset)", lambda: copy(pristine, dirs[0]))

        def fork() -> None:
            with concurrent.futures.ThreadPoolExecutor(plan.group - 1) as threads:
                list(threads.map(lambda d: copy(dirs[0], d), dirs[1:]))

        timed(level, "fork", fork)

        def play(member: int) -> None:
            for i, action in enumerate(actions(prompt, member, plan.files)):
                timed(level, tool_phase(action, i == 0), raw_tool, dirs[member], action, env)
            level.rewards[(prompt, member)] = timed(level, "grade", lambda: raw_grade(dirs[member], env, script))
            if member:
                timed(level, "discard fork", lambda: shutil.rmtree(dirs[member]))

        members(plan, play)

    level.wall = run_groups(plan, in_flight, group)
    level.rollouts = len(level.rewards)
    return level


# -- one call at a time --------------------------------------------------------------------------

def probe(task: Any, task_dir: Path, plan: Plan, repeats: int, url: str) -> dict[str, list[float]]:
    """A member's calls one at a time, on an idle sandbox and on a host copy: the client's round
    trip of each (the env's path: ``Sandbox.run_tool``), the command's own time in the sandbox (the
    server's measure, bash), the raw call; then a grade (``grading.grade``, as ``submit`` runs it)
    in its parts: making the sandbox fresh (the restart) and the rest (ending the agent's
    processes, exporting its files, the checks), against the raw grade."""
    from idegym_env import grading
    from idegym_env.env import IdeGymEnv

    samples: dict[str, list[float]] = {}

    def add(label: str, seconds: float | None) -> None:
        if seconds is not None:
            samples.setdefault(label, []).append(seconds)

    variables = raw_env()
    script = task.test.script
    with tempfile.TemporaryDirectory(prefix="grpo-probe-") as tmp:
        copy = Path(tmp) / "copy"
        subprocess.run(["cp", "-a", str(task_dir / "project"), str(copy)], check=True)
        env = IdeGymEnv(task, control_plane_url=url)
        try:
            env.reset(seed=0)
            sandbox = env.sandbox
            assert sandbox is not None
            sandbox.bash("true")  # the tool spawner starts at the first call: the level runs time that apart
            for _ in range(repeats):
                for i, action in enumerate(actions(0, 0, plan.files)):
                    label = f"{i + 1:>2} {action['tool']}"
                    call = env.tool_calls.parse(action)
                    started = time.perf_counter()
                    answer = sandbox.run_tool(call, bash_timeout=120)
                    add(f"{label}: IdeGym", time.perf_counter() - started)
                    add(f"{label}: in the sandbox", getattr(answer, "duration_seconds", None))
                    started = time.perf_counter()
                    raw_tool(copy, action, variables)
                    add(f"{label}: raw", time.perf_counter() - started)

                def fresh() -> None:
                    started = time.perf_counter()
                    sandbox.restart()
                    add("grade: fresh sandbox (restart)", time.perf_counter() - started)

                started = time.perf_counter()
                graded = grading.grade(sandbox, task, fresh=fresh, steps=10, submitted=True)
                add("grade: IdeGym", time.perf_counter() - started)
                assert not graded.results.errors, graded.results.errors
                started = time.perf_counter()
                raw_grade(copy, variables, script)
                add("grade: raw", time.perf_counter() - started)
        finally:
            env.close()
    return samples


# -- the report ----------------------------------------------------------------------------------

PHASES = ["start (reset)", "fork", "first call", "bash", "read_file", "write_file", "edit_file", "grade",
          "discard fork"]
GROUP_PHASES = ("start (reset)", "fork", "discard fork")  # the sandboxes or copies; the rest is a member's own work


def per_rollout(level: Level) -> dict[str, float]:
    """Seconds of each phase per rollout (a group's start and fork count for each of its members)."""
    return {p: sum(level.phases.get(p, [])) / level.rollouts for p in PHASES}


def plot(path: Path, plan: Plan, levels: list[dict[str, Level]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5), dpi=110)
    sides = [s for s in ("IdeGym", "raw", WEIGHTED) if any(s in by for by in levels)]
    width = 0.8 / len(sides)
    colors = {"IdeGym": "tab:blue", "raw": "grey", WEIGHTED: "silver"}
    names = {"IdeGym": "IdeGym (embedded control plane)", "raw": "raw subprocesses (the ceiling)",
             WEIGHTED: "raw, in a cgroup beside the sandboxes'"}
    for k, side in enumerate(sides):
        shown = [(x + (k - (len(sides) - 1) / 2) * width, by) for x, by in enumerate(levels) if side in by]
        xs = [x for x, _ in shown]
        ax.bar(xs, [by[side].rate for _, by in shown], width, color=colors[side], label=names[side])
        if side == "IdeGym":
            for x, by in shown:
                ax.annotate(f"{by['IdeGym'].rate / by['raw'].rate:.0%}", (x, by["IdeGym"].rate), ha="center",
                            va="bottom", fontsize=9)
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_xticks(range(len(levels)), [f"{by['IdeGym'].in_flight} in flight" for by in levels])
    ax.set_ylabel("rollouts per second (IdeGym's share of the ceiling on its bar)")
    ax.set_title(f"GRPO: {plan.prompts} prompts × group of {plan.group}, {plan.files:,} files, 10 calls + grade")
    ax.legend(fontsize=8)
    labels, bars = [], []
    for by in levels:
        for side in (s for s in sides if s in by):
            labels.append(f"{side.split(',')[0]}{'*' if side == WEIGHTED else ''}\n{by[side].in_flight}")
            bars.append(per_rollout(by[side]))
    bottoms = [0.0] * len(bars)
    for phase in PHASES:
        heights = [b[phase] for b in bars]
        bx.bar(range(len(bars)), heights, 0.7, bottom=bottoms, label=phase)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    bx.set_xticks(range(len(labels)), labels, fontsize=7)
    bx.set_ylabel("seconds per rollout by phase (summed over its calls)")
    bx.set_title("Where a rollout's time goes" + (" (raw* = raw beside the sandboxes)" if WEIGHTED in sides else ""))
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run(quick: bool = False, results: Path = RESULTS) -> Result:
    from idegym_env.embedded import EmbeddedControlPlane
    from idegym_env.tasks import load_task

    plan = QUICK if quick else FULL
    name = "grpo_quick" if quick else "grpo"
    result = Result(name, f"GRPO rollouts: {plan.prompts} prompts × group of {plan.group} forked from one sandbox, "
                          "vs the raw ceiling")
    load = [f"start {_load()}"]
    levels: list[dict[str, Level]] = []
    probed: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as tmp:
        task_dir = make_task(Path(tmp), plan.files)
        task = load_task(task_dir)
        assert task.test is not None
        script = task.test.script
        for in_flight in plan.levels:
            print(f"\n{in_flight} children in flight ...", flush=True)
            by: dict[str, Level] = {}
            scratch = Path(tmp) / f"raw{in_flight}"
            scratch.mkdir()
            by["raw"] = raw_level(plan, task_dir, script, in_flight, scratch)
            shutil.rmtree(scratch)
            if in_flight == TARGET_AT or quick:  # a diagnosis of the target's level (a run's time is scarce)
                scratch.mkdir()
                with beside_the_sandboxes() as moved:
                    if moved:
                        by[WEIGHTED] = raw_level(plan, task_dir, script, in_flight, scratch, WEIGHTED)
                shutil.rmtree(scratch)
            with EmbeddedControlPlane() as cp:  # the default configuration, new for each level
                by["IdeGym"] = idegym_level(plan, task, in_flight, cp.url)
                if in_flight == plan.levels[0]:  # the quietest host of the run
                    print("\none call at a time: where a step's and a grade's time goes ...", flush=True)
                    probed = probe(task, task_dir, plan, 1 if quick else 3, cp.url)
            levels.append(by)
            load.append(f"after {in_flight} {_load()}")
            print("  " + ", ".join(f"{side} {level.rate:.2f}/s" for side, level in by.items())
                  + f": IdeGym / raw {by['IdeGym'].rate / by['raw'].rate:.0%}", flush=True)
    _report(result, plan, levels, probed, load)
    results.mkdir(parents=True, exist_ok=True)
    png = results / f"{name}.png"
    plot(png, plan, levels)
    result.figures["plot"] = png.name
    return result


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _ms(values: list[float], pct: float) -> float:
    return round(percentile(sorted(v * 1e3 for v in values), pct), 2) if values else float("nan")


def _check_rewards(plan: Plan, by: dict[str, Level]) -> None:
    """Every child's reward the task's expected one, the same on every side."""
    for side, level in by.items():
        if level.rollouts != plan.prompts * plan.group:
            raise RuntimeError(f"{side}: {level.rollouts} rollouts graded, not {plan.prompts * plan.group}")
        wrong = sorted(k for k, v in level.rewards.items() if abs(v - expected_reward(k[1])) > 1e-9)
        if wrong:
            raise RuntimeError(f"{side}: rewards other than the task's for (prompt, member) {wrong}: "
                               f"{[level.rewards[k] for k in wrong]}")


def _report(result: Result, plan: Plan, levels: list[dict[str, Level]], probed: dict[str, list[float]],
            load: list[str]) -> None:
    rows, rollouts, breakdown, pool, routes, steps, members_work = [], [], [], [], [], [], []
    for by in levels:
        _check_rewards(plan, by)
        ide, raw = by["IdeGym"], by["raw"]
        weighted = by.get(WEIGHTED)
        ratio = ide.rate / raw.rate
        rows.append([ide.in_flight, ide.rollouts, round(ide.rate, 3), round(raw.rate, 3),
                     round(weighted.rate, 3) if weighted else "-", f"{ratio:.0%}",
                     f"{ide.rate / weighted.rate:.0%}" if weighted else "-"])
        own = {side: sum(v for p, v in per_rollout(level).items() if p not in GROUP_PHASES)
               for side, level in by.items()}
        members_work.append({"in flight": ide.in_flight, "IdeGym s": round(own["IdeGym"], 4),
                             "raw s": round(own["raw"], 4), "raw s / IdeGym s": round(own["raw"] / own["IdeGym"], 4)})
        rollouts.append({"in flight": ide.in_flight, "rollouts": ide.rollouts, "IdeGym s": round(ide.wall, 3),
                         "IdeGym rollouts/s": round(ide.rate, 4), "raw s": round(raw.wall, 3),
                         "raw rollouts/s": round(raw.rate, 4), "IdeGym / raw": round(ratio, 4),
                         "raw beside the sandboxes rollouts/s": round(weighted.rate, 4) if weighted else None,
                         "IdeGym / raw beside the sandboxes": round(ide.rate / weighted.rate, 4) if weighted else None})
        for side, level in by.items():
            share = per_rollout(level)
            breakdown.append({"in flight": level.in_flight, "side": side,
                              **{f"{p} s": round(share[p], 4) for p in PHASES}})
            for phase, values in level.phases.items():
                result.stats.append(Stats.of(f"{side} at {level.in_flight} in flight: {phase}", values))
        for phase in PHASES:
            if phase in ide.phases:
                steps.append({"in flight": ide.in_flight, "phase": phase,
                              "IdeGym p50 ms": _ms(ide.phases[phase], 50), "IdeGym p95 ms": _ms(ide.phases[phase], 95),
                              "raw p50 ms": _ms(raw.phases.get(phase, []), 50),
                              "raw p95 ms": _ms(raw.phases.get(phase, []), 95)})
        children = plan.prompts * (plan.group - 1)
        waited = ide.pool.get("fork children that waited on a start", 0)
        pool.append({"in flight": ide.in_flight,
                     **{k: ide.pool.get(k, 0) for k in ("leaders from the pool", "leaders that waited on a start",
                                                        "fork children from the pool",
                                                        "fork children that waited on a start")},
                     "share of children that waited": round(waited / children, 3)})
        for route, figures in sorted(ide.routes.items()):
            routes.append({"in flight": ide.in_flight, "route": route, **figures})
    probe_rows = []
    for label in sorted({k.rsplit(": ", 1)[0] for k in probed}):
        row = {"call": label}
        for part in ("IdeGym", "in the sandbox", "fresh sandbox (restart)", "raw"):
            values = probed.get(f"{label}: {part}")
            row[f"{part} p50 ms"] = _ms(values, 50) if values else None
        probe_rows.append(row)
    result.figures["rollouts"] = rollouts
    result.figures["a member's calls and grade, seconds per rollout (no start, fork, discard)"] = members_work
    result.figures["p50 and p95 per step and per grade"] = steps
    result.figures["seconds per rollout by phase"] = breakdown
    result.figures["warm pool under load"] = pool
    result.figures["control plane: mean ms per call by route, and the sandbox round trip"] = routes
    result.figures["one call at a time (idle sandbox vs host copy)"] = probe_rows
    result.figures["rewards as the task expects on every side"] = True
    result.figures["plan"] = {"prompts": plan.prompts, "group": plan.group, "tool calls per child": 10,
                              "project files": plan.files, "levels": list(plan.levels),
                              "control plane": "embedded, default (warm_pool 2, warm_pool_max 8)"}
    result.figures["load average (1, 5, 15 min)"] = "; ".join(load)
    print("\nrollouts per second (children graded per second of wall time):")
    print(table(["in flight", "rollouts", "IdeGym /s", "raw /s", "raw beside /s", "IdeGym / raw",
                 "IdeGym / raw beside"], rows))
    print("\na member's own work (its 10 calls and its grade), seconds per rollout, and the raw ceiling's share:")
    print(table(list(members_work[0]), [list(m.values()) for m in members_work]))
    print("\np50 / p95 ms per step and per grade:")
    print(table(list(steps[0]), [list(s.values()) for s in steps]))
    print("\nseconds per rollout by phase:")
    print(table(["in flight", "side", *PHASES], [list(b.values()) for b in breakdown]))
    print("\nthe warm pool under load:")
    print(table(list(pool[0]), [list(p.values()) for p in pool]))
    print("\ncontrol plane: mean ms per call by route (and the sandbox's round trip of forwarded calls):")
    print(table(["in flight", "route", "calls", "mean ms"], [list(r.values()) for r in routes]))
    print("\none call at a time, p50 ms (an idle sandbox against a host copy):")
    print(table(list(probe_rows[0]), [["-" if v is None else v for v in r.values()] for r in probe_rows]))
    at = next((by for by in levels if by["IdeGym"].in_flight == TARGET_AT), None)
    if at is not None:
        result.targets["grpo_vs_raw"] = check_target(f"GRPO rollouts/s vs the raw ceiling at {TARGET_AT} in flight",
                                                     at["IdeGym"].rate / at["raw"].rate * 100, TARGET_RATIO * 100,
                                                     unit="%", lower_is_better=False)
        print("\n" + result.targets["grpo_vs_raw"]["text"])
    result.notes.append("2-core host shared with other agents' test runs: absolute times are inflated, the ratio "
                        "to the raw ceiling measured in the same run is the figure; load average (1, 5, 15 min) "
                        + result.figures["load average (1, 5, 15 min)"])
    print(f"load average (1, 5, 15 min): {result.figures['load average (1, 5, 15 min)']}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.grpo", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 prompts × 4 on 200 files at 8 in flight")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the JSON and PNG go")
    args = parser.parse_args()
    path = run(args.quick, args.results).write(args.results)
    print(f"results in {path}")


if __name__ == "__main__":
    main()
