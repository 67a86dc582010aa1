"""The tool user's spawner (``sandbox_server/native/spawner.c``, the server's side in
``sandbox_server/spawner.py``): tools of the tool user are started by a small process that already
is that user, which the user can stop or kill at no cost but speed, and cannot read or trace;
reward checks never go through it. Its protocol refuses what is malformed and carries large
requests, or leaves them to the long way."""

from __future__ import annotations

import array
import asyncio
import errno
import fcntl
import os
import pwd
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_server import procfs
from sandbox_server.spawner import COUNTS, EXITED, MAX_REQUEST, MESSAGE, SPAWNER, Spawner, SpawnRefused, _request
from tests.helpers import SandboxProcess, process_alive, wait_until

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to the tool user"),
    pytest.mark.skipif(not os.access(SPAWNER, os.X_OK), reason="the spawner is not built (make native)"),
]

PTRACE = ("python3 -c \"import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True); "
          "r = libc.ptrace(16, int(sys.argv[1]), 0, 0); print(r, os.strerror(ctypes.get_errno()))\" ")
NOBODY = 65534


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SandboxProcess]:
    # The tool user must reach its project: pytest's tmp_path sits below a directory only root enters
    # (where a spawner cannot chdir, so every call would go the long way).
    with tempfile.TemporaryDirectory(prefix="idegym-spawner-") as shared:
        project = Path(shared) / "project"
        project.mkdir()
        os.chmod(shared, 0o755)
        project.chmod(0o777)
        proc = SandboxProcess(project, "unix", tmp_path, extra=["--tool-user", "nobody"])  # the spawner: by default
        yield proc
        proc.stop()


def spawner_of(server: SandboxProcess) -> int:
    return int(server.bash("echo $PPID")["stdout"])


def status_field(pid: int, name: str) -> str:
    return next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith(f"{name}:")).split(":", 1)[1].strip()


def uid_of(pid: int) -> int:
    return int(status_field(pid, "Uid").split()[0])


def descriptors(pid: int) -> dict[int, str]:
    return {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}


def test_tools_of_the_tool_user_come_from_one_spawner_they_cannot_read_or_trace(server: SandboxProcess) -> None:
    spawner = spawner_of(server)
    assert spawner != server.pid and uid_of(spawner) == NOBODY
    assert spawner_of(server) == spawner  # one for every call, not one per call
    assert Path(f"/proc/{spawner}/cmdline").read_bytes().split(b"\0")[0] == SPAWNER.encode()  # the small program
    status = Path(f"/proc/{spawner}/status").read_text()
    assert "CapEff:\t0000000000000000" in status and "CapPrm:\t0000000000000000" in status
    assert status_field(spawner, "Uid").split() == status_field(spawner, "Gid").split() == [str(NOBODY)] * 4
    assert status_field(spawner, "Groups") == ""
    assert Path(f"/proc/{spawner}/oom_score_adj").read_text() == "500\n"  # the tools' own, from the start
    # Nothing of the server: no environment, no descriptor but /dev/null, stderr, its socket, its signalfd.
    assert Path(f"/proc/{spawner}/environ").read_bytes() == b""
    fds = descriptors(spawner)
    assert sorted(fds) == [0, 1, 2, 3, 4] and fds[0] == fds[1] == "/dev/null", fds
    assert fds[3].startswith("socket:") and fds[4] == "anon_inode:[signalfd]", fds
    assert server.bash("id -u")["stdout"] == "65534\n"
    probe = server.bash(f"cat /proc/{spawner}/environ >/dev/null; ls /proc/{spawner}/fd >/dev/null; "
                        f"{PTRACE} {spawner}")
    assert probe["stderr"].count("Permission denied") == 2, probe
    assert probe["stdout"].startswith("-1 Operation not permitted"), probe


