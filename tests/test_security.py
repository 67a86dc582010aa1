"""Attacks on the local backend's sandboxes: what a model rewarded for passing tests would try.

Every test plays the attacker from inside a real bubblewrap sandbox (or through the API a
sandbox's user has) and checks that the host, the other sandboxes and the record of what
happened are unharmed. Nothing is mocked. The threat model is in ``docs/security.md``.

Each test says, under "Can fail", how it was seen to fail with the protection switched off, in a
way that does not harm the host (a protection removed in a throwaway copy of the product, or a
limit raised, or a control experiment run on the host with the same probe).

Most tests share one backend and a few sandboxes (module scope) to stay within the time budget;
each test checks its own claim and leaves its sandboxes usable for the next.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from control_plane.backends.base import Limits, SandboxHandle
from control_plane.backends.local import LocalBackend
from sandbox_server.config import env_flag
from tests.local_helpers import (
    LoopThread,
    client,
    delete_sandboxes,
    leftovers,
    loop_thread,
    spec,
    start_backend,
    wait_for,
)

pytestmark = pytest.mark.security

CAN_ISOLATE = os.geteuid() == 0 and shutil.which("bwrap") is not None
if not CAN_ISOLATE:  # pragma: no cover - the suite runs as root with bubblewrap
    pytest.skip("the attacks need root and bubblewrap (real isolation)", allow_module_level=True)

MiB = 1 << 20
SECRET = f"idegym-secret-{os.getpid()}-{time.time_ns()}"
DIGEST = ("find . -printf '%y %m %U %G %p %l\\n' | LC_ALL=C sort; "
          "find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum")


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    yield from loop_thread()


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sec")


@pytest.fixture(scope="module")
def backend(loop: LoopThread, state: Path) -> Iterator[LocalBackend]:
    # A secret in the control plane's own environment (the backend runs in this process).
    os.environ["IDEGYM_TEST_SECRET_TOKEN"] = SECRET
    b = start_backend(loop, state)
    yield b
    os.environ.pop("IDEGYM_TEST_SECRET_TOKEN", None)
    delete_sandboxes(loop, b)
    loop.run(b.close())


@pytest.fixture(scope="module")
def image(backend: LocalBackend, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A project with a git directory (hooks are a classic persistence spot) and a test suite."""
    root = tmp_path_factory.mktemp("img") / "proj"
    (root / "src").mkdir(parents=True)
    (root / "src" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(
        "import unittest\nfrom src.calc import add\n\n"
        "class T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 2), 4)\n"
        "    def test_zero(self):\n        self.assertEqual(add(0, 0), 0)\n")
    (root / "src" / "__init__.py").write_text("")
    (root / "tests" / "__init__.py").write_text("")
    (root / "run_tests.py").write_text(RUN_TESTS)
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / ".git" / "hooks" / "pre-commit.sample").write_text("#!/bin/sh\nexit 0\n")
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    os.chmod(root / ".git" / "hooks" / "pre-commit.sample", 0o755)
    (root / "README.md").write_text("calc\n")
    return backend.register_project("sec/calc:1", root)


# The task's own test runner: unittest → JUnit XML (the sandbox has no pytest).
RUN_TESTS = '''import sys, unittest, xml.etree.ElementTree as ET
result = unittest.TextTestRunner(verbosity=0).run(unittest.defaultTestLoader.discover("tests", top_level_dir="."))
suite = ET.Element("testsuite", tests=str(result.testsRun))
bad = {t.id() for t, _ in result.failures + result.errors}
for i in range(result.testsRun):
    case = ET.SubElement(suite, "testcase", name=str(i))
for case, name in zip(suite, sorted(bad)):
    ET.SubElement(case, "failure", message=name)
ET.ElementTree(suite).write("test-results.xml")
sys.exit(0 if result.wasSuccessful() else 1)
'''


def _create(loop: LoopThread, backend: LocalBackend, name: str, image: str | None = None, **kw: Any) -> SandboxHandle:
    return loop.run(backend.create(spec(name, image, **kw) if image else spec(name, **kw), 60))


@pytest.fixture(scope="module")
def sb_user(loop: LoopThread, backend: LocalBackend, image: str) -> Iterator[SandboxHandle]:
    h = _create(loop, backend, "sec-user", image)
    yield h
    loop.run(backend.delete(h))


@pytest.fixture(scope="module")
def sb_root(loop: LoopThread, backend: LocalBackend, image: str) -> Iterator[SandboxHandle]:
    h = _create(loop, backend, "sec-root", image, root=True)
    yield h
    loop.run(backend.delete(h))


@pytest.fixture(scope="module")
def sb_limited(loop: LoopThread, backend: LocalBackend) -> Iterator[SandboxHandle]:
    backend.pids_max = 128
    try:
        h = _create(loop, backend, "sec-limited", limits=Limits(memory_bytes=256 * MiB, storage_bytes=64 * MiB))
    finally:
        backend.pids_max = 1024
    yield h
    loop.run(backend.delete(h))


# -- helpers ----------------------------------------------------------------------------------------


def call(h: SandboxHandle, path: str, body: dict[str, Any] | None = None, timeout: float = 120) -> httpx.Response:
    with client(h, timeout) as c:
        return c.post(path, json=body or {})


def sh(h: SandboxHandle, command: str, **fields: Any) -> dict[str, Any]:
    fields.setdefault("timeout", 60)
    resp = call(h, "/api/tools/bash", {"command": command, **fields}, timeout=fields["timeout"] + 30)
    assert resp.status_code == 200, resp.text
    return resp.json()


def out(h: SandboxHandle, command: str, **fields: Any) -> str:
    return sh(h, command, **fields)["stdout"]


def server_pid(h: SandboxHandle) -> int:
    return h.data["server"][0]


def sandbox_processes(h: SandboxHandle) -> list[str]:
    """Every live process in the sandbox but its init, the server and the ``ps`` asking."""
    found = []
    for line in out(h, "ps -eo pid=,stat=,args=").splitlines():
        parts = line.split(None, 2)
        if len(parts) < 3:
            continue
        pid, status, args = parts
        if pid == "1" or "sandbox_server" in args or args.startswith("ps -eo") or status.startswith("Z"):
            continue
        found.append(line.strip())
    return found


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def cgroup_value(h: SandboxHandle, controller: str, name: str) -> str:
    return Path(h.data["cgroups"][controller], name).read_text()


# What stays in the tools' groups: the server's spawner thread, and the tool user's spawner (unless
# IDEGYM_TOOL_SPAWNER=0: the suite can run both ways), kept across a terminate while nothing changed it.
LEFT = 2 if env_flag("IDEGYM_TOOL_SPAWNER", True) else 1


def tool_pids(h: SandboxHandle, name: str = "pids.current") -> int:
    """In the tools' group: the sandbox's cap minus the server's reserve bites there."""
    return int(Path(h.data["cgroups"]["pids"], "tools", name).read_text().strip())


