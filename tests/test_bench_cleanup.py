"""``python -m benchmarks`` stopped by a signal stops the control planes it started: they run in a
session of their own (so a Ctrl-C at the terminal reaches only the benchmark, which stops them), and
a SIGTERM once ended the benchmark without its cleanup, leaving them and their sandboxes running."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

if not (os.geteuid() == 0 and shutil.which("bwrap")):  # pragma: no cover
    pytest.skip("the benchmark runs real sandboxes (needs root and bubblewrap)", allow_module_level=True)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]
    except OSError:
        return []


def _is_control_plane(pid: int) -> bool:
    try:
        return b"control_plane" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_benchmark_stopped_by_a_signal_stops_its_control_plane(signum: int) -> None:
    planes: list[int] = []
    bench = subprocess.Popen([sys.executable, "-m", "benchmarks", "stop"], cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not planes and time.monotonic() < deadline and bench.poll() is None:
            planes = [c for c in _children(bench.pid) if _is_control_plane(c)]
            time.sleep(0.05)
        assert planes, "the benchmark started no control plane"
        # Ready and serving: it has started a sandbox (one still starting dies with the benchmark
        # when it writes to the ready pipe nobody reads).
        while not any(_children(p) for p in planes) and time.monotonic() < deadline and bench.poll() is None:
            time.sleep(0.05)
        assert any(_children(p) for p in planes), "the control plane started no sandbox"
        bench.send_signal(signum)
        status = bench.wait(timeout=120)
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{p}").exists() for p in planes) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [p for p in planes if Path(f"/proc/{p}").exists()]
        assert not left, f"control planes left running after the benchmark ended: {left}"
        assert status == 128 + signum  # it ended by the signal, through its cleanup
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
        for pid in planes:  # what a failing run left (each stops its sandboxes on SIGTERM)
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGTERM)
