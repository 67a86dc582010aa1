"""``python -m benchmarks report``: collect the latest results into ``benchmarks/REPORT.md``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import _host_state
from ._common import RESULTS

REPORT = Path(__file__).resolve().parent / "REPORT.md"
ORDER = ["bash_roundtrip", "tool_call", "lifecycle", "env_step", "vector_throughput", "vector_cluster", "code_runner",
         "scale", "soak"]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def _section(data: dict[str, Any]) -> list[str]:
    lines = [f"## {data['title']}", "", f"`{data['name']}` — run {data['when']}", ""]
    stats = data.get("stats") or []
    if stats:
        lines += ["| measurement | n | median ms | p95 ms | p99 ms | stdev ms |", "|---|---:|---:|---:|---:|---:|"]
        for s in stats:
            lines.append(f"| {s['label']} | {s['n']} | {_fmt(s['median_ms'])} | {_fmt(s['p95_ms'])} | "
                         f"{_fmt(s['p99_ms'])} | {_fmt(s['stdev_ms'])} |")
        lines.append("")
    figures = {k: v for k, v in (data.get("figures") or {}).items() if not isinstance(v, (list, dict))}
    if figures:
        lines += ["| figure | value |", "|---|---:|"] + [f"| {k} | {_fmt(v)} |" for k, v in figures.items()] + [""]
    for value in (data.get("figures") or {}).values():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            headers = list(value[0])
            lines += ["| " + " | ".join(headers) + " |", "|" + "---:|" * len(headers)]
            lines += ["| " + " | ".join(_fmt(row[h]) for h in headers) + " |" for row in value] + [""]
    for target in (data.get("targets") or {}).values():
        mark = "✅" if target["met"] else "❌"
        lines.append(f"- {mark} {target['text']}")
    if data.get("targets"):
        lines.append("")
    png = RESULTS / f"{data['name']}.png"
    if png.exists():
        lines += [f"![{data['name']}](results/{png.name})", ""]
    for note in data.get("notes") or []:
        lines.append(f"> {note}")
    return lines


COMPAT_HEADING = "## Tasks written by others"
FULL_RUNS = 2  # the latest full runs (``make bench``) whose targets the report sets side by side


def _full_runs() -> list[str]:
    """The targets of the latest full runs, a row each, the runs side by side."""
    runs = [json.loads(p.read_text()) for p in sorted((RESULTS / "runs").glob("*.json"))][-FULL_RUNS:]
    if not runs:
        return []
    lines = [f"## The last {len(runs)} full runs", "",
             "Each `make bench` (every benchmark, one after the other) is kept in `results/runs/`.", ""]
    for i, r in enumerate(runs, 1):
        seconds = sum(b["seconds"] for b in r["benchmarks"].values())
        load = ", ".join(f"{x:.1f}" for x in r["load_start"]) + " → " + ", ".join(f"{x:.1f}" for x in r["load_end"])
        lines.append(f"- run {i}: {r['started']} to {r['ended']} ({seconds / 60:.0f} min), commit "
                     f"`{r['commit']}`, load average (1, 5, 15 min) {load}")
        # what the kernel kept from earlier work (benchmarks/_host_state.py), at the start and later
        for name in (next(iter(r["benchmarks"]), None), "fork"):
            if (host := r["benchmarks"].get(name or "", {}).get("host")):
                lines.append(f"  - before {name}: " + _host_state.describe(host))
    lines += ["", "| benchmark | target | " + " | ".join(f"run {i}" for i in range(1, len(runs) + 1)) + " |",
              "|---|---|" + "---:|" * len(runs)]
    rows: dict[tuple[str, str], list[str]] = {}
    for i, r in enumerate(runs):
        for name, bench in r["benchmarks"].items():
            for t in bench["targets"]:
                op = "≤" if "<=" in t["text"] else "≥"
                cells = rows.setdefault((name, f"{t['name']} {op} {t['limit']} {t['unit']}"), [""] * len(runs))
                cells[i] = f"{t['value']} {'✅' if t['met'] else '❌'}"
    lines += [f"| {name} | {target} | " + " | ".join(cells) + " |" for (name, target), cells in rows.items()]
    return lines + [""]


def run() -> None:
    loaded = {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}
    # A benchmark's result is an object with its machine; other files (the task corpus's rows,
    # which `python -m benchmarks.task_compat --report` renders) keep their own section below.
    results = {name: data for name, data in loaded.items() if isinstance(data, dict) and "when" in data}
    kept = REPORT.read_text().split(COMPAT_HEADING, 1) if REPORT.exists() else []
    if not results:
        raise SystemExit("no results in benchmarks/results/: run `make bench` first")
    newest = max(results.values(), key=lambda d: d["when"])
    m = newest["machine"]
    lines = ["# IdeGym benchmark report", "",
             "Every figure is measured next to its baseline in the same run, on the same machine. "
             "Regenerate with `make bench` (all) or `python -m benchmarks <name>` then "
             "`python -m benchmarks report`.", "",
             f"Machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, Linux {m['kernel']}, "
             f"Python {m['python']}.", ""]
    targets = [(d["name"], t) for d in results.values() for t in (d.get("targets") or {}).values()]
    if targets:
        lines += ["## Targets", "", "| benchmark | target | value | met |", "|---|---|---:|:---:|"]
        for name, t in targets:
            op = "≤" if "<=" in t["text"] else "≥"
            lines.append(f"| {name} | {t['name']} {op} {t['limit']} {t['unit']} | {t['value']} {t['unit']} | "
                         f"{'✅' if t['met'] else '❌'} |")
        lines.append("")
    lines += _full_runs()
    for name in ORDER + sorted(set(results) - set(ORDER)):
        if name in results:
            lines += _section(results[name]) + [""]
    if len(kept) == 2:
        lines += [COMPAT_HEADING + kept[1].rstrip("\n"), ""]
    REPORT.write_text("\n".join(lines))
    print(f"wrote {REPORT}")