# -- resource exhaustion ----------------------------------------------------------------------------


def test_fork_bomb_is_capped_and_ended(sb_limited: SandboxHandle) -> None:
    """A fork bomb (and a thread bomb) hits pids.max, the server keeps answering; a bomb dies
    with the call that timed out, and a detached one with ``/api/processes/terminate``.
    Meanwhile a command that cannot start says so (exit 126) instead of failing the server.

    Can fail: it did: before the fix a call made while the sandbox was out of processes
    answered 500 (BlockingIOError from fork), seen again with the exit-126 fallback removed in a
    scratch copy. Without pids.max (the protection) the first assertion fails, and the peak
    assertion fails for any limit above 128.
    """
    assert cgroup_value(sb_limited, "pids", "pids.max").strip() == "128"
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], int(cgroup_value(sb_limited, "pids", "pids.current")))
            time.sleep(0.005)

    threading.Thread(target=watch, daemon=True).start()
    try:
        result = sh(sb_limited, "bomb() { bomb | bomb & }; bomb; sleep 3", timeout=2, graceful_termination_timeout=0.5)
        assert result["timed_out"]
        assert wait_for(lambda: tool_pids(sb_limited) <= LEFT, 5), tool_pids(sb_limited)
        threads = sh(sb_limited, "python3 -c \"import threading, time\n"
                                 "n = 0\ntry:\n"
                                 "    while True:\n"
                                 "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); "
                                 "n += 1\n"
                                 "except RuntimeError as e: print('capped', n, e)\"", timeout=20)
        assert "capped" in threads["stdout"] and int(threads["stdout"].split()[1]) < 128, threads
        # Detached processes that outlive their (finished) call fill the sandbox: it is full, and says
        # so. (They hold their places: a churning bomb frees one now and then, and a start may win it.)
        sh(sb_limited, "(while sleep 1000 & do :; done 2>/dev/null; exec sleep 1000) </dev/null >/dev/null 2>&1 & "
                       "exit 0", timeout=10)
        assert wait_for(lambda: tool_pids(sb_limited) >= tool_pids(sb_limited, "pids.max") - 2, 30)
        assert wait_for(lambda: sh(sb_limited, "echo started", timeout=5)["exit_code"] == 126, 30)
        starved = sh(sb_limited, "echo started", timeout=5)
        assert starved["exit_code"] == 126 and "could not start" in starved["stderr"], starved
        with client(sb_limited) as c:
            assert c.get("/api/health").status_code == 200
            ended = c.post("/api/processes/terminate", json={"graceful_termination_timeout": 0.2}).json()
        assert ended["killed_processes"] >= 64, ended
        assert wait_for(lambda: tool_pids(sb_limited) <= LEFT, 5), tool_pids(sb_limited)
    finally:
        done.set()
    assert 64 < peak[0] <= 128, peak
    assert out(sb_limited, "echo alive") == "alive\n"


def test_memory_bomb_is_oom_killed_and_reported(sb_limited: SandboxHandle) -> None:
    """A 1 GiB allocation in a 256 MiB sandbox is OOM-killed; the result says so (exit 137 and
    ``oom_killed``); the server survives even a bomb of many medium processes.

    Can fail: without the memory limit (a scratch copy that skips memory.limit_in_bytes; 1 GiB is
    harmless on this host) the command exited 0; without the OOM counter passed to the server
    (another scratch copy, and the code before the fix) ``oom_killed`` was false or absent.
    """
    result = sh(sb_limited, "python3 -c \"b = bytearray(1 << 30); print(len(b))\"")
    assert result["exit_code"] == 137, result
    assert result.get("oom_killed") is True, result
    ok = sh(sb_limited, "python3 -c \"b = bytearray(16 << 20); print(len(b))\"")
    assert ok["exit_code"] == 0 and ok.get("oom_killed") is False, ok
    # Many processes of 40 MiB each: the OOM killer must pick tools, not the (bigger) server.
    pid = server_pid(sb_limited)
    many = sh(sb_limited, "for i in $(seq 12); do python3 -c \"import time; b = bytearray(40 << 20); "
                          "time.sleep(5)\" & done; wait", timeout=30)
    assert many["oom_killed"] is True, many
    assert Path(f"/proc/{pid}").exists() and h_alive(sb_limited)
    memory = sb_limited.data["cgroups"]["memory"]
    assert Path(memory, "memory.limit_in_bytes").read_text().strip() == str(256 * MiB)


def h_alive(h: SandboxHandle) -> bool:
    with client(h, 10) as c:
        return c.get("/api/health").status_code == 200


def test_disk_and_shm_fill_are_bounded_and_private(loop: LoopThread, backend: LocalBackend,
                                                   sb_user: SandboxHandle) -> None:
    """Filling the project, the home directory, /tmp and /dev/shm stops at the sandbox's bounds;
    no neighbour sees the files; deleting the sandbox gives the space back.

    Can fail: with ``storage_bytes`` unset, the 100 MiB writes to the project and the home
    directory succeed (they land on the state disk) and the ENOSPC count is 2 short.
    """
    targets = ("/home/appuser/work/big", "/home/appuser/big", "/tmp/big", "/dev/shm/big")
    disk = _create(loop, backend, "sec-disk", limits=Limits(storage_bytes=32 * MiB))
    try:
        fill = "; ".join(f"dd if=/dev/zero of={t} bs=1M count=100 2>&1 | grep -c 'No space left'" for t in targets)
        result = sh(disk, fill)
        assert result["stdout"].split() == ["1"] * 4, result
        layers = Path(disk.data["dir"], "layers")
        assert layers.is_mount() and shutil.disk_usage(layers).used <= 32 * MiB
        # Nobody else sees these files.
        assert out(sb_user, "ls " + " ".join(targets) + " 2>/dev/null | wc -l").strip() == "0"
    finally:
        loop.run(backend.delete(disk))
    assert leftovers(disk) == []  # the bounded layers and everything in them are gone
    # A default sandbox: /tmp 1 GiB and /dev/shm 64 MiB, RAM-backed, private to the sandbox.
    sizes = out(sb_user, "df -k --output=size /tmp /dev/shm | tail -2").split()
    assert [int(s) for s in sizes] == [1 << 20, 64 << 10], sizes
    shm = sh(sb_user, "dd if=/dev/zero of=/dev/shm/fill bs=1M count=100 2>&1 | grep 'No space'; rm /dev/shm/fill")
    assert "No space left on device" in shm["stdout"], shm