def test_the_spawner_starts_with_the_server_not_at_the_first_call(server: SandboxProcess) -> None:
    """Can fail: it did: the spawner was started by the first tool call, which paid for it (a
    fork's child's first call, a claimed warm sandbox's)."""

    def spawners() -> list[int]:
        return [pid for pid in procfs.children(server.pid)
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == SPAWNER.encode()]

    assert wait_until(lambda: len(spawners()) == 1, 10), "no spawner before the first call"
    (started,) = spawners()
    assert uid_of(started) == NOBODY
    assert spawner_of(server) == started  # the first call's tool came from it


def test_the_spawner_dies_with_the_server(server: SandboxProcess) -> None:
    """Can fail: it did: the Python spawner set its parent-death signal before it changed its uid,
    which clears it; SIGKILLed, the server left its spawner running as the tool user."""
    spawner = spawner_of(server)
    os.kill(server.pid, signal.SIGKILL)
    assert wait_until(lambda: not process_alive(spawner), 5), Path(f"/proc/{spawner}/status").read_text()


@pytest.mark.skipif(shutil.which("strace") is None, reason="counts system calls with strace")
def test_a_quick_tool_s_pipes_are_read_at_their_end_never_watched(server: SandboxProcess, tmp_path: Path) -> None:
    """A tool that ends within its answer's hold is answered and told ended at once, its pipes at
    their end: the server reads them there and then, with no watcher to add or remove (an
    ``epoll_ctl`` each, and a wake-up of the loop for their end). Counted by strace over 20 calls
    in a row; a call whose tool a loaded host held up past the hold watches them as before (4
    ``epoll_ctl``), so a round passes when a quarter of its calls watched nothing, and up to three
    rounds are made (a fresh-clone run on three workers had 11 of 20 held up in one round).

    Can fail: on main every call added and removed a watcher for both of its pipes (4 a call)."""
    assert server.bash("echo warm")["stdout"] == "warm\n"
    counts = []
    for round_ in range(3):
        trace = tmp_path / f"epoll-{round_}.trace"
        strace = subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=epoll_ctl", "-o", str(trace), "-p",
                                   str(server.pid)], stderr=subprocess.DEVNULL)
        try:
            assert wait_until(lambda trace=trace: trace.exists() and all(
                "TracerPid:\t0\n" not in (task / "status").read_text()
                for task in Path(f"/proc/{server.pid}/task").iterdir()), 10), "strace did not attach"
            results = [server.bash("echo out; echo err >&2") for _ in range(20)]
        finally:
            strace.send_signal(signal.SIGINT)
            strace.wait(10)
        assert all((r["stdout"], r["stderr"], r["exit_code"]) == ("out\n", "err\n", 0) for r in results), results
        counts.append(sum("epoll_ctl(" in line for line in trace.read_text().splitlines()))
        if counts[-1] <= 4 * 15:
            return
    pytest.fail(f"epoll_ctl calls in each round of 20 bash calls: {counts} (4 a call that watched its pipes)")


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
    assert second != first and uid_of(second) == NOBODY
    # Stopped, it never reaps the tool: the server notices the exit, ends the spawner, reaps the tool.
    stopped = server.bash("kill -STOP $PPID; echo stopped; exit 4", timeout=10)
    assert own_status_or_interrupted(stopped, 4, "stopped\n"), stopped
    assert stopped["duration_seconds"] < 5, stopped
    third = spawner_of(server)
    assert third not in (first, second)


def test_a_spawner_s_tool_ends_with_its_own_status_however_it_ends(server: SandboxProcess) -> None:
    """The wait status the spawner tells (on its socket) makes the call's exit code; a tool that
    stops itself is not ended, and its timeout ends its whole group; a spawner stopped while its
    tool runs (past the time after which a tool is watched by its pidfd) costs the call a moment."""
    spawner = spawner_of(server)
    assert [server.bash(c)["exit_code"] for c in ("exit 7", "kill -TERM $$", "kill -KILL $$")] == [7, 143, 137]
    started = time.monotonic()
    stopped = server.bash("sleep 60 & echo $!; kill -STOP $$; echo never", timeout=0.5,
                          graceful_termination_timeout=0.5)
    assert stopped["timed_out"] and stopped["exit_code"] == 124 and time.monotonic() - started < 3, stopped
    assert wait_until(lambda: not process_alive(int(stopped["stdout"])), 3)  # its group too
    assert spawner_of(server) == spawner  # a tool's stop is none of the spawner's business
    late = server.bash("sleep 0.5; kill -STOP $PPID; echo stopped; exit 4", timeout=10)
    assert own_status_or_interrupted(late, 4, "stopped\n") and late["duration_seconds"] < 5, late
    assert spawner_of(server) != spawner


