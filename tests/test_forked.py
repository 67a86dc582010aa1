"""The tests' control planes and sandbox servers are forked from a template process that imported
them once (``tests/forked.py``): one forked must be what one started afresh is."""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.cp_helpers import ControlPlaneProcess
from tests.forked import ForkedProcess
from tests.helpers import SandboxProcess

# Of /proc/PID/status: what a process was given (not SigQ and SigPnd: signals queued now).
FRESH = {"TEST_STARTED_AFRESH": "1"}  # a variable not IdeGym's: such an environment is started afresh
STATUS = {"SigBlk", "SigIgn", "SigCgt", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"}


def _shape(pid: int, root: Path) -> tuple[Counter[str], dict[str, str], str, str]:
    """What process ``pid`` holds: its descriptors (the paths below ``root`` relative to it, and
    which of them its children inherit), its signal dispositions and capabilities, its directory
    and its limits."""
    fds: Counter[str] = Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        flags = int(Path(f"/proc/{pid}/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8)
        name = target.split(":")[0] if target.startswith(("socket:", "pipe:")) else target.replace(str(root), "…")
        fds[f"{name}{' (close-on-exec)' if flags & os.O_CLOEXEC else ''}"] += 1
    status = {key: value.strip() for key, _, value in (line.partition(":") for line in
                                                        Path(f"/proc/{pid}/status").read_text().splitlines())
              if key in STATUS}
    return fds, status, os.readlink(f"/proc/{pid}/cwd"), Path(f"/proc/{pid}/limits").read_text()


def test_a_forked_control_plane_is_what_a_fresh_one_is(tmp_path: Path) -> None:
    """Forked (0.09 s of CPU to ready where a fresh start took 0.77), a control plane holds the
    descriptors, signal dispositions, capabilities, directory and limits a fresh one holds, and
    ends with the same status.

    Can fail: forked from the template that serves the in-process backend's sandboxes, whose
    warm-up took CAP_SYS_ADMIN and CAP_SYS_PTRACE out of its bounding set as a sandbox server does,
    a control plane could not have given them to what it runs."""
    (tmp_path / "forked").mkdir()
    (tmp_path / "fresh").mkdir()
    forked = ControlPlaneProcess(tmp_path / "forked" / "state", ["--warm-pool", "0", "--ephemeral"])
    fresh = ControlPlaneProcess(tmp_path / "fresh" / "state", ["--warm-pool", "0", "--ephemeral"],
                                env={**os.environ, **FRESH})
    try:
        assert isinstance(forked.proc, ForkedProcess) and isinstance(fresh.proc, subprocess.Popen)
        for cp in (forked, fresh):
            assert cp.http.get("/health").status_code == 200
        assert _shape(forked.proc.pid, tmp_path / "forked") == _shape(fresh.proc.pid, tmp_path / "fresh")
    finally:
        forked.stop()
        fresh.stop()
    assert forked.proc.returncode == fresh.proc.returncode == 0


def test_a_forked_sandbox_server_is_what_a_fresh_one_is(project: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Forked, a sandbox server holds what a fresh one holds, and has this process's environment
    as it is when the server starts (its tools see it)."""
    monkeypatch.setenv("TEST_FORKED_VARIABLE", "seen")
    (tmp_path / "forked").mkdir()
    (tmp_path / "fresh").mkdir()
    forked = SandboxProcess(project, "unix", tmp_path / "forked")
    fresh = SandboxProcess(project, "unix", tmp_path / "fresh", env={**os.environ, **FRESH})
    try:
        assert isinstance(forked.proc, ForkedProcess) and isinstance(fresh.proc, subprocess.Popen)
        for server in (forked, fresh):
            assert server.bash("echo $TEST_FORKED_VARIABLE")["stdout"].strip() == "seen"
        assert _shape(forked.pid, tmp_path / "forked") == _shape(fresh.pid, tmp_path / "fresh")
    finally:
        forked.stop()
        fresh.stop()
    assert forked.proc.returncode == fresh.proc.returncode