def test_runaway_output_is_capped(sb_user: SandboxHandle) -> None:
    """Endless output ends with the call's timeout, the answer keeps at most ``max_output_bytes``
    per stream and the server's memory does not follow the output.

    Can fail: with the cap ignored (a scratch copy keeping 100 times more) the answer carried
    6.4 MB and the size assertion failed.
    """
    pid = server_pid(sb_user)
    before = rss_kib(pid)
    started = time.monotonic()
    result = sh(sb_user, "cat /dev/zero & cat /dev/urandom >&2 & yes", timeout=3, graceful_termination_timeout=0.5,
                max_output_bytes=64 << 10)
    assert result["timed_out"] and time.monotonic() - started < 20  # not the client's 31 s timeout
    assert len(result["stdout"].encode()) < 70 << 10 and len(result["stderr"].encode()) < 200 << 10
    assert rss_kib(pid) - before < 64 << 10, (before, rss_kib(pid))
    assert not sandbox_processes(sb_user)


# -- time -------------------------------------------------------------------------------------------


def test_sleeping_past_every_limit(sb_user: SandboxHandle) -> None:
    """Commands that ignore SIGTERM, spin the CPU or sleep come back at timeout + grace, and
    nothing of them is left; the code runner's runs too.

    Can fail: without the SIGKILL escalation (a scratch copy that only sends SIGTERM) the
    TERM-ignoring sleep kept the call open until the client's 31 s timeout fired.
    """
    for command in ("trap '' TERM INT HUP; sleep 1000", "while :; do :; done", "exec sleep 1000"):
        started = time.monotonic()
        result = sh(sb_user, command, timeout=1, graceful_termination_timeout=0.5)
        assert result["timed_out"] and result["exit_code"] == 124, (command, result)
        assert time.monotonic() - started < 15, command  # not the client's 31 s timeout
    assert not sandbox_processes(sb_user)
    for code in ("while True: pass", "import time, signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                     "time.sleep(1000)"):
        started = time.monotonic()
        resp = call(sb_user, "/execute", {"language": "python", "code": code, "timeout": 1})
        assert resp.status_code == 200 and resp.json()["timedOut"] is True, resp.text
        assert time.monotonic() - started < 15  # not the client's 31 s timeout
    assert not sandbox_processes(sb_user)


def test_daemons_do_not_survive_a_timeout_or_a_reset(sb_user: SandboxHandle) -> None:
    """A double-forked, session-leaving, TERM-ignoring daemon started by a call that times out
    dies with the call; one started by a call that ends normally lives on (agents start
    servers) until the project is reset or the tools' processes are ended.

    Can fail: before the call's shell became a child subreaper, the double-forked daemon was
    re-parented to the server and outlived the timed-out call (this test's first assertion).
    """
    daemon = "(trap '' TERM HUP; setsid sleep 990 </dev/null >/dev/null 2>&1 &) ; "
    sh(sb_user, daemon + "sleep 1000", timeout=1, graceful_termination_timeout=0.3)
    assert not [p for p in sandbox_processes(sb_user) if "sleep 990" in p], sandbox_processes(sb_user)
    # A respawning daemon: each TERM starts a replacement; a completed call leaves it running.
    respawner = ("cat > /tmp/respawn.sh <<'EOF'\ntrap 'setsid bash /tmp/respawn.sh &' TERM\n"
                 "while :; do sleep 0.2; done\nEOF\n"
                 "(setsid bash /tmp/respawn.sh </dev/null >/dev/null 2>&1 &); " + daemon + "echo started")
    assert sh(sb_user, respawner)["stdout"] == "started\n"
    assert [p for p in sandbox_processes(sb_user) if "sleep 990" in p]
    reset = call(sb_user, "/api/project/reset", {"graceful_termination_timeout": 0.3}).json()
    assert reset["status"] == "success" and reset["killed_processes"] >= 2, reset
    assert not sandbox_processes(sb_user), sandbox_processes(sb_user)


# -- network ----------------------------------------------------------------------------------------

NET_PROBE = r'''python3 - <<'EOF'
import socket, sys
for name, fam, addr in %s:
    s = socket.socket(getattr(socket, fam), socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(tuple(addr) if fam == "AF_INET" else addr)
        print("CONNECTED", name)
    except OSError as exc:
        print("blocked", name, exc.errno)
    finally:
        s.close()
EOF'''


def _host_ipv4() -> str | None:
    text = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    for line in text.splitlines():
        addr = line.split()[3].split("/")[0]
        if not addr.startswith("127."):
            return addr
    return None


def test_no_network_not_even_the_hosts_loopback(sb_user: SandboxHandle, sb_root: SandboxHandle) -> None:
    """Without network, neither appuser nor root reaches the host's loopback, its address, an
    abstract Unix socket on the host, the cloud metadata address or the internet.

    Can fail: the same probe run on the host connects to all three host listeners (checked here
    as a control); a sandbox with ``network=True`` reaches the loopback (test_local_backend).
    """
    abstract = f"\0idegym-sec-{os.getpid()}"
    listeners = [socket.socket(socket.AF_UNIX), socket.socket(), socket.socket()]
    listeners[0].bind(abstract)
    listeners[1].bind(("127.0.0.1", 0))
    listeners[2].bind(("0.0.0.0", 0))
    accepted: list[str] = []
    sweeps = [0]  # full passes of the accept loop over every listener
    for sock in listeners:
        sock.listen(8)
        sock.settimeout(0.05)  # a pass over the three listeners takes 0.15 s when none is called

    def serve() -> None:
        while listeners[0].fileno() != -1:
            for sock in listeners:
                try:
                    conn, _ = sock.accept()
                    accepted.append(str(sock.getsockname()))
                    conn.close()
                except OSError:
                    continue
            sweeps[0] += 1

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    host_ip = _host_ipv4()
    targets = [("abstract", "AF_UNIX", abstract), ("loopback", "AF_INET", ["127.0.0.1", listeners[1].getsockname()[1]]),
               ("metadata", "AF_INET", ["169.254.169.254", 80]), ("internet", "AF_INET", ["1.1.1.1", 53])]
    if host_ip:
        targets.append(("host-address", "AF_INET", [host_ip, listeners[2].getsockname()[1]]))
    probe = NET_PROBE % json.dumps(targets)
    try:
        control = subprocess.run(["bash", "-c", probe], capture_output=True,
                                 text=True, timeout=30).stdout
        assert control.count("CONNECTED") >= 2 + bool(host_ip), control  # the listeners work
        seen = len(accepted)
        for h in (sb_user, sb_root):
            result = out(h, probe + "\ncat /proc/net/dev | tail -n +3 | cut -d: -f1")
            assert "CONNECTED" not in result, result
            assert result.count("blocked") == len(targets)
            assert result.split()[-1] == "lo"  # the only interface
        after = sweeps[0]  # a connection made by the probes is accepted by the next full pass
        assert wait_for(lambda: sweeps[0] >= after + 2, 10)
        assert len(accepted) == seen, accepted
    finally:
        for sock in listeners:
            sock.close()
        thread.join(2)


# -- what a sandbox can see -------------------------------------------------------------------------


def test_host_state_and_neighbours_are_invisible(sb_root: SandboxHandle, sb_user: SandboxHandle,
                                                 backend: LocalBackend) -> None:
    """Root in a sandbox finds nothing of the host's home directories, the control plane's state
    and environment, or another sandbox's files.

    Can fail: the same search run on the host finds the markers and the secret (the control
    below), so the probe does find what is there to find.
    """
    marker = f"idegym-marker-{os.getpid()}"
    planted = [Path("/root") / marker, Path("/tmp") / marker, backend.state_dir / f"{marker}.db",
               backend.state_dir / "sandboxes" / f"{marker}-state"]
    for path in planted:
        path.write_text(SECRET)
    try:
        out(sb_user, f"echo {SECRET} > /tmp/{marker}-n; echo {SECRET} > ~/{marker}-n; echo {SECRET} > {marker}-n",
            env={})
        # Patterns that match the marker and the secret without containing them: the probe's own
        # command line must not be what the search finds.
        name, secret = marker.replace("marker", "mark?r"), SECRET.replace("secret", "secre[t]")
        search = (f"find / \\( -path /proc -o -path /sys \\) -prune -o -name '{name}*' -print 2>/dev/null; "
                  f"grep -rlsE -- '{secret}' /etc /opt/idegym/site /root /home /tmp /run /var 2>/dev/null | head; "
                  "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | "
                  f"grep -aE -- '{secret}'; "
                  f"test -e {backend.state_dir} && echo STATE-VISIBLE; "
                  "find / -name 'control-plane.db*' -not -path '/proc/*' 2>/dev/null; ls /root; echo END")
        found = out(sb_root, search, timeout=120)
        assert found.strip().endswith("END"), found
        assert marker not in found and SECRET not in found and "STATE-VISIBLE" not in found, found
        # Control: on the host the same search finds the markers planted there.
        host = subprocess.run(["bash", "-c", f"ls /root/{marker} /tmp/{marker}; env | grep -cF -- {SECRET}"],
                              capture_output=True, text=True).stdout
        assert host.count(marker) == 2 and host.strip().endswith("1"), host
    finally:
        for path in planted:
            path.unlink()
        out(sb_user, f"rm -f /tmp/{marker}-n ~/{marker}-n {marker}-n")


# -- files ------------------------------------------------------------------------------------------


def _file_body(endpoint: str, path: str) -> dict[str, Any]:
    from diff_match_patch import diff_match_patch

    dmp = diff_match_patch()
    return {
        "create": {"file_path": path, "content": "pwned\n"},
        "edit": {"file_path": path, "start_line": 1, "end_line": 1, "new_content": "pwned"},
        "patch": {"file_path": path, "patch": dmp.patch_toText(dmp.patch_make("root", "pwned"))},
        "upload": {"file_path": path, "content_base64": base64.b64encode(b"pwned\n").decode(), "offset": 0,
                   "truncate": True},
        "download": {"file_path": path},
    }[endpoint]


ESCAPES = ["../../../etc/passwd", "/etc/passwd", "etc-link/passwd", "passwd-link", "up/etc/passwd", "dangling",
           "bashrc-link", "src/../../.bashrc", "/home/appuser/work/../.bashrc", "/proc/self/environ",
           "/run/idegym/server.sock", "proc-link/environ", "deep/../../../../../../etc/hostname"]


@pytest.fixture(scope="module")
def escape_links(sb_user: SandboxHandle) -> Iterator[None]:
    out(sb_user, "ln -sfn /etc etc-link; ln -sf /etc/passwd passwd-link; ln -sfn ../../.. up; "
                 "ln -sf /tmp/outside-target dangling; ln -sf ~/.bashrc bashrc-link; ln -sfn /proc/self proc-link; "
                 "mkdir -p deep; touch ~/.bashrc")
    yield
    out(sb_user, "rm -rf etc-link passwd-link up dangling bashrc-link proc-link deep")


@pytest.mark.parametrize("endpoint", ["create", "edit", "patch", "upload", "download"])
def test_file_endpoints_stay_in_the_project(sb_user: SandboxHandle, escape_links: None, endpoint: str) -> None:
    """Symlinks and ``..`` that lead out of the project are refused by every file endpoint,
    whatever the path looks like; nothing outside is read or written.

    Can fail: with ``FileTools.resolve`` checking the path as written instead of resolving
    symlinks (a scratch copy), the symlinked paths were no longer refused (the first one reached
    the open and failed there with 400 ELOOP; ``etc-link/passwd`` would have been read).
    """
    before = out(sb_user, "sha256sum /etc/passwd ~/.bashrc /etc/hostname")
    for path in ESCAPES:
        resp = call(sb_user, f"/api/tools/file/{endpoint}", _file_body(endpoint, path))
        assert resp.status_code in (403, 404), (path, resp.status_code, resp.text)
        assert "root:" not in resp.text and "pwned" not in resp.text
    assert out(sb_user, "sha256sum /etc/passwd ~/.bashrc /etc/hostname") == before
    assert sh(sb_user, "test -e /tmp/outside-target")["exit_code"] == 1
    # NUL bytes and empty paths are request errors, not OS errors.
    for path in ("", "src/\x00x"):
        assert call(sb_user, f"/api/tools/file/{endpoint}", _file_body(endpoint, path)).status_code == 422


def test_execute_files_stay_in_their_run_directory(sb_user: SandboxHandle) -> None:
    """The code runner's extra files cannot point out of their run directory, and the run
    directory is gone afterwards.

    Can fail: with ``_safe_relative`` accepting any path (a scratch copy), ``../escape.txt``
    answered 200 and was written next to the run directory.
    """
    for path in ("../escape.txt", "/tmp/escape.txt", "a/../../escape.txt", "", ".", "a/\x00"):
        body = {"language": "python", "code": "print(1)", "files": [{"path": path, "content": "x"}]}
        assert call(sb_user, "/execute", body).status_code == 422, path
    body = {"language": "python", "code": "import os; print(os.getcwd()); print(sorted(os.listdir('.')))",
            "files": [{"path": "data/in.txt", "content": "hello"}]}
    resp = call(sb_user, "/execute", body).json()
    assert resp["exitCode"] == 0 and "'data'" in resp["stdout"], resp
    run_dir = resp["stdout"].split()[0]
    assert sh(sb_user, f"test -e {run_dir} || test -e /tmp/escape.txt")["exit_code"] == 1
    assert "idegym-run" not in out(sb_user, "ls -a /tmp")


# -- privilege --------------------------------------------------------------------------------------


def test_setuid_binaries_give_no_privilege(sb_root: SandboxHandle, sb_user: SandboxHandle) -> None:
    """A set-uid-root binary planted by root in the sandbox, or the host's own (su, mount,
    passwd), gives appuser nothing: no_new_privs and nosuid mounts.

    Can fail: the same planted binary run on the host by an unprivileged uid reports euid 0
    (the control below), so the probe does see an elevation when there is one.
    """
    out(sb_root, "cp /usr/bin/id /usr/local/bin/suid-id && chmod 4755 /usr/local/bin/suid-id")
    assert out(sb_root, "/usr/local/bin/suid-id -u", user="appuser").strip() == "1000"
    result = sh(sb_user, "grep NoNewPrivs /proc/self/status; /usr/bin/mount -t tmpfs none /mnt && echo MOUNTED; "
                         "echo x | /usr/bin/su -c 'id -u' root && echo SU; id -u")
    assert "NoNewPrivs:\t1" in result["stdout"] and "MOUNTED" not in result["stdout"] and "SU" not in result["stdout"]
    assert result["stdout"].strip().endswith("1000")
    # Control on the host: a set-uid copy of id, run as nobody, does report euid 0.
    control_dir = Path(tempfile_dir())
    try:
        binary = control_dir / "suid-id"
        shutil.copy("/usr/bin/id", binary)
        os.chmod(binary, 0o4755)
        euid = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(binary), "-u"],
                              capture_output=True, text=True).stdout.strip()
        assert euid == "0", euid
    finally:
        shutil.rmtree(control_dir)