ADOPTION = """
import asyncio, ctypes, os, signal, subprocess, sys
from sandbox_server.job import Job
from sandbox_server.output import BoundedOutput
from sandbox_server.pipe_watch import PipeWatch

ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER, as the server is
out_r, out_w = os.pipe()
pid_r, pid_w = os.pipe()
parent = os.fork()
if parent == 0:  # the spawner: starts the tool, says its pid, waits to be killed
    tool = subprocess.Popen(["sh", "-c", "sleep 0.5; echo after; exit 3"], stdout=out_w, start_new_session=True)
    os.write(pid_w, str(tool.pid).encode())
    signal.pause()
    os._exit(0)
os.close(out_w)
tool = int(os.read(pid_r, 32))

async def main():
    loop = asyncio.get_running_loop()
    exit_status = loop.create_future()
    out = BoundedOutput(None)
    job = Job(loop, PipeWatch(loop), tool, {out_r: out}, exit_status)
    exit_status.set_result(None)  # told its parent is gone: it is dying, not re-parented yet
    await asyncio.sleep(0.05)
    os.kill(parent, signal.SIGKILL)  # now it is gone: the tool is re-parented to us
    os.waitpid(parent, 0)
    await job.done
    print(job.exit_code, repr(out.text()))

asyncio.run(main())
"""


