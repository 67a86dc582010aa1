"""Shared benchmark plumbing: timing, statistics, tables, JSON results, machine description."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Stats:
    label: str
    n: int
    median_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    stdev_ms: float
    min_ms: float
    max_ms: float

    @classmethod
    def of(cls, label: str, seconds: Sequence[float]) -> Stats:
        ms = sorted(s * 1000 for s in seconds)
        return cls(
            label=label,
            n=len(ms),
            median_ms=statistics.median(ms),
            p95_ms=percentile(ms, 95),
            p99_ms=percentile(ms, 99),
            mean_ms=statistics.fmean(ms),
            stdev_ms=statistics.stdev(ms) if len(ms) > 1 else 0.0,
            min_ms=ms[0],
            max_ms=ms[-1],
        )


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * pct / 100
    lo, hi = int(k), min(int(k) + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


class Progress:
    """A counting line on stderr: ``label  123/500``."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.done = label, total, 0
        self._last = 0.0

    def step(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last > 0.2 or self.done >= self.total:
            self._last = now
            sys.stderr.write(f"\r  {self.label:<40} {self.done:>6}/{self.total}")
            if self.done >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def measure(label: str, fn: Callable[[], Any], n: int, warmup: int = 20) -> list[float]:
    for _ in range(warmup):
        fn()
    progress = Progress(label, n)
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
        progress.step()
    return samples


def interleaved(fns: dict[str, Callable[[], Any]], n: int, warmup: int = 20, label: str = "",
                block: int = 1) -> dict[str, list[float]]:
    """Run each function ``n`` times, alternating between them so drift hits all equally; ``block``
    calls of one in a row before the next (what one leaves running after its answer then touches
    one call of the next in ``block``, not every one)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    progress = Progress(label or " vs ".join(fns), n * len(fns))
    for done in range(0, n, block):
        for name, fn in fns.items():
            for _ in range(min(block, n - done)):
                t = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t)
                progress.step()
    return samples


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = 0
    try:
        mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
    }


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
        return str(v)

    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    sep = "  ".join("-" * w for w in widths)
    body = "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                     for r in cells)
    return f"{line}\n{sep}\n{body}"


def stats_table(stats: Sequence[Stats], baseline: str | None = None) -> str:
    base = next((s for s in stats if s.label == baseline), None)
    rows = []
    for s in stats:
        ratio = f"{s.median_ms / base.median_ms:.2f}x" if base else ""
        rows.append([s.label, s.n, s.median_ms, s.p95_ms, s.p99_ms, s.stdev_ms, ratio])
    return table(["measurement", "n", "median ms", "p95 ms", "p99 ms", "stdev ms", "vs baseline"], rows)


@dataclass
class Result:
    name: str
    title: str
    stats: list[Stats] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    targets: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def write(self, directory: Path = RESULTS) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.name}.json"
        data = {
            "name": self.name,
            "title": self.title,
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "stats": [asdict(s) for s in self.stats],
            "figures": self.figures,
            "targets": self.targets,
            "notes": self.notes,
        }
        path.write_text(json.dumps(data, indent=2) + "\n")
        return path


def check_target(name: str, value: float, limit: float, unit: str = "ms", lower_is_better: bool = True) -> dict:
    ok = value <= limit if lower_is_better else value >= limit
    op = "<=" if lower_is_better else ">="
    return {"name": name, "value": round(value, 4), "limit": limit, "unit": unit, "met": ok,
            "text": f"{name}: {value:.3f} {unit} (target {op} {limit} {unit}) {'MET' if ok else 'MISSED'}"}