def tempfile_dir() -> str:
    import tempfile

    path = tempfile.mkdtemp(prefix="idegym-sec-", dir="/tmp")
    os.chmod(path, 0o755)
    return path


PTRACE_PROBE = r'''python3 - <<'EOF'
import ctypes, errno, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
lines = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout.splitlines()
targets = {"server": int(next(l.split()[0] for l in lines if "sandbox_server" in l and "bwrap" not in l)),
           "init": 1, "host": %d}
for name, pid in targets.items():
    if libc.ptrace(16, pid, 0, 0) == 0:  # PTRACE_ATTACH
        os.waitpid(pid, 0x40000000)  # __WALL
        libc.ptrace(17, pid, 0, 0)  # PTRACE_DETACH
        print("ATTACHED", name)
    else:
        print("refused", name, errno.errorcode[ctypes.get_errno()])
    try:
        open(f"/proc/{pid}/mem", "rb").close()
        print("OPENED-MEM", name)
    except OSError as exc:
        print("refused-mem", name, errno.errorcode.get(exc.errno))
EOF'''


def test_ptrace_reaches_nothing_outside_the_tools(sb_root: SandboxHandle, sb_user: SandboxHandle) -> None:
    """Neither appuser nor root tools can ptrace (or read the memory of) the sandbox server,
    which holds the capabilities they lack, and host processes do not even exist for them.
    Root tools may trace the sandbox's init (the placeholder, uid 0 without any capability): it
    has nothing to give.

    Can fail: before root tools lost CAP_SYS_PTRACE, the root sandbox attached to its server
    (and through it could have regained CAP_SYS_ADMIN).
    """
    for h in (sb_user, sb_root):
        result = out(h, PTRACE_PROBE % os.getpid())
        assert "ATTACHED server" not in result and "OPENED-MEM server" not in result, result
        assert "refused host ESRCH" in result, result
        assert h_alive(h)
    assert "ATTACHED init" not in out(sb_user, PTRACE_PROBE % os.getpid())
    assert out(sb_root, "grep CapEff /proc/1/status").split()[1] == "0000000000000000"