def test_a_tool_told_gone_before_it_is_re_parented_ends_with_its_own_status() -> None:
    """A job may learn that its tool's spawner is gone before the kernel re-parents the tool to the
    server: the tool is not the server's child for a moment, longer under load. The call waits for
    the tool's own end, whenever it comes, and reports its own status.

    Can fail: it did, under CPU load (``test_the_server_survives_whatever_its_tools_do_to_memory``
    got an empty stdout: the OOM killer takes the spawner first): ``waitpid`` failed with ECHILD,
    which the job took for an exit with status 0, and the call answered at once with neither
    output nor the right exit code. Here the spawner's death is held back to show it every time.
    """
    done = subprocess.run([sys.executable, "-c", ADOPTION], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "3 'after\\n'\n", done.stdout


def test_a_spawner_stopped_between_calls_costs_one_slow_call(server: SandboxProcess) -> None:
    first = spawner_of(server)
    os.kill(first, signal.SIGSTOP)  # as the tool user could
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
    assert spawner_of(server) == before  # untouched: kept
    normal = server.bash("ulimit -n")["stdout"]
    tamper = server.bash("prlimit --pid $PPID --nofile=64:64 && renice -n 5 -p $PPID >/dev/null && echo done")
    assert tamper["stdout"] == "done\n", tamper
    assert server.bash("ulimit -n")["stdout"] == "64\n"  # within the episode: its own business
    assert server.post("/api/processes/terminate", {}).status_code == 200
    assert not Path(f"/proc/{before}").exists()
    after = spawner_of(server)
    assert after != before and server.bash("ulimit -n")["stdout"] == normal != "64\n"


def socket_limit() -> int:
    """The longest request a spawner's socket carries on this host (its send buffer, spawner.py)."""
    wmem_max = int(Path("/proc/sys/net/core/wmem_max").read_text())
    return min(MAX_REQUEST, 2 * min(MAX_REQUEST, wmem_max) - 32)


def test_a_large_environment_is_carried_whole_and_a_larger_one_goes_the_long_way(server: SandboxProcess) -> None:
    """A request holds the environment: as long as the socket carries it, the spawner starts the
    tool; longer, the tool starts the long way, with every byte of it all the same."""
    # An exec's arguments and environment may take a quarter of the stack limit: 16 MiB of it
    # gives the long way room for more than the spawner's 2 MiB (the limit is inherited).
    subprocess.run(["prlimit", f"--pid={server.pid}", f"--stack={64 << 20}"], check=True)
    value = 100_000  # bytes a variable (the kernel's limit for one is 128 KiB)
    script = "echo $PPID; for v in ${!BIG_*}; do x=${!v}; echo ${#v} ${#x}; done | sort | uniq -c"
    for total, via_spawner in ((min(1_500_000, socket_limit() - 100_000), True), (3_000_000, False)):
        count = total // value
        env = {f"BIG_{i:03}": chr(ord("a") + i % 26) * value for i in range(count)}
        result = server.bash(script, env=env)
        assert result["exit_code"] == 0, result["stderr"]
        ppid, *lines = result["stdout"].splitlines()
        assert [line.split() for line in lines] == [[str(count), "7", str(value)]], result["stdout"][:300]
        spawner = spawner_of(server)
        assert (int(ppid) == spawner) is via_spawner and (int(ppid) == server.pid) is not via_spawner, (total, ppid)


def test_a_tool_s_environment_is_its_user_s_and_the_call_s_with_the_server_s_mark(server: SandboxProcess) -> None:
    """The user's environment goes to the spawner encoded once, the call's mark after it: a call's
    own variables come through, and one naming the mark does not replace it nor stand beside it
    in what the tool was started with (the server finds a command's processes by their mark)."""
    script = ('echo "$PPID $IDEGYM_CALL $HOME ${GREETING:-none}"; '
              'tr "\\0" "\\n" < /proc/$$/environ | grep -c ^IDEGYM_CALL=')
    marks = set()
    for env in (None, {"GREETING": "hi"}, {"IDEGYM_CALL": "forged", "GREETING": "hi"}, None):
        result = server.bash(script, env=env)
        (ppid, mark, home, greeting), count = (line.split() for line in result["stdout"].splitlines())
        assert int(ppid) == spawner_of(server) and count == ["1"], result
        assert mark.startswith(f"{server.pid}.") and mark not in marks, mark
        assert home == pwd.getpwnam("nobody").pw_dir and greeting == ((env or {}).get("GREETING") or "none"), result
        marks.add(mark)


# -- the protocol, spoken to the program directly ---------------------------------------------------


class Replies:
    """What a spawner says on its socket: its answers, in order, and its tools' ends, by pid."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.answers: list[tuple[int, int, str]] = []
        self.exits: dict[int, int] = {}

    def _receive(self) -> None:
        data = self.sock.recv(4096)
        kind, pid, value = MESSAGE.unpack_from(data)
        if kind == EXITED:
            assert pid not in self.exits and not data[MESSAGE.size:], data  # each end told once, no text
            self.exits[pid] = value
        else:
            self.answers.append((pid, value, data[MESSAGE.size:].decode()))

    def answer(self) -> tuple[int, int, str]:
        while not self.answers:
            self._receive()
        return self.answers.pop(0)

    def exit_status(self, pid: int) -> int:
        while pid not in self.exits:
            self._receive()
        return self.exits.pop(pid)


@pytest.fixture
def native() -> Iterator[tuple[int, Replies]]:
    """The spawner as nobody (no cgroups), this process its server, its socket a blocking one, its
    stack limit room for an exec of 2 MiB of environment (a quarter of it)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    fd = fcntl.fcntl(theirs.fileno(), fcntl.F_DUPFD_CLOEXEC, 10)
    stack = resource.getrlimit(resource.RLIMIT_STACK)
    resource.setrlimit(resource.RLIMIT_STACK, (max(stack[0], min(64 << 20, stack[1])), stack[1]))
    try:
        pid = os.posix_spawn(SPAWNER, [SPAWNER, str(NOBODY), str(NOBODY), "-", "500"], {},
                             file_actions=[(os.POSIX_SPAWN_DUP2, fd, 3)])
    finally:
        resource.setrlimit(resource.RLIMIT_STACK, stack)
        os.close(fd)
        theirs.close()
    ours.settimeout(10)
    replies = Replies(ours)
    try:
        assert replies.answer() == (0, 0, "ready")
        yield pid, replies
    finally:
        ours.close()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


class Tool:
    """A tool's descriptors as the server hands them over: stdin, stdout and stderr (one pipe)."""

    def __init__(self) -> None:
        self.out_r, self.out_w = os.pipe2(os.O_CLOEXEC)
        self.null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def fds(self, count: int = 3) -> list[int]:
        return [self.null, self.out_w, self.out_w, self.null][:count]

    def handed_over(self) -> None:
        for fd in (self.out_w, self.null):
            os.close(fd)

    def ending(self, replies: Replies, pid: int) -> tuple[bytes, int]:
        """Its output, and the wait status its spawner told."""
        chunks = []
        while chunk := os.read(self.out_r, 1 << 16):
            chunks.append(chunk)
        os.close(self.out_r)
        return b"".join(chunks), replies.exit_status(pid)


def send(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else [])


def start(replies: Replies, argv: list[str], env: dict[str, str], cwd: str = "/tmp") -> Tool:
    tool = Tool()
    send(replies.sock, _request(argv, env, cwd), tool.fds())
    tool.handed_over()
    return tool


def run(replies: Replies, argv: list[str], env: dict[str, str]) -> tuple[bytes, int]:
    tool = start(replies, argv, env)
    pid = replies.answer()[0]
    assert pid > 0
    return tool.ending(replies, pid)


def test_a_tool_gets_a_session_default_signals_its_user_cwd_environment_and_three_descriptors(
        native: tuple[int, Replies]) -> None:
    _, replies = native
    path = {"PATH": "/nowhere::/usr/bin:/bin"}  # found on PATH, past what is not there
    tools = [start(replies, ["sh", "-c", "id -u; id -G; ps -o sid= -p $$; pwd; exit 7"], path, "/"),
             start(replies, ["env"], {"PATH": "/usr/bin:/bin", "ONLY": "this"}),
             start(replies, ["/bin/sh", "-c", "exit 3"], {}),
             start(replies, ["grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"], path),
             start(replies, ["ls", "/proc/self/fd"], path)]
    pids = [replies.answer() for _ in tools]  # in order, each with its pid
    assert all(pid > 0 and error == 0 for pid, error, _ in pids) and len({p for p, _, _ in pids}) == 5, pids
    out, status = tools[0].ending(replies, pids[0][0])
    assert [line.strip() for line in out.decode().splitlines()] == [str(NOBODY), str(NOBODY), str(pids[0][0]), "/"], \
        out  # its own session (ps pads the id to its width)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 7
    assert tools[1].ending(replies, pids[1][0]) == (b"PATH=/usr/bin:/bin\nONLY=this\n", 0)  # exactly its environment
    assert tools[2].ending(replies, pids[2][0]) == (b"", 3 << 8)
    assert tools[3].ending(replies, pids[3][0]) == (b"SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n", 0)
    assert tools[4].ending(replies, pids[4][0]) == (b"0\n1\n2\n3\n", 0)  # 3: ls's own, reading the directory


def test_the_spawner_tells_each_tool_s_end_as_a_wait_status_on_its_socket(
        native: tuple[int, Replies]) -> None:
    """The tool's wait status comes on the spawner's socket, after its answer, however it ended
    (no status pipe a call: each per-call descriptor cost the server a watcher on its loop).

    Can fail: it did: the spawner wanted a fourth descriptor, a status pipe, and refused the request."""
    spawner, replies = native
    ended = {"exit 9": 9 << 8, "kill -TERM $$": signal.SIGTERM, "kill -SEGV $$": signal.SIGSEGV,
             "ulimit -c 0; kill -ABRT $$": signal.SIGABRT}
    for script, status in ended.items():
        assert run(replies, ["/bin/sh", "-c", script], {}) == (b"", status), script
    # A stopped tool is not an ended one: nothing is told until it is killed.
    tool = start(replies, ["/bin/sh", "-c", "kill -STOP $$; exit 1"], {})
    pid = replies.answer()[0]
    assert wait_until(lambda: procfs.stat(pid) is not None and procfs.stat(pid).state == "T", 10)
    replies.sock.settimeout(0.3)
    with pytest.raises(TimeoutError):
        replies.exit_status(pid)
    replies.sock.settimeout(10)
    os.kill(pid, signal.SIGKILL)
    assert tool.ending(replies, pid) == (b"", signal.SIGKILL)


def test_a_tool_s_output_ends_only_once_its_end_is_told(native: tuple[int, Replies]) -> None:
    """The spawner holds a copy of a running tool's stdout and stderr until it tells how the
    tool ended: the server sees the pipes end with the message, in one wake-up, not one for the
    pipes and another for the status. Held still, the spawner keeps both back; a tool's own
    background child that holds the pipes keeps them open as before.

    Can fail: it did: the pipes ended with the tool, before the spawner had said anything."""
    spawner, replies = native
    go = Path(f"/tmp/idegym-spawner-test-{os.getpid()}-{time.monotonic_ns()}")  # where the tool user looks
    tool = start(replies, ["/bin/sh", "-c", f"until [ -e {go} ]; do sleep 0.01; done; echo out"], {})
    pid = replies.answer()[0]
    os.kill(spawner, signal.SIGSTOP)  # before the tool can end: it waits for ``go``
    try:
        go.touch()
        assert wait_until(lambda: procfs.stat(pid) is not None and procfs.stat(pid).state == "Z", 10)
        assert os.read(tool.out_r, 100) == b"out\n"
        assert select.select([tool.out_r], [], [], 0.3)[0] == []  # no end while nothing is told
    finally:
        os.kill(spawner, signal.SIGCONT)
        go.unlink(missing_ok=True)
    assert tool.ending(replies, pid) == (b"", 0)
    daemon = start(replies, ["/bin/sh", "-c", "sleep 30 & echo $!"], {})
    pid = replies.answer()[0]
    assert replies.exit_status(pid) == 0
    child = int(os.read(daemon.out_r, 100))
    assert select.select([daemon.out_r], [], [], 0.2)[0] == []  # its child holds it
    os.kill(child, signal.SIGKILL)
    assert os.read(daemon.out_r, 100) == b""
    os.close(daemon.out_r)


def test_a_quick_tool_s_answer_comes_with_its_end_and_a_slow_one_s_when_the_hold_is_over(
        native: tuple[int, Replies]) -> None:
    """A request may let its answer wait (a hold) for the tool's end: a tool that ends sooner is
    answered and told ended together, its pipes already at their end (the server wakes once for
    all of it, and never watches the pipes); one that runs on is answered once the hold is over.
    Answers keep their requests' order: one that goes at once takes the held ones with it.

    Can fail: on main a request had no hold; every answer went at once, the tool's end a wake-up
    later, and the pipes ended only after that."""
    _, replies = native
    quick = Tool()
    send(replies.sock, _request(["/bin/true"], {}, "/tmp", hold=1.0), quick.fds())
    quick.handed_over()
    pid = replies.answer()[0]
    assert pid > 0
    MESSAGE.unpack_from(replies.sock.recv(4096, socket.MSG_DONTWAIT))  # its end is there already
    assert select.select([quick.out_r], [], [], 0)[0] == [quick.out_r] and os.read(quick.out_r, 10) == b""
    os.close(quick.out_r)
    slow, slower, then = Tool(), Tool(), Tool()
    send(replies.sock, _request(["/bin/sleep", "30"], {}, "/tmp", hold=0.2), slow.fds())
    slow.handed_over()
    sleeper = replies.answer()[0]  # the hold is over, the tool still runs
    assert procfs.alive(sleeper) and sleeper not in replies.exits
    send(replies.sock, _request(["/bin/sleep", "30"], {}, "/tmp", hold=1.0), slower.fds())
    send(replies.sock, _request(["/bin/true"], {}, "/tmp"), then.fds())
    slower.handed_over()
    then.handed_over()
    held, at_once = replies.answer()[0], replies.answer()[0]  # in their requests' order
    assert procfs.alive(held) and at_once not in (held, sleeper) and at_once > 0
    assert then.ending(replies, at_once) == (b"", 0)
    for pid in (sleeper, held):
        os.kill(pid, signal.SIGKILL)
        assert replies.exit_status(pid) == signal.SIGKILL
    os.close(slow.out_r)
    os.close(slower.out_r)


def test_malformed_requests_are_refused_and_change_nothing(native: tuple[int, Replies]) -> None:
    """Requests come from the root server only, yet none crashes or confuses the spawner: each
    malformed one is answered with an error, and its descriptors are closed."""
    pid, replies = native
    sock = replies.sock
    fds_before = descriptors(pid)
    good = _request(["/bin/true"], {"PATH": "/bin"}, "/tmp")
    body = good[COUNTS.size:]
    malformed = {
        "too short": b"\1\0\0",
        "counts alone": COUNTS.pack(1, 0, 0),
        "not NUL-terminated": good[:-1],
        "bytes after the last string": good + b"junk",
        "a string more than counted": good + b"junk\0",
        "fewer strings than counted": COUNTS.pack(3, 5, 0) + body,
        "huge counts": COUNTS.pack(0xFFFFFFFF, 0xFFFFFFFF, 0) + body,
        "counts that wrap": COUNTS.pack(0xFFFFFFFF, 3, 0) + body,
        "no program": COUNTS.pack(0, 0, 0) + b"/tmp\0",
        "an empty program": COUNTS.pack(1, 0, 0) + b"/tmp\0\0",
        "a relative cwd": COUNTS.pack(1, 0, 0) + b"tmp\0/bin/true\0",
        "a variable without =": COUNTS.pack(1, 1, 0) + b"/tmp\0/bin/true\0PATH\0",
        "a variable without a name": COUNTS.pack(1, 1, 0) + b"/tmp\0/bin/true\0=x\0",
        "nothing but NULs": b"\0" * 64,
    }
    for what, data in malformed.items():
        tool = Tool()
        send(sock, data, tool.fds())
        tool.handed_over()
        got = replies.answer()
        assert got[:2] == (0, errno.EINVAL) and "malformed" in got[2], (what, got)
        assert os.read(tool.out_r, 4) == b"", what  # closed, unused
    for count in (0, 2, 4):
        tool = Tool()
        send(sock, good, tool.fds(count))
        tool.handed_over()
        got = replies.answer()
        assert got[:2] == (0, errno.EINVAL) and "needs stdin" in got[2], (count, got)
    # What fails as the tool user, not as root: each said with its errno.
    refusals = {("no-such-program", "/tmp"): errno.ENOENT, ("/bin/true", "/no/such/dir"): errno.ENOENT,
                ("/bin/true", "/root"): errno.EACCES, ("/etc/passwd", "/tmp"): errno.EACCES}
    for (program, cwd), code in refusals.items():
        tool = Tool()
        send(sock, _request([program], {"PATH": "/usr/bin:/bin"}, cwd), tool.fds())
        tool.handed_over()
        got = replies.answer()
        assert got[:2] == (0, code), (program, cwd, got)
    assert descriptors(pid) == fds_before  # nothing kept of any of them
    assert not replies.exits  # no tool started, no end told
    assert run(replies, ["/bin/sh", "-c", "echo fine"], {}) == (b"fine\n", 0)


def test_a_request_up_to_the_spawner_s_limit_is_carried_and_a_longer_one_refused(
        native: tuple[int, Replies]) -> None:
    pid, replies = native
    sock = replies.sock
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) - 32 <= MAX_REQUEST:
        pytest.skip("this host's net.core.wmem_max keeps a socket's messages below the spawner's limit")
    env = {f"V{i}": "x" * 100_000 for i in range(20)}
    request = _request(["/bin/sh", "-c", "echo ${#V0} ${#V19}"], env, "/tmp")
    assert MAX_REQUEST - 200_000 < len(request) <= MAX_REQUEST
    tool = Tool()
    send(sock, request, tool.fds())
    tool.handed_over()
    got = replies.answer()
    assert got[0] > 0, got
    assert tool.ending(replies, got[0]) == (b"100000 100000\n", 0)
    rss_anon_kib = int(status_field(pid, "RssAnon").split()[0])
    assert rss_anon_kib < 512, rss_anon_kib  # the request's pages given back
    tool = Tool()
    send(sock, request + b"x" * (MAX_REQUEST + 100 - len(request)), tool.fds())
    tool.handed_over()
    assert replies.answer()[:2] == (0, errno.EMSGSIZE)
    assert run(replies, ["/bin/sh", "-c", "echo fine"], {}) == (b"fine\n", 0)


