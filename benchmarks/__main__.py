"""``python -m benchmarks [name ...]``: run the named benchmarks (all by default)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import deque
from datetime import UTC, datetime
from pathlib import Path

from . import _host_state

BENCHMARKS = ["cgroup_moves", "bash_roundtrip", "tool_call", "sandbox_http", "forward_http", "lifecycle", "stop",
              "env_step", "vector_throughput", "vector_cluster", "code_runner", "scale", "soak", "images",
              "build_cache", "task_sources", "integrations", "neighbours", "fork", "agent_gateway", "remote",
              "k8s_delete", "grpo"]


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Run IdeGym's benchmarks. Each prints a table next to its baseline and writes "
                    "benchmarks/results/<name>.json. Set BENCH_N to change repetitions.",
    )
    parser.add_argument("names", nargs="*",
                        help=f"benchmarks to run (default all): {', '.join(BENCHMARKS)}; "
                             "'report' rewrites benchmarks/REPORT.md from the latest results")
    args = parser.parse_args()
    if args.names == ["report"]:
        from .report import run as report

        report()
        return
    # A stop by signal unwinds like Ctrl-C: each benchmark's servers (control planes started in a
    # session of their own, so they outlive a killed parent) are stopped by its cleanup.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
    names = args.names or BENCHMARKS
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    # A full run (every benchmark) is also kept as one record, so that the report can set the
    # targets of two full runs side by side.
    began, commit, load_start = _now(), _commit(), os.getloadavg()
    done: dict[str, dict] = {}
    for i, name in enumerate(names, 1):
        print(f"\n=== [{i}/{len(names)}] {name} ===", flush=True)
        if i > 1:
            _settle()
        host = _host_state.snapshot()
        print("host: " + _host_state.describe(host), flush=True)
        started = time.monotonic()
        module = importlib.import_module(f"benchmarks.{name}")
        result = module.run()
        path = result.write()
        seconds = time.monotonic() - started
        done[name] = {"seconds": round(seconds, 1), "host": host, "targets": list(result.targets.values())}
        print(f"--- {name}: {seconds:.1f}s, results in {path}", flush=True)
    if not args.names:
        from ._common import RESULTS

        run = {"started": began, "ended": _now(), "commit": commit, "load_start": load_start,
               "load_end": os.getloadavg(), "host_end": _host_state.snapshot(), "benchmarks": done}
        runs = RESULTS / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        record = runs / f"{began.replace(':', '')}.json"
        record.write_text(json.dumps(run, indent=1) + "\n")
        print(f"full run recorded in {record}", flush=True)
    from .report import run as report

    report()
    sys.exit(0)


def _runnable() -> int:
    """Tasks runnable on the host now, this one included (``/proc/loadavg``'s fourth field)."""
    with open("/proc/loadavg") as fh:
        return int(fh.read().split()[3].split("/")[0])


def _settle(window: float = 2.0, busy: float = 0.1, at_most: float = 120.0) -> None:
    """Wait until another task was runnable in at most ``busy`` of the last ``window`` seconds'
    samples (at most ``at_most`` seconds): what a benchmark leaves running or winding down (the
    neighbours' fork bomb, sandboxes being deleted) must not land on the next one's figures."""
    step = 0.05
    samples: deque[bool] = deque(maxlen=round(window / step))
    started = time.monotonic()
    while time.monotonic() - started < at_most:
        samples.append(_runnable() > 1)
        if len(samples) == samples.maxlen and sum(samples) <= busy * len(samples):
            waited = time.monotonic() - started - window
            if waited > 1:
                print(f"(waited {waited:.0f} s for the host to settle)", flush=True)
            return
        time.sleep(step)
    print(f"(the host did not settle within {at_most:.0f} s: going on; load average "
          f"{os.getloadavg()[0]:.1f})", flush=True)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _commit() -> str | None:
    """The checked-out commit (with ``+`` when the work tree differs from it), if this is a clone."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+" if head and dirty else head or None


if __name__ == "__main__":
    main()