def test_root_in_a_sandbox_cannot_touch_host_kernel_settings(loop: LoopThread, backend: LocalBackend) -> None:
    """Root in a run_as_root sandbox is uid 0 of the host's kernel for file ownership: the
    global sysctls in /proc/sys (core_pattern would run a program as host root) must stay out
    of its reach, whatever it mounts, unmounts or unshares, and however it redirects the
    server's own mounts.

    Can fail: it did: before the fix the first probe printed WROTE-SYSCTL (a same-value write
    to vm.stat_interval, harmless by construction) and CORE-WRITABLE: /proc/sys was writable.
    In scratch copies: without the read-only /proc/sys, the same; with root tools keeping
    CAP_SYS_ADMIN, UNMOUNTED and MOUNTED-PROC; with the server's mount calls following symlinks,
    the redirect trick left /proc/sys writable (SYSCTL-WRITABLE, by ``test -w`` only).
    """
    host_value = Path("/proc/sys/vm/stat_interval").read_text()
    h = _create(loop, backend, "sec-kernel", root=True)
    try:
        probes = [
            "cat /proc/sys/vm/stat_interval > /tmp/v && cat /tmp/v > /proc/sys/vm/stat_interval && echo WROTE-SYSCTL",
            "test -w /proc/sys/kernel/core_pattern && echo CORE-WRITABLE",
            "test -w /proc/sys/vm/stat_interval && echo SYSCTL-WRITABLE",
            "test -e /proc/sysrq-trigger && test -w /proc/sysrq-trigger && echo SYSRQ-WRITABLE",
            "umount /proc/sys && echo UNMOUNTED; umount -l /proc/sys && echo UNMOUNTED",
            "mount -o remount,rw /proc/sys && echo REMOUNTED; mount -o remount,bind,rw /proc/sys && echo REMOUNTED",
            "mount -t proc proc /mnt && echo MOUNTED-PROC; mount -t sysfs sysfs /mnt && echo MOUNTED-SYSFS",
            "mount -t cgroup2 none /mnt && echo MOUNTED-CGROUP2; mount -t tmpfs none /mnt && echo MOUNTED-TMPFS",
            "unshare -Urm sh -c 'umount /proc/sys && echo UNMOUNTED-NESTED; mount -o remount,rw /proc/sys "
            "&& echo REMOUNTED-NESTED; test -w /proc/sys/vm/stat_interval && echo NESTED-WRITABLE'",
            "unshare -Urmpf --mount-proc sh -c 'test -w /proc/sys/vm/stat_interval && echo NESTED-PROC-WRITABLE'",
        ]
        result = sh(h, " ; ".join(f"( {p} ) 2>/dev/null" for p in probes) + "; echo END")
        text = result["stdout"]
        assert text.strip().endswith("END"), result
        for word in ("WROTE", "WRITABLE", "UNMOUNTED", "REMOUNTED", "MOUNTED-PROC", "MOUNTED-SYSFS",
                     "MOUNTED-CGROUP2"):
            assert word not in text, (word, text)
        # Aim the server's own (capable) mount calls at /proc/sys: break the project layer so that a
        # reset unmounts the project and cannot mount it again, put a symlink to /proc/sys where the
        # project was, and reset twice more (the first would unmount the cover, the second the
        # project overlay mounted over it).
        broken = "rm -rf /opt/idegym/layer/work; touch /opt/idegym/layer/work"
        steps = [broken, "rm -rf /opt/idegym/layer/work; rm -rf /home/appuser/work && "
                         "ln -s /proc/sys /home/appuser/work && echo REDIRECTED", broken]
        trick = []
        for step in steps:
            trick.append(sh(h, step)["stdout"])
            trick.append(call(h, "/api/project/reset", {}).json()["status"])
        resets = trick
        assert "REDIRECTED\n" in trick, trick
        after = sh(h, "test -w /proc/sys/vm/stat_interval && echo SYSCTL-WRITABLE; "
                      "grep -c ' /proc/sys ' /proc/self/mountinfo; echo END")
        assert "SYSCTL-WRITABLE" not in after["stdout"] and after["stdout"].split()[0] != "0", (trick, resets, after)
    finally:
        loop.run(backend.delete(h))
    assert Path("/proc/sys/vm/stat_interval").read_text() == host_value
    assert leftovers(h) == []


