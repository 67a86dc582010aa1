"""``python -m benchmarks [name ...]``: run the named benchmarks (all by default)."""

from __future__ import annotations

import argparse
import importlib
import sys
import time

BENCHMARKS = ["bash_roundtrip", "tool_call", "lifecycle", "env_step", "vector_throughput", "vector_cluster",
              "code_runner", "scale", "soak", "images", "task_sources", "integrations",
              "neighbours", "fork", "agent_gateway", "remote", "grpo"]


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
    names = args.names or BENCHMARKS
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    for i, name in enumerate(names, 1):
        print(f"\n=== [{i}/{len(names)}] {name} ===", flush=True)
        started = time.monotonic()
        module = importlib.import_module(f"benchmarks.{name}")
        result = module.run()
        path = result.write()
        print(f"--- {name}: {time.monotonic() - started:.1f}s, results in {path}", flush=True)
    from .report import run as report

    report()
    sys.exit(0)


if __name__ == "__main__":
    main()
