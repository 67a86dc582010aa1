"""The code runner: a hello world in every available language, run directly and through
``POST /execute`` — on a sandbox server, and on the control plane (a fresh sandbox per run).

Reports latency (median, p95) and runs per second with two requests in flight.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from ._common import Result, Stats, measure, table
from ._servers import control_plane, sandbox_server

N = int(os.environ.get("BENCH_RUNNER_N", "20"))
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


def _throughput(fn, n: int) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: fn(), range(n)))
    return n / (time.perf_counter() - started)


def run() -> Result:
    result = Result("code_runner", "POST /execute: hello world per language, direct vs sandbox server vs control plane")
    langs = [n for n in PROGRAMS if shutil.which((PROGRAMS[n][2] or PROGRAMS[n][3])[0])]
    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        (tmp / "p").mkdir()
        (tmp / "s").mkdir()
        with sandbox_server(tmp / "p", tmp / "s") as sock, control_plane(tmp / "cp", ["--warm-pool", "2"]) as url:
            server = httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://sandbox", timeout=120)
            cp = httpx.Client(base_url=url, timeout=300)
            for name in langs:
                n = N if PROGRAMS[name][2] is None else max(N // 2, 6)
                ways = {
                    "direct": lambda nm=name: _direct(nm),
                    "sandbox server /execute": lambda nm=name: _via(server, nm),
                    "control plane /execute (fresh sandbox)": lambda nm=name: _via(cp, nm),
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
    print(table(["language", "way", "n", "median ms", "p95 ms", "runs/s (2 in flight)"], rows))
    return result


if __name__ == "__main__":
    run().write()
