"""The tool user's spawner (``sandbox_server/spawner.py``): tools of the tool user are started by
a process that already is that user, which the user can stop or kill at no cost but speed, and
cannot read or trace; reward checks never go through it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tests.helpers import SandboxProcess

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to the tool user")

PTRACE = ("python3 -c \"import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True); "
          "r = libc.ptrace(16, int(sys.argv[1]), 0, 0); print(r, os.strerror(ctypes.get_errno()))\" ")


@pytest.fixture
def server(tmp_path: Path):
    # The tool user must reach its project: pytest's tmp_path sits below a directory only root enters
    # (where a spawner cannot chdir, so every call would go the long way).
    with tempfile.TemporaryDirectory(prefix="idegym-spawner-") as shared:
        project = Path(shared) / "project"
        project.mkdir()
        os.chmod(shared, 0o755)
        project.chmod(0o777)
        proc = SandboxProcess(project, "unix", tmp_path, extra=["--tool-user", "nobody", "--tool-spawner"])
        yield proc
        proc.stop()


def spawner_of(server: SandboxProcess) -> int:
    return int(server.bash("echo $PPID")["stdout"])


def uid_of(pid: int) -> int:
    return int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("Uid:")).split()[1])


def test_tools_of_the_tool_user_come_from_one_spawner_they_cannot_read_or_trace(server: SandboxProcess) -> None:
    spawner = spawner_of(server)
    assert spawner != server.pid and uid_of(spawner) == 65534
    assert spawner_of(server) == spawner  # one for every call, not one per call
    status = Path(f"/proc/{spawner}/status").read_text()
    assert "CapEff:\t0000000000000000" in status and "CapPrm:\t0000000000000000" in status
    assert server.bash("id -u")["stdout"] == "65534\n"
    probe = server.bash(f"cat /proc/{spawner}/environ >/dev/null; ls /proc/{spawner}/fd >/dev/null; "
                        f"{PTRACE} {spawner}")
    assert probe["stderr"].count("Permission denied") == 2, probe
    assert probe["stdout"].startswith("-1 Operation not permitted"), probe


def own_status_or_interrupted(result: dict, code: int, stdout: str) -> bool:
    """The tool's own ending, or — when its spawner went before answering the start — exit 126
    saying so; never the command run a second time the long way."""
    if result["timed_out"] or result["stdout"].count(stdout) > 1:
        return False
    return (result["exit_code"], result["stdout"]) == (code, stdout) or (
        result["exit_code"] == 126 and "interrupted as it started" in result["stderr"])


def test_a_tool_whose_spawner_is_killed_or_stopped_still_ends_with_its_own_status(server: SandboxProcess) -> None:
    first = spawner_of(server)
    killed = server.bash("kill -9 $PPID; sleep 0.2; echo after; exit 3", timeout=10)
    assert own_status_or_interrupted(killed, 3, "after\n"), killed
    assert "Operation not permitted" not in killed["stderr"], killed  # the server was never its parent
    second = spawner_of(server)
    assert second != first and uid_of(second) == 65534
    # Stopped, it never reaps the tool: the server notices the exit, ends the spawner, reaps the tool.
    stopped = server.bash("kill -STOP $PPID; echo stopped; exit 4", timeout=10)
    assert own_status_or_interrupted(stopped, 4, "stopped\n"), stopped
    assert stopped["duration_seconds"] < 5, stopped
    third = spawner_of(server)
    assert third not in (first, second)


def test_a_spawner_stopped_between_calls_costs_one_slow_call(server: SandboxProcess) -> None:
    first = spawner_of(server)
    os.kill(first, 19)  # SIGSTOP, as the tool user could
    late = server.bash("echo $PPID", timeout=20)
    assert late["exit_code"] == 0 and int(late["stdout"]) == server.pid  # started the long way
    assert not Path(f"/proc/{first}").exists() or "zombie" in Path(f"/proc/{first}/status").read_text()
    assert spawner_of(server) not in (first, server.pid)


def test_reward_checks_do_not_go_through_the_spawner(server: SandboxProcess) -> None:
    spawner_of(server)
    script = f"test $PPID = {server.pid} && test $(id -u) = 65534"  # started by the server itself
    check = server.post("/api/rewards/setup", {"setup_check_script": script})
    assert check.status_code == 200 and check.json()["status"] == "success", check.text


def test_the_next_episode_keeps_a_pristine_spawner_and_never_a_tampered_one(server: SandboxProcess) -> None:
    """What the tool user can change on its spawner (resource limits, priority) its next tools
    would inherit: after a terminate (as after a reset) such a spawner is replaced.

    Can fail: without the check the tampered spawner is kept and the next tool has 64 files."""
    before = spawner_of(server)
    server.bash("sleep 30 >/dev/null 2>&1 &")
    assert server.post("/api/processes/terminate", {}).json()["killed_processes"] >= 1
    assert spawner_of(server) == before  # untouched: kept (it was forked while the server was small)
    normal = server.bash("ulimit -n")["stdout"]
    tamper = server.bash("prlimit --pid $PPID --nofile=64:64 && renice -n 5 -p $PPID >/dev/null && echo done")
    assert tamper["stdout"] == "done\n", tamper
    assert server.bash("ulimit -n")["stdout"] == "64\n"  # within the episode: its own business
    assert server.post("/api/processes/terminate", {}).status_code == 200
    assert not Path(f"/proc/{before}").exists()
    after = spawner_of(server)
    assert after != before and server.bash("ulimit -n")["stdout"] == normal != "64\n"