def test_a_request_over_the_socket_s_limit_goes_the_long_way_and_keeps_the_spawner() -> None:
    async def main() -> None:
        spawner = Spawner(NOBODY, NOBODY, [], b"500")
        await spawner.start(asyncio.get_running_loop())
        try:
            tool = Tool()
            spawner.max_request = 1000
            with pytest.raises(SpawnRefused) as refused:
                await spawner.spawn(["/bin/true"], {"V": "x" * 1000}, "/tmp", tool.null, tool.out_w, tool.out_w)
            assert not refused.value.maybe_started and "over the spawner's 1000" in str(refused.value)
            assert spawner.alive
            pid, exit_status = await spawner.spawn(["/bin/sh", "-c", "echo ok; exit 5"], {"V": "x"}, "/tmp",
                                                   tool.null, tool.out_w, tool.out_w)
            assert pid > 0 and await exit_status == 5 << 8
            tool.handed_over()
            assert os.read(tool.out_r, 100) == b"ok\n"
        finally:
            spawner.stop()

    asyncio.run(main())


def test_a_tool_s_end_told_before_its_spawner_is_stopped_is_its_status() -> None:
    """The spawner reaps a tool only once it has told how it ended: a tool gone means its status
    is in the server's socket, and stopping the spawner (a reset, a stopped spawner given up) takes
    what it said, not an exit the server can no longer learn (a tool reaped by another is taken
    for exit 0). Tools whose end was not told are the server's children then: their status None."""

    async def main() -> None:
        spawner = Spawner(NOBODY, NOBODY, [], b"500")
        await spawner.start(asyncio.get_running_loop())
        tool = Tool()
        gate_r, gate_w = os.pipe2(os.O_CLOEXEC)
        running = 0
        try:
            ended, told = await spawner.spawn(["/bin/sh", "-c", "read go; exit 5"], {}, "/tmp", gate_r, tool.out_w,
                                              tool.out_w)
            running, untold = await spawner.spawn(["/bin/sh", "-c", "exec sleep 30"], {}, "/tmp", tool.null,
                                                  tool.out_w, tool.out_w)
            # Blocking waits from here: the loop does not read the socket meanwhile.
            os.write(gate_w, b"go\n")
            assert wait_until(lambda: procfs.stat(ended) is None, 10)
            assert not told.done()
            spawner.stop()
            assert told.result() == 5 << 8 and untold.result() is None
            assert process_alive(running)  # still running (a server, a subreaper, would reap it)
        finally:
            spawner.stop()
            tool.handed_over()
            for fd in (tool.out_r, gate_r, gate_w):
                os.close(fd)
            if running:
                os.kill(running, signal.SIGKILL)

    asyncio.run(main())