# -- reuse: what a previous occupant leaves behind -------------------------------------------------


@pytest.fixture(scope="module")
def cpx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A control plane (local backend) with a secret in its environment."""
    from tests.cp_helpers import ControlPlaneProcess

    proc = ControlPlaneProcess(tmp_path_factory.mktemp("cpsec") / "state", ["--warm-pool", "0", "--ephemeral"],
                               env=dict(os.environ, IDEGYM_TEST_SECRET_TOKEN=SECRET))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def cp_image(cpx: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    project = tmp_path_factory.mktemp("cpimg") / "proj"
    (project / ".git" / "hooks").mkdir(parents=True)
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (project / "src").mkdir()
    (project / "src" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (project / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(project / "run.sh", 0o755)
    os.symlink("src/calc.py", project / "link.py")
    yaml_text = json.dumps({"images": [{"name": "sec-reuse", "project": {"path": str(project)}}]})
    name = cpx.http.post("/api/build-push-images", json={"yaml_content": yaml_text}).json()["job_names"][0]
    assert wait_for(lambda: cpx.http.get(f"/api/jobs/status/{name}").json()["status"] != "in_progress", 120)
    job = cpx.http.get(f"/api/jobs/status/{name}").json()
    assert job["status"] == "success", job
    return job["tag"]


INVENTORY = ("cd ~/work && " + DIGEST + "; echo ---; "
             "find ~ /tmp /dev/shm /var/tmp /usr/local /etc /root -path ~/work -prune -o -printf '%p %y %m %s\\n' "
             "2>/dev/null | LC_ALL=C sort | md5sum; echo ---; "
             "p=$(ps -eo args=); printf '%s\\n' \"$p\" | grep -v -e sandbox_server -e '^bwrap' -e '^ps -eo' "
             "| LC_ALL=C sort; echo ---; "
             "python3 -c 'import site; print(site.getusersitepackages())'")

PERSIST_USER = r"""
site=$(python3 -c 'import site; print(site.getusersitepackages())')
mkdir -p "$site" ~/.local/bin ~/.config/pip /tmp/hooks
echo 'print("pwned")' > "$site/usercustomize.py"; echo 'import os' > "$site/evil.pth"
printf '#!/bin/sh\necho pwned\n' > ~/.local/bin/python3; chmod +x ~/.local/bin/python3
echo 'echo pwned' >> ~/.bashrc; echo 'echo pwned' >> ~/.profile; echo 'registry=http://evil' > ~/.npmrc
printf '[core]\n\thooksPath = /tmp/hooks\n' > ~/.gitconfig; echo '[global]' > ~/.config/pip/pip.conf
printf '#!/bin/sh\necho pwned\n' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit
echo pwned > /tmp/pwned; echo pwned > /dev/shm/pwned; echo pwned > /var/tmp/pwned 2>/dev/null
echo pwned >> src/calc.py; chmod 700 src; rm link.py; ln -s /etc/passwd link.py; mkdir -p new/dir
(setsid nohup sleep 900 </dev/null >/dev/null 2>&1 &)
(trap '' TERM HUP; setsid sleep 901 </dev/null >/dev/null 2>&1 &)
true
"""

PERSIST_ROOT = r"""
mkdir -p /usr/local/lib/python3/dist-packages /etc/profile.d
echo 'print("pwned")' > /usr/local/lib/python3/dist-packages/sitecustomize.py
echo 'echo pwned' > /etc/profile.d/evil.sh; : > /etc/ld.so.preload; echo 'evil:x:0:0::/root:/bin/bash' >> /etc/passwd
echo 'echo pwned' >> /root/.bashrc; cp /usr/bin/id /usr/local/bin/suid-id; chmod 4755 /usr/local/bin/suid-id
"""


def _restart(cpx: Any, client: str, sid: int) -> None:
    resp = cpx.http.post("/api/idegym-servers/restart", json={"client_id": client, "server_id": sid})
    assert resp.status_code == 202, resp.text
    assert cpx.wait_op(resp.json()["operation_id"])["status"] == "SUCCEEDED"


@pytest.mark.parametrize("as_root", [False, True], ids=["appuser", "run_as_root"])
def test_restart_leaves_nothing_of_the_previous_occupant(cpx: Any, cp_image: str, as_root: bool) -> None:
    """After RESTART nothing of the previous episode survives: home dotfiles, user and system
    site-packages, shell start-up files, git hooks and config, /tmp, /dev/shm, /var/tmp,
    /etc and /usr/local changes, processes; the project is the image's again.

    Can fail: the inventory taken after planting differs from the fresh one (asserted just
    before the restart), so a restart that kept any planted file or process fails the last
    assertion.
    """
    client = cpx.register("sec-restart")
    sid = cpx.start_server(client, image_tag=cp_image, run_as_root=as_root, reuse_strategy="NONE")["server_id"]
    try:
        fresh = cpx.bash(client, sid, INVENTORY)["stdout"]
        plant = PERSIST_USER + (PERSIST_ROOT if as_root else "")
        assert cpx.bash(client, sid, plant)["exit_code"] == 0
        planted = cpx.bash(client, sid, INVENTORY)["stdout"]
        assert planted != fresh and "sleep 901" in planted
        _restart(cpx, client, sid)
        assert cpx.bash(client, sid, INVENTORY)["stdout"] == fresh
    finally:
        cpx.http.request("DELETE", "/api/clients", json={"client_id": client})


def test_reset_leaves_no_process_and_a_pristine_project(cpx: Any, cp_image: str) -> None:
    """After RESET no tool process survives (double-forked, TERM-ignoring or respawning) and
    the project is byte-identical to the image: contents, modes, owners, symlinks, git hooks.

    Can fail: with kill_descendants reduced to one scan-and-SIGKILL pass (the code before the
    fix, in a scratch copy), the spawner's newest sleeps were started after the scan and
    survived the reset.
    """
    client = cpx.register("sec-reset")
    sid = cpx.start_server(client, image_tag=cp_image, reuse_strategy="NONE")["server_id"]
    try:
        project = "cd ~/work && " + DIGEST
        pristine = cpx.bash(client, sid, project)["stdout"]
        respawn = ("cat > /tmp/respawn.sh <<'EOF'\n"
                   "trap 'setsid bash /tmp/respawn.sh </dev/null >/dev/null 2>&1 &' TERM\n"
                   "while :; do sleep 0.1; done\nEOF\n(setsid bash /tmp/respawn.sh </dev/null >/dev/null 2>&1 &)\n"
                   # and a spawner that never stops starting detached sleeps (up to pids.max)
                   "(setsid bash -c 'trap \"\" TERM; while :; do setsid sleep 1000 </dev/null >/dev/null 2>&1 & "
                   "done' </dev/null >/dev/null 2>&1 &)\nsleep 0.5\n")
        assert cpx.bash(client, sid, PERSIST_USER + respawn)["exit_code"] == 0
        assert cpx.bash(client, sid, project)["stdout"] != pristine
        resp = cpx.forward(client, sid, "api/project/reset", {"graceful_termination_timeout": 0.5})
        assert resp.status_code == 200 and resp.json()["status"] == "success", resp.text
        assert cpx.bash(client, sid, project)["stdout"] == pristine
        procs = cpx.bash(client, sid, "ps -eo pid=,args= | grep -v -e sandbox_server -e 'ps -eo' -e grep")["stdout"]
        assert [line for line in procs.splitlines() if not line.split()[0] == "1"] == [], procs
    finally:
        cpx.http.request("DELETE", "/api/clients", json={"client_id": client})


def test_execute_on_the_control_plane_leaves_nothing(cpx: Any) -> None:
    """``POST /execute`` runs in namespaces of its own on a long-lived runner sandbox: a daemon
    it leaves is killed once the answer is back, its files are gone, and the next run starts clean
    without a sandbox per request.

    Can fail: with the runner's runs not isolated (``CodeRunner._isolation`` returning None in a
    scratch copy) the daemon outlived its run and the next run found /tmp/left.
    """
    sandboxes = cpx.state_dir / "sandboxes"

    def runners() -> set[str]:  # the code runner's sandboxes
        return {n for n in os.listdir(sandboxes) if n.startswith("runner-")}

    marker = f"idegym-daemon-{os.getpid()}-{time.monotonic_ns()}"
    code = (f"import subprocess; subprocess.Popen(['bash', '-c', 'exec -a {marker} sleep 600'], "
            "start_new_session=True); open('/tmp/left', 'w').write('x'); print('ok')")
    first = cpx.http.post("/execute", json={"language": "python", "code": code})
    assert first.status_code == 200 and first.json()["stdout"] == "ok\n", first.text
    after_first = runners()
    second = cpx.http.post("/execute", json={"language": "python",
                                             "code": "import os; print(os.path.exists('/tmp/left'))"})
    assert second.json()["stdout"] == "False\n"
    assert runners() == after_first and len(after_first) == 1, (after_first, runners())  # one runner, reused
    assert wait_for(lambda: not [p for p in os.listdir("/proc") if p.isdigit() and marker.encode() in _cmdline(p)],
                    10), "the run's daemon outlived it"


def test_execute_runs_are_held_to_the_tools_limits(cpx: Any) -> None:
    """An isolated run on the runner sandbox lives below the tools' delegated cgroups (the
    sandbox's memory and pids limits for tools hold it, the server keeps its reserve), and the
    cgroup files are hidden from it.

    Can fail: with the zygote not joining the tools' groups (``_Zygote.__init__`` skipping its
    join in a scratch copy) the run was in the server's groups.
    """
    code = ("import os\nprint([l.split(':')[2].strip() for l in open('/proc/self/cgroup') if ':pids:' in l][0])\n"
            "print(os.listdir('/run/idegym-cgroup/tools') if os.path.isdir('/run/idegym-cgroup/tools') else '-')\n")
    body = cpx.http.post("/execute", json={"language": "python", "code": code}).json()
    assert body.get("exitCode") == 0 and len(body["stdout"].splitlines()) == 2, body
    group, tools = body["stdout"].splitlines()
    if group == "/":
        pytest.skip("no cgroups on this host")
    assert "/tools/" in group + "/", group
    assert tools in ("[]", "-"), tools


def _limit_hits(root: Path) -> int:
    """Forks refused by a pids limit anywhere in ``root``'s tree (v1 ``pids.events``)."""
    hits = 0
    for events in root.rglob("pids.events"):
        try:
            hits += int(events.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return hits


def test_one_execute_run_s_fork_bomb_never_keeps_another_from_starting(cpx: Any) -> None:
    """Each isolated run has a pids limit of its own (and the runner room for every run at its
    limit): a run that starts processes until it is refused stops at its own limit, and another
    client's run beside it starts and answers as usual.

    Can fail: it did on main, where runs shared the tools' pids limit: the bomb took all of it
    (~1000 processes) and the other run answered 126 (``EAGAIN: could not start the isolated run``).
    """
    from control_plane.backends.local.cgroups import controller_mounts
    from control_plane.backends.local.layout import state_key
    from sandbox_server.jail import RUN_PIDS_MAX

    pids = controller_mounts().get("pids")
    if pids is None:
        pytest.skip("no cgroup v1 pids controller on this host")
    assert cpx.http.post("/execute", json={"language": "python", "code": "print(1)"}).json()["exitCode"] == 0
    sandboxes = pids / "idegym" / state_key(cpx.state_dir)
    before = _limit_hits(sandboxes)
    bomb = ("import os, time\nn = 0\ntry:\n    while n < 5000:\n"
            "        os.posix_spawn('/bin/sleep', ['sleep', '60'], {})\n        n += 1\n"
            "except OSError as exc:\n    print(n, exc.errno, flush=True)\ntime.sleep(6)\n")
    answers: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answers.append(cpx.http.post(
        "/execute", json={"language": "python", "code": bomb, "timeout": 30}, timeout=60)))
    thread.start()
    try:
        assert wait_for(lambda: _limit_hits(sandboxes) > before, 30), "the bomb never reached a pids limit"
        other = cpx.http.post("/execute", json={"language": "python", "code": "print('other run')"}).json()
        assert other["exitCode"] == 0 and other["stdout"] == "other run\n", other
    finally:
        thread.join(60)
    body = answers[0].json()
    started, error = body["stdout"].split()
    assert int(error) == 11 and int(started) < RUN_PIDS_MAX, body  # EAGAIN at its own limit


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


# -- reward integrity -------------------------------------------------------------------------------


def test_test_reward_counts_only_reports_this_run_wrote(loop: LoopThread, backend: LocalBackend, image: str) -> None:
    """A report planted before the check, hard-linked or symlinked to where the real one will
    be, cannot add to the scores; a report that is a FIFO does not hang the server.

    Can fail: with freshness judged by (inode, ctime), the hard link to the replaced report
    (its ctime moves when the harness renames over the original) added the 50 planted passes;
    the symlink counted the real report twice; the FIFO blocked the server's event loop.
    """
    h = _create(loop, backend, "sec-reports", image)
    try:
        fake = '<testsuite tests="50">' + '<testcase name="fake"/>' * 50 + "</testsuite>"
        out(h, f"echo '{fake}' > test-results.xml; mkdir -p planted; ln test-results.xml planted/test-results.xml; "
               "touch -d 2100-01-01 planted/test-results.xml; ln -s ../test-results.xml planted/test-link.xml")
        real = '<testsuite tests="1"><testcase name="real"><failure/></testcase></testsuite>'
        script = f"echo '{real}' > .report.tmp && mv .report.tmp test-results.xml && mkfifo test-fifo.xml; exit 1"
        started = time.monotonic()
        resp = call(h, "/api/rewards/test", {"test_script": script, "report_glob": "test-*.xml", "timeout": 20},
                    timeout=30)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert time.monotonic() - started < 10
        assert body["scores"] == {"total": 1, "passed": 0, "failed": 1, "skipped": 0}, body
        assert h_alive(h)
    finally:
        loop.run(backend.delete(h))


@pytest.mark.parametrize("detach", ["setsid", "env-cleared"])
def test_a_checks_processes_end_with_it_on_the_seed_reward_endpoints(loop: LoopThread, backend: LocalBackend,
                                                                     image: str, detach: str) -> None:
    """A setup check runs project code (a ``pip install -e .``, a Makefile): a daemon it starts
    must not live on into the test check and turn its red report green. The check's processes
    end when it ends (``/api/rewards/setup``, ``/compilation``, ``/test``); a service the next
    checks need is an explicit opt-in (``keep_processes``), and the agent's own processes are
    not the check's.

    Can fail: on the ``specs/`` endpoints that ran a check like any tool call, the daemon survived
    ``/api/rewards/setup`` and the test check's 5 failures came back as ``{passed: 5}``.
    """
    h = _create(loop, backend, f"sec-check-daemon-{detach}", image)
    try:
        red = '<testsuite tests="5">' + '<testcase name="t"><failure/></testcase>' * 5 + "</testsuite>"
        green = '<testsuite tests="5">' + '<testcase name="t"/>' * 5 + "</testsuite>"
        # Turns the report green whenever it is red, forever; the second kind leaves the check's
        # environment (its call mark) and output pipes behind, as a careful daemon would.
        loop_body = ("while :; do grep -qs failure test-results.xml && cp /tmp/green.xml test-results.xml; "
                     "sleep 0.01; done")
        daemon = {"setsid": f"setsid bash -c '{loop_body}' &",
                  "env-cleared": f"setsid env -i PATH=/usr/bin:/bin bash -c '{loop_body}' </dev/null >/dev/null 2>&1 &"
                  }[detach]
        out(h, "sleep 600 &")  # the agent's own: no check ends it
        setup = call(h, "/api/rewards/setup", {"setup_check_script": f"echo '{green}' > /tmp/green.xml; {daemon} true"})
        assert setup.status_code == 200 and setup.json()["status"] == "success", setup.text
        left = out(h, "ps -eo args= | grep -c '[g]rep -qs failure' || true").strip()
        # The test check waits up to 2 s for its report to change under it.
        script = (f"echo '{red}' > test-results.xml; for i in $(seq 100); do grep -qs failure test-results.xml "
                  "|| break; sleep 0.02; done; exit 1")
        body = call(h, "/api/rewards/test", {"test_script": script, "report_glob": "test-*.xml"}).json()
        assert body["scores"] == {"total": 5, "passed": 0, "failed": 5, "skipped": 0}, body
        assert left == "0", f"{left} daemon(s) of the setup check outlived it"
        assert "sleep 600" in out(h, "ps -eo args="), "the agent's own process was ended by a check"
        # The opt-in: a service that the next checks use keeps running after its check.
        kept = call(h, "/api/rewards/setup", {"setup_check_script": "setsid sleep 300 & true", "keep_processes": True})
        assert kept.json()["status"] == "success", kept.text
        assert "sleep 300" in out(h, "ps -eo args="), "a check's service opted in with keep_processes was ended"
    finally:
        loop.run(backend.delete(h))


def test_checks_ignore_planted_config_reports_and_edits(cpx: Any) -> None:
    """The bundled Python task graded after every trick an agent can play before submitting
    scores exactly like the untouched project: a usercustomize.py that makes unittest pass
    everything, PATH shims and shell start-up files, a pre-written all-green report with hard
    links, an edited test runner, and a daemon that keeps rewriting the report.

    Can fail: before checks ran with a clean HOME and without the user site directory, the
    usercustomize.py turned every test green (reward 1.0); before reports were deduplicated
    the hard link doubled the counts.
    """
    from idegym_env.env import IdeGymEnv

    env = IdeGymEnv("python-roman-numerals", control_plane_url=cpx.url)
    try:
        env.reset(seed=0)
        _, untouched, *_, info = env.step({"tool": "submit", "arguments": {}})
        scores = info["checks"]["tests"]["scores"]
        assert untouched < 1.0 and scores["total"] == 8, info
        env.reset()
        green = '<testsuites><testsuite tests="8">' + '<testcase name="t"/>' * 8 + "</testsuite></testsuites>"
        attacks = [
            PERSIST_USER.replace('print("pwned")', "import unittest\n"
                                 "def _run(self, result=None):\n"
                                 "    result = result if result is not None else self.defaultTestResult()\n"
                                 "    result.startTest(self); result.addSuccess(self); result.stopTest(self)\n"
                                 "    return result\n"
                                 "unittest.TestCase.run = _run"),
            "echo 'alias python3=true' >> ~/.bashrc; echo 'export PYTHONPATH=/tmp/evil' >> ~/.profile",
            f"echo '{green}' > test-results.xml; mkdir -p r r2; ln test-results.xml r/test-results.xml; "
            "ln -s ../test-results.xml r2/test-results.xml",
            f"cat > tests/run_tests.py <<'EOF'\nopen('test-results.xml', 'w').write('{green}')\nEOF",
            f"echo '{green}' > /tmp/green.xml; (setsid bash -c 'while :; do cp /tmp/green.xml test-results.xml; "
            "sleep 0.01; done' </dev/null >/dev/null 2>&1 &)",
        ]
        for command in attacks:
            _, _, _, _, step = env.step({"tool": "bash", "arguments": {"command": command}})
            assert step.get("exit_code") == 0, (command, step)
        # The planted user site is live for the agent's own python3.
        obs, *_ = env.step({"tool": "bash", "arguments": {"command": "python3 -c 'import unittest; "
                                                                      "print(unittest.TestCase.run.__name__)'"}})
        assert obs.startswith("_run"), obs
        _, attacked, *_, info = env.step({"tool": "submit", "arguments": {}})
        assert attacked == untouched, info
        assert info["checks"]["tests"]["scores"] == scores, info["checks"]["tests"]
    finally:
        env.close()
