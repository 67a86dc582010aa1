"""The local backend with real processes: bubblewrap sandboxes, overlays, cgroups, images, snapshots.

Nothing is mocked. Most tests share one backend (one state directory, one event loop thread)
and a few sandboxes, to stay within the time budget; each test checks its own claim.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.backends.base import BackendError, ImageNotFound, Limits, SandboxHandle
from control_plane.backends.local import BUILTIN_IMAGE, LocalBackend, bwrap, local_notes, parse_images_yaml
from tests.helpers import wait_until
from tests.local_helpers import (
    LoopThread,
    bash,
    client,
    delete_sandboxes,
    leftovers,
    loop_thread,
    ok,
    spec,
    start_backend,
    stop_backend,
    wait_for,
    write_calc_project,
)

CAN_ISOLATE = os.geteuid() == 0 and shutil.which("bwrap") is not None
needs_bwrap = pytest.mark.skipif(not CAN_ISOLATE, reason="needs root and bubblewrap")
MiB = 1 << 20
DIGEST = ("find . -printf '%y %m %U %G %T@ %p %l\\n' | LC_ALL=C sort; "
          "find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum")


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    yield from loop_thread()


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("local")


@pytest.fixture(scope="module")
def backend(loop: LoopThread, state: Path) -> Iterator[LocalBackend]:
    if not CAN_ISOLATE:
        pytest.skip("needs root and bubblewrap")
    b = start_backend(loop, state)
    yield b
    delete_sandboxes(loop, b)
    loop.run(b.close())


@pytest.fixture(scope="module")
def project_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("proj") / "calc"
    write_calc_project(root)
    os.symlink("src/calc.py", root / "link.py")
    return root


@pytest.fixture(scope="module")
def calc_image(backend: LocalBackend, project_dir: Path) -> str:
    return backend.register_project("test/calc:1", project_dir)


@pytest.fixture(scope="module")
def sb_user(loop: LoopThread, backend: LocalBackend, calc_image: str) -> Iterator[SandboxHandle]:
    h = loop.run(backend.create(spec("sb-user", calc_image), 60))
    yield h
    loop.run(backend.delete(h))


@pytest.fixture(scope="module")
def sb_root(loop: LoopThread, backend: LocalBackend) -> Iterator[SandboxHandle]:
    h = loop.run(backend.create(spec("sb-root", root=True), 60))
    yield h
    loop.run(backend.delete(h))


@pytest.fixture(scope="module")
def sb_limited(loop: LoopThread, backend: LocalBackend) -> Iterator[SandboxHandle]:
    backend.pids_max = 64
    try:
        # root inside, so that the storage test can also write to /usr (root is still held by the limits)
        h = loop.run(backend.create(spec("sb-limited", root=True, limits=Limits(memory_bytes=256 * MiB,
                                                                      storage_bytes=64 * MiB)), 60))
    finally:
        backend.pids_max = 1024
    yield h
    loop.run(backend.delete(h))


# -- basics ------------------------------------------------------------------------------------------


def test_tools_run_as_appuser_in_the_project(sb_user: SandboxHandle, loop: LoopThread, backend: LocalBackend) -> None:
    with client(sb_user) as c:
        assert c.get("/api/health").status_code == 200
    out = ok(sb_user, "id -u; id -g; pwd; echo $HOME; ls; stat -c '%U %a' . src/calc.py")
    assert out.splitlines() == ["1000", "1000", "/home/appuser/work", "/home/appuser",
                                "README.md", "link.py", "run.sh", "src", "appuser 755", "appuser 644"]
    # The host's toolchains are there, from neutral paths.
    out = ok(sb_user, "python3 --version; node --version; gcc --version | head -1; javac -version 2>&1; "
                      "command -v rustc; bash --version | head -1")
    assert "Python 3" in out and out.count("\n") >= 5
    obs = loop.run(backend.observe(sb_user))
    assert obs.running and obs.ready and obs.exists


def test_run_as_root_is_root_inside_only(sb_root: SandboxHandle, sb_user: SandboxHandle) -> None:
    out = ok(sb_root, "id -u; cat /proc/self/uid_map; grep CapEff /proc/self/status")
    lines = out.split("\n")
    assert lines[0] == "0"
    assert lines[1].split() == ["0", "0", "65536"]
    # Root's capabilities belong to the sandbox's user namespace: the host's uid_map is different.
    assert Path("/proc/self/uid_map").read_text().split() == ["0", "0", "4294967295"]
    # The read-only runtime cannot be remounted writable (locked mounts).
    result = bash(sb_root, "mount -o remount,rw /opt/idegym/python && echo REMOUNTED; "
                           "touch /opt/idegym/python/x && echo WROTE; umount /etc && echo UNMOUNTED")
    assert "REMOUNTED" not in result["stdout"] and "WROTE" not in result["stdout"]
    assert "UNMOUNTED" not in result["stdout"]
    # ps shows only the sandbox's own processes.
    procs = ok(sb_root, "ps -eo pid=,comm=").split("\n")
    assert [p for p in procs if p.strip()] and all(int(p.split()[0]) < 100 for p in procs if p.strip())


@pytest.mark.security
def test_root_inside_sees_nothing_of_the_host(sb_root: SandboxHandle, sb_user: SandboxHandle, state: Path,
                                              tmp_path: Path) -> None:
    marker = f"idegym-marker-{os.getpid()}"
    host_files = [Path("/root") / marker, Path("/tmp") / marker]
    for f in host_files:
        f.write_text("secret")
    try:
        ok(sb_user, f"echo other > /tmp/{marker}-other; echo other > {marker}-other")
        script = (f"ls -a /root; test -e /root/{marker} && echo SEEN-ROOT; test -e /tmp/{marker} && echo SEEN-TMP; "
                  f"test -e /work && echo SEEN-WORK; test -e {state} && echo SEEN-STATE; "
                  f"test -e /root/.pyenv -o -e /root/.cargo && echo SEEN-HOME; test -e /sys/kernel && echo SEEN-SYS; "
                  f"find / -xdev -name '{marker}*' 2>/dev/null; "
                  f"find /tmp /home /opt /run -name '{marker}*' 2>/dev/null; "
                  f"cat /etc/shadow; grep -c . /etc/passwd; ls /home; ls /etc/ssh 2>/dev/null")
        out = ok(sb_root, script)
        assert "SEEN" not in out, out
        assert marker not in out, out
        assert "$" not in out.split("\n", 1)[0]  # /root is a skeleton
        shadow = [line for line in out.splitlines() if line.startswith("root:")]
        assert shadow and all(":*:" in line or line.startswith("root:x:") for line in shadow)
        assert "appuser" in out and "cloudsdk" not in out  # host users >= 1000 are not there
        assert not any("ssh_host" in line for line in out.splitlines())
    finally:
        for f in host_files:
            f.unlink()


@pytest.mark.security
def test_system_writes_land_in_the_sandbox_layer(sb_root: SandboxHandle, sb_user: SandboxHandle) -> None:
    probe = f"idegym-probe-{os.getpid()}"
    ok(sb_root, f"touch /usr/{probe} && mkdir -p /usr/local/lib/python3.11/dist-packages/{probe} "
                f"&& mkdir -p /var/lib/dpkg/{probe} && echo x >> /etc/{probe} && touch /opt/{probe}")
    layers = Path(sb_root.data["dir"]) / "layers"
    assert (layers / "usr" / "upper" / probe).exists()
    assert (layers / "usr" / "upper" / "local" / "lib" / "python3.11" / "dist-packages" / probe).is_dir()
    assert (layers / "var" / "upper" / "lib" / "dpkg" / probe).is_dir()
    assert (layers / "etc" / "upper" / probe).exists()
    for host in (f"/usr/{probe}", f"/usr/local/lib/python3.11/dist-packages/{probe}", f"/var/lib/dpkg/{probe}",
                 f"/etc/{probe}", f"/opt/{probe}"):
        assert not os.path.exists(host), host
    # Another sandbox from the same image does not see them either.
    assert bash(sb_user, f"test -e /usr/{probe}")["exit_code"] == 1
    # appuser's pip --user style writes stay in its home layer.
    ok(sb_user, f"mkdir -p ~/.local/lib/{probe} && python3 -c 'import site; print(site.USER_SITE)'")
    assert (Path(sb_user.data["dir"]) / "layers" / "home" / "upper" / "appuser" / ".local" / "lib" / probe).is_dir()
    assert bash(sb_user, f"touch /usr/{probe}")["exit_code"] != 0  # appuser is not root


@pytest.mark.security
def test_root_inside_cannot_redirect_the_host_side(loop: LoopThread, backend: LocalBackend,
                                                   sb_user: SandboxHandle) -> None:
    h = loop.run(backend.create(spec("sb-evil", root=True), 60))
    try:
        other = str(Path(sb_user.data["run_dir"]) / "server.sock")
        # Swap the socket for a link to another sandbox's: the control plane still reaches this one.
        ok(h, f"touch /root/evil-marker && rm /run/idegym/server.sock && ln -s {other} /run/idegym/server.sock")
        assert ok(h, "test -e /root/evil-marker && echo mine") == "mine\n"
        # Swap the project layer for a link to the host's root: a snapshot must not copy the host.
        # (Root tools cannot unmount the project: they have no CAP_SYS_ADMIN. The layer is theirs.)
        ok(h, "mv /opt/idegym/layer/upper /opt/idegym/layer/old && ln -s / /opt/idegym/layer/upper")
        with pytest.raises(BackendError):
            loop.run(backend.snapshot(h, "evil"))
        assert not any(p.name.startswith("evil") for p in backend.snapshots.root.iterdir())
    finally:
        loop.run(backend.delete(h))
    assert leftovers(h) == []
    assert Path("/etc/passwd").exists() and Path("/usr/bin").is_dir()  # the host is intact


def test_network_is_off_by_default(sb_user: SandboxHandle, loop: LoopThread, state: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    accepted: list[int] = []

    def serve() -> None:
        try:
            while True:
                conn, _ = listener.accept()
                accepted.append(1)
                conn.close()
        except OSError:
            return

    threading.Thread(target=serve, daemon=True).start()
    probe = (f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); "
             "print('CONNECTED')\"")
    try:
        result = bash(sb_user, probe + "; ls /sys/class/net 2>/dev/null; cat /proc/net/dev")
        assert "CONNECTED" not in result["stdout"]
        assert "Connection refused" in result["stderr"]
        assert not accepted
        ifaces = [line.split(":")[0].strip() for line in result["stdout"].splitlines() if ":" in line]
        assert ifaces == ["lo"]
        # With the network allowed, still not the host's loopback (user-mode networking, usernet.py).
        net = LocalBackend(state, isolation="bwrap", network=True)
        loop.run(net.start())
        h = loop.run(net.create(spec("sb-net"), 60))
        try:
            assert "CONNECTED" not in bash(h, probe)["stdout"]
            assert not accepted
        finally:
            loop.run(net.delete(h))
            loop.run(net.close())
    finally:
        listener.close()


# -- limits ------------------------------------------------------------------------------------------


def test_memory_limit_ends_a_memory_bomb(sb_limited: SandboxHandle) -> None:
    result = bash(sb_limited, "python3 -c \"b = b'x' * (1 << 30); print(len(b))\"")
    assert result["exit_code"] == 137, result
    with client(sb_limited) as c:
        assert c.get("/api/health").status_code == 200
    memory = sb_limited.data["cgroups"]["memory"]
    assert Path(memory, "memory.limit_in_bytes").read_text().strip() == str(256 * MiB)


def _pids_events(group: str) -> int:
    """Forks refused by the pids cap anywhere in a sandbox's groups (kernels count them in the
    group that hit its cap, or in the forking one)."""
    return sum(int(Path(root, "pids.events").read_text().split()[1]) for root, _, _ in os.walk(group))


def test_pids_limit_stops_a_fork_bomb(sb_limited: SandboxHandle) -> None:
    pids = sb_limited.data["cgroups"]["pids"]
    tools = Path(pids, "tools")  # the tools' group: the sandbox's cap minus the server's reserve
    assert Path(pids, "pids.max").read_text().strip() == "64"
    assert int(Path(tools, "pids.max").read_text()) < 64
    peak = [0]

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], int(Path(pids, "pids.current").read_text()))
            time.sleep(0.01)

    done = threading.Event()
    threading.Thread(target=watch, daemon=True).start()
    try:
        # The bomb detaches from the call; it keeps forking in the background, capped at 64. Each
        # copy forks forever (a failed fork is retried), so it cannot die out before the reset.
        bash(sb_limited, "bomb() { while :; do bomb & done; }; bomb >/dev/null 2>&1 &", timeout=10)
        assert wait_for(lambda: _pids_events(pids) > 100, 10)
        with client(sb_limited) as c:  # the server stays responsive (a request needs no fork)
            assert c.get("/api/health").status_code == 200
            # A reset ends every process the tools started, the bomb included.
            result = c.post("/api/project/reset", json={"graceful_termination_timeout": 0.5}).json()
        assert result["status"] == "success" and result["killed_processes"] > 10
    finally:
        done.set()
    assert 30 < peak[0] <= 64, peak
    # Left in the tools' group: the server's spawner thread (it starts the tools from there), and the
    # tool user's spawner (kept: the bomb changed nothing of it).
    assert wait_for(lambda: int(Path(tools, "pids.current").read_text()) <= 2, 10), \
        Path(tools, "pids.current").read_text()
    assert ok(sb_limited, "echo alive").strip() == "alive"


def test_storage_limit_gives_enospc(sb_limited: SandboxHandle) -> None:
    result = bash(sb_limited, "dd if=/dev/zero of=big bs=1M count=100 2>&1; rm -f big; "
                              "dd if=/dev/zero of=/tmp/big bs=1M count=100 2>&1; rm -f /tmp/big; "
                              "dd if=/dev/zero of=/usr/big bs=1M count=100 2>&1")
    assert result["stdout"].count("No space left on device") == 3, result
    assert Path(sb_limited.data["dir"], "layers").is_mount()


# -- reset, observe, delete ------------------------------------------------------------------------


def test_reset_restores_the_project_and_kills_tools(sb_user: SandboxHandle, backend: LocalBackend,
                                                     calc_image: str) -> None:
    pristine = backend.store.resolve(calc_image).project
    expected = subprocess.run(["bash", "-c", DIGEST], cwd=pristine, capture_output=True, text=True).stdout
    with client(sb_user) as c:  # earlier tests wrote here
        assert c.post("/api/project/reset", json={}).json()["status"] == "success"
    assert ok(sb_user, DIGEST) == expected
    ok(sb_user, "echo changed >> README.md && rm src/calc.py && mkdir -p new/dir && echo n > new/dir/f "
                "&& chmod 700 src && rm link.py && ln -s README.md link.py && truncate -s 0 src/deep/data.bin "
                "&& chmod 777 . && echo keep > /tmp/keep-me "
                "&& (setsid nohup sleep 1000 >/dev/null 2>&1 &) && (sleep 999 >/dev/null 2>&1 &)")
    assert ok(sb_user, DIGEST) != expected
    assert "sleep 1000" in ok(sb_user, "ps -eo args")
    with client(sb_user) as c:
        result = c.post("/api/project/reset", json={}).json()
    assert result["status"] == "success", result
    assert result["killed_processes"] >= 2
    assert ok(sb_user, DIGEST) == expected
    assert "sleep" not in ok(sb_user, "ps -eo args")
    assert ok(sb_user, "cat /tmp/keep-me; touch new-file && echo writable") == "keep\nwritable\n"
    with client(sb_user) as c:
        assert c.post("/api/project/reset", json={}).json()["status"] == "success"


def test_killed_from_outside_is_observed(loop: LoopThread, backend: LocalBackend) -> None:
    h = loop.run(backend.create(spec("sb-killed"), 60))
    try:
        obs = loop.run(backend.observe(h))
        assert obs.running and obs.ready
        os.kill(h.data["server"][0], signal.SIGKILL)
        assert wait_for(lambda: not loop.run(backend.observe(h)).running, 5)
        obs = loop.run(backend.observe(h))
        assert obs.exists and not obs.ready and obs.phase == "Failed"
        assert "gone" in (obs.reason or "")
    finally:
        loop.run(backend.delete(h))
    assert leftovers(h) == []
    assert not loop.run(backend.observe(h)).exists


def test_delete_leaves_nothing(loop: LoopThread, backend: LocalBackend) -> None:
    h = loop.run(backend.create(spec("sb-delete", root=True, limits=Limits(memory_bytes=512 * MiB,
                                                                          storage_bytes=64 * MiB,
                                                                          cpu_millicores=500)), 60))
    # A stopped process too: it must not keep the freezer from letting the kill through.
    # A mount inside too (root tools have no CAP_SYS_ADMIN: in a user namespace of their own).
    ok(h, "(setsid nohup sleep 1000 >/dev/null 2>&1 &); (sleep 999 &); (sleep 998 & kill -STOP $!); "
          "(setsid unshare -Urm sh -c 'mount -t tmpfs inner /mnt && echo data > /mnt/f && exec sleep 997' "
          ">/dev/null 2>&1 &); echo file > /usr/file")
    freezer = h.data["cgroups"]["freezer"]
    server = h.data["server"][0]
    pid_ns = os.readlink(f"/proc/{server}/ns/pid")
    assert len([p for p in os.scandir("/proc") if p.name.isdigit() and _in_ns(p.name, pid_ns)]) >= 4
    assert Path(h.data["dir"], "layers").is_mount()
    assert all(os.path.isdir(p) for p in h.data["cgroups"].values())
    assert h.data["dir"] in Path("/proc/self/mountinfo").read_text()  # the storage-bounded tmpfs
    started = time.monotonic()
    loop.run(backend.delete(h))
    assert time.monotonic() - started < 5
    assert leftovers(h, pid_ns) == []
    assert not os.path.exists(freezer)
    loop.run(backend.delete(h))  # idempotent
    assert "sb-delete" not in loop.run(backend.list_names())


def test_a_sandbox_is_born_in_its_groups(loop: LoopThread, backend: LocalBackend) -> None:
    """Bubblewrap starts in the sandbox's server groups (the launching thread joins them for that
    instant, by its own ``tasks``), so its init is never moved there by pid: such a move waits
    for an RCU grace period, and every fork and exit on the host waits with it. The launching
    thread is back in the control plane's groups afterwards.

    Can fail: on main bubblewrap started in the control plane's groups and its init was moved
    (``readiness.attach``: 10 ms of each create's wall time, measured)."""
    h = loop.run(backend.create(spec("sb-born"), 60))
    try:
        monitor, init = h.data["monitor"][0], h.data["init"][0]
        for controller, path in h.data["cgroups"].items():
            procs = Path(path, "server", "cgroup.procs").read_text().split()
            assert str(monitor) in procs and str(init) in procs, (controller, procs)
        own = Path("/proc/self/cgroup").read_text()
        for thread in os.listdir("/proc/self/task"):
            assert Path(f"/proc/self/task/{thread}/cgroup").read_text() == own, thread
    finally:
        loop.run(backend.delete(h))


def test_a_launch_held_up_in_its_spawn_holds_up_no_other(loop: LoopThread, backend: LocalBackend) -> None:
    """Spawns run on several launch threads: one held up before bubblewrap has started (here its
    server group is frozen before the launch, so the launching thread freezes as it joins the
    group to start bubblewrap there) does not hold up another start; it goes on once thawed.

    Can fail: on main every spawn ran on one launch thread, so the second start waited for the
    first (hurried warm-pool fills queued there: 18 ms p50, 65 ms p90, 4 at once)."""
    cg = backend.sandboxes.cgroups
    if "freezer" not in cg.mounts:
        pytest.skip("needs the cgroup freezer")
    server = Path(cg.paths("sb-held-up")["freezer"], "server")
    server.mkdir(parents=True)
    (server / "freezer.state").write_text("FROZEN")
    held_up = asyncio.run_coroutine_threadsafe(backend.create(spec("sb-held-up"), 120), loop.loop)
    other = None
    try:
        # The launching thread (of this process) froze in the group: the first launch is in its spawn.
        assert wait_until(lambda: (server / "tasks").read_text().strip() != "", 60)
        assert set((server / "tasks").read_text().split()) <= set(os.listdir("/proc/self/task"))
        other = loop.run(backend.create(spec("sb-not-held-up"), 60), timeout=60)
        assert ok(other, "echo up") == "up\n"
        assert not held_up.done()
        (server / "freezer.state").write_text("THAWED")
        assert ok(held_up.result(120), "echo thawed") == "thawed\n"
    finally:
        (server / "freezer.state").write_text("THAWED")
        for h in (held_up.result(120), other):
            if h is not None:
                loop.run(backend.delete(h))


def _in_ns(pid: str, ns: str) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") == ns
    except OSError:
        return False


def test_orphans_are_listed_adopted_and_deleted_by_name(loop: LoopThread, backend: LocalBackend,
                                                        state: Path) -> None:
    # A sandbox made by an earlier control plane (another backend object on the same state dir).
    previous = LocalBackend(state, isolation="bwrap")
    loop.run(previous.start())
    h = loop.run(previous.create(spec("sb-orphan"), 60))
    loop.run(previous.close())
    # Adoption: everything needed is in the handle's data.
    assert loop.run(backend.observe(h)).running
    assert ok(h, "echo adopted") == "adopted\n"
    # A half-created one: a directory and cgroups, no process.
    half = state / "sandboxes" / "sb-half"
    (half / "layers").mkdir(parents=True)
    for path in backend.sandboxes.cgroups.paths("sb-half").values():
        os.makedirs(path)
    names = loop.run(backend.list_names())
    assert {"sb-orphan", "sb-half"} <= names
    loop.run(backend.delete_name("sb-orphan"))
    loop.run(backend.delete_name("sb-half"))
    loop.run(backend.delete_name("sb-half"))  # idempotent
    names = loop.run(backend.list_names())
    assert "sb-orphan" not in names and "sb-half" not in names
    assert leftovers(h) == []
    assert not half.exists()
    assert not any(os.path.exists(p) for p in backend.sandboxes.cgroups.paths("sb-half").values())


CREATOR = """
import asyncio, json, sys, time
from control_plane.backends.local import LocalBackend
from tests.local_helpers import spec

async def main():
    b = LocalBackend(sys.argv[1], isolation="bwrap")
    await b.start()
    h = await b.create(spec("sb-survivor"), 60)
    print(json.dumps(h.to_json()), flush=True)
    time.sleep(600)

asyncio.run(main())
"""


def _in_group(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def _groups_procs(handle: SandboxHandle) -> list[str]:
    """The processes in every cgroup of the sandbox's tree."""
    found = []
    for path in handle.data["cgroups"].values():
        for root, _, _ in os.walk(path):
            found += Path(root, "cgroup.procs").read_text().split()
    return found


def test_a_retired_sandbox_is_killed_at_once_and_removed_after_a_quiet_moment(
        loop: LoopThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A retired sandbox (a restart's old one) has its processes SIGKILLed when ``retire``
    returns; the rest of it (directory, record, cgroups, its layer's mount) stays until a quiet
    moment, and the orphan sweep does not take it meanwhile. A delete of it removes it at once;
    close removes the others before it returns, however long they would still have waited.

    Can fail: on main there was no ``retire``: a delete nobody waited for (a restart's old
    sandbox's) waited for the processes to be gone and removed everything at once, beside the
    next episode's first calls."""
    from control_plane.backends.local import removals

    monkeypatch.setattr(removals, "QUIET", 3600.0)  # no quiet moment within the test
    monkeypatch.setattr(removals, "MAX_WAIT", 3600.0)
    b = start_backend(loop, tmp_path / "state")
    try:
        handles = [loop.run(b.create(spec(f"sb-retired-{i}"), 60)) for i in range(2)]
        for h in handles:
            ok(h, "(setsid nohup sleep 1000 >/dev/null 2>&1 &); echo x > /tmp/f")
            loop.run(b.retire(h))
            assert wait_for(lambda h=h: _groups_procs(h) == [] and not any(
                line.startswith(("monitor", "init", "server")) for line in leftovers(h)), 10), leftovers(h)
            assert Path(h.data["dir"], "layers").is_mount()
            assert all(os.path.isdir(p) for p in h.data["cgroups"].values())
        assert loop.run(b.list_names()) == set()  # not an orphan: its removal waits
        loop.run(b.delete_name("sb-retired-0"))
        assert leftovers(handles[0]) == []
        assert leftovers(handles[1]) != []
    finally:
        loop.run(b.close())
    assert leftovers(handles[1]) == []
    assert not list((tmp_path / "state" / "sandboxes").iterdir())


def test_a_retired_sandbox_whose_removal_fails_is_logged_and_left_to_the_sweep(
        loop: LoopThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A removal that fails after ``retire`` returned is not lost: it is logged with the reason,
    and what is left is listed again (the orphan sweep's retry), which removes it.

    Can fail: on main there was no ``retire``."""
    from control_plane.backends.local import removals, teardown

    def failing(*args: object, **kwargs: object) -> None:
        raise BackendError("deleting sandbox 'sb-unremoved' left something behind: a test's failure")

    monkeypatch.setattr(removals, "QUIET", 0.0)
    caplog.set_level(logging.WARNING)
    b = start_backend(loop, tmp_path / "state")
    try:
        h = loop.run(b.create(spec("sb-unremoved"), 60))
        monkeypatch.setattr(teardown, "destroy", failing)
        loop.run(b.retire(h))
        assert wait_for(lambda: "sb-unremoved" in loop.run(b.list_names()), 10)
        assert any("sb-unremoved" in r.getMessage() and "a test's failure" in r.getMessage() for r in caplog.records)
        monkeypatch.undo()
        loop.run(b.delete_name("sb-unremoved"))
        assert leftovers(h) == []
    finally:
        monkeypatch.undo()
        stop_backend(loop, b)


def test_the_warm_pool_s_own_deletes_are_retires(loop: LoopThread, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Members the warm pool sheds (its target fell) or deletes as it closes are deleted as a
    restart's old sandbox is: their processes SIGKILLed at once, the rest removed at a quiet
    moment, and before the backend's close returns.

    Can fail: on main the pool deleted them in full on the control plane's path (each waited for
    its processes to be gone, then removed its groups, mounts and files)."""
    from control_plane.backends.local import removals
    from control_plane.pool import WarmPool
    from control_plane.store import SQLiteStore

    monkeypatch.setattr(removals, "QUIET", 3600.0)  # no quiet moment within the test
    monkeypatch.setattr(removals, "MAX_WAIT", 3600.0)
    b = start_backend(loop, tmp_path / "state")
    store = SQLiteStore(tmp_path / "pool.db")
    pool = WarmPool(b, store, floor=2, ceiling=2)

    async def ready() -> list[SandboxHandle]:
        return [h for q in pool._ready.values() for h in q]

    async def watch() -> None:
        pool.watch(spec("pool"))

    async def shrink() -> None:
        pool.floor = 1
        await pool.maintain()
        await asyncio.gather(*pool._tasks)

    def retired(h: SandboxHandle) -> bool:
        return _groups_procs(h) == [] and not any(
            line.startswith(("monitor", "init", "server")) for line in leftovers(h))

    try:
        loop.run(watch())
        assert wait_for(lambda: len(loop.run(ready())) == 2, 60)
        members = loop.run(ready())
        loop.run(shrink())
        (shed,) = [h for h in members if h not in loop.run(ready())]
        assert wait_for(lambda: retired(shed), 10), leftovers(shed)
        assert Path(shed.data["dir"]).is_dir()  # its removal waits for a quiet moment
        loop.run(pool.close(delete_members=True))
        (kept,) = [h for h in members if h is not shed]
        assert wait_for(lambda: retired(kept), 10), leftovers(kept)
        assert Path(kept.data["dir"]).is_dir()
    finally:
        loop.run(pool.close(delete_members=True))
        loop.run(b.close())
        store.close()
    assert [leftovers(h) for h in members] == [[], []]


def test_sandboxes_outlive_a_killed_control_plane(loop: LoopThread, backend: LocalBackend, state: Path) -> None:
    from control_plane.backends.base import SandboxHandle as Handle
    from tests.helpers import REPO

    proc = subprocess.Popen([sys.executable, "-c", CREATOR, str(state)], cwd=REPO, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line, "the creator process failed"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the control plane dies hard, with its whole group
        proc.wait()
        proc.stdout.close()
    h = Handle.from_json(json.loads(line))
    assert wait_for(lambda: not _in_group(proc.pid), 10), "the creator's process group outlived SIGKILL"
    assert loop.run(backend.observe(h)).running
    assert ok(h, "echo survived") == "survived\n"
    loop.run(backend.delete(h))
    assert leftovers(h) == []


def test_failed_create_cleans_up_and_reports_the_server_log(loop: LoopThread, backend: LocalBackend,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from control_plane.backends.local.runtime import Runtime

    assert backend.runtime is not None
    # A server started afresh (no zygote): one that refuses to start, one that never gets ready.
    # (Every server kind's runtime is a Runtime of its own: the bootstrap is patched on the class.)
    monkeypatch.setattr(backend.launcher, "zygotes", False)
    with monkeypatch.context() as patched:
        patched.setattr(Runtime, "bootstrap", lambda *_: "raise SystemExit('idegym-test: the server refuses to start')")
        with pytest.raises(BackendError) as err:
            loop.run(backend.create(spec("sb-fail"), 30))
        assert "the server refuses to start" in err.value.message
        patched.setattr(Runtime, "bootstrap", lambda *_: "import time; time.sleep(30)")
        started = time.monotonic()
        with pytest.raises(BackendError) as err:
            loop.run(backend.create(spec("sb-slow"), 1.5))
        assert "ready" in err.value.message and time.monotonic() - started < 10
    # A server forked by the zygote that refuses its arguments.
    monkeypatch.setattr(backend.launcher, "zygotes", True)
    server_args = bwrap.server_args
    monkeypatch.setattr(bwrap, "server_args", lambda *a, **k: [*server_args(*a, **k), "--idegym-test-refused"])
    with pytest.raises(BackendError) as err:
        loop.run(backend.create(spec("sb-refused"), 30))
    assert "unrecognized arguments: --idegym-test-refused" in err.value.message
    names = loop.run(backend.list_names())
    assert not {"sb-fail", "sb-slow", "sb-refused"} & set(names)
    assert not (backend.state_dir / "sandboxes" / "sb-slow").exists()
    with pytest.raises(ImageNotFound) as err:
        loop.run(backend.create(spec("sb-none", "nope/missing:1"), 30))
    assert "register_project" in err.value.message and "build" in err.value.message


# -- snapshots and images ----------------------------------------------------------------------------


def test_snapshot_and_restore(loop: LoopThread, backend: LocalBackend, calc_image: str) -> None:
    h = loop.run(backend.create(spec("sb-snap", calc_image, root=True), 60))
    try:
        ok(h, "echo snap > snap.txt && rm src/calc.py && echo lib > /usr/local/lib/snap-lib "
              "&& rm /etc/debian_version && mkdir -p /home/appuser/.cache && echo c > /home/appuser/.cache/c")
        ok(h, "(sleep 1000 & kill -STOP $!)")  # a stopped task keeps the freezer from completing
        info = loop.run(backend.snapshot(h, "7"))
        assert Path(h.data["cgroups"]["freezer"], "freezer.state").read_text().strip() == "THAWED"
        assert info.snapshot_id.startswith("7-") and info.snapshot_tag == calc_image
        assert loop.run(backend.snapshot_exists(info.snapshot_id))
        assert ok(h, "echo still running") == "still running\n"  # thawed after the copy
    finally:
        loop.run(backend.delete(h))
    r = loop.run(backend.create(spec("sb-restored", calc_image, root=True, snapshot=info.snapshot_id), 60))
    try:
        out = ok(r, "cat snap.txt; test -e src/calc.py || echo no-calc; cat /usr/local/lib/snap-lib; "
                    "test -e /etc/debian_version || echo no-version; cat /home/appuser/.cache/c")
        assert out.split() == ["snap", "no-calc", "lib", "no-version", "c"]
        # A snapshot of a restored sandbox keeps both layers.
        ok(r, "echo second > /usr/local/lib/second")
        again = loop.run(backend.snapshot(r, "7"))
        loop.run(backend.delete_snapshot(info.snapshot_id))
        assert not loop.run(backend.snapshot_exists(info.snapshot_id))
        assert ok(r, "cat /usr/local/lib/snap-lib") == "lib\n"  # hard links outlive the snapshot
        # Reset goes back to the image's project, not the snapshot's.
        with client(r) as c:
            assert c.post("/api/project/reset", json={}).json()["status"] == "success"
        assert ok(r, "test -e snap.txt || echo gone; test -e src/calc.py && echo back").split() == ["gone", "back"]
    finally:
        loop.run(backend.delete(r))
    r2 = loop.run(backend.create(spec("sb-restored2", calc_image, snapshot=again.snapshot_id), 60))
    try:
        assert ok(r2, "cat /usr/local/lib/snap-lib /usr/local/lib/second snap.txt").split() == ["lib", "second",
                                                                                                  "snap"]
    finally:
        loop.run(backend.delete(r2))
        loop.run(backend.delete_snapshot(again.snapshot_id))
    with pytest.raises(BackendError):
        loop.run(backend.create(spec("sb-nosnap", calc_image, snapshot=info.snapshot_id), 30))


def test_register_project_makes_a_usable_image(loop: LoopThread, backend: LocalBackend, tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "hello.txt").write_text("hello\n")
    tag = backend.register_project("test/hello:latest", tmp_path / "p")
    (tmp_path / "p" / "hello.txt").write_text("changed on the host\n")  # the store has its own copy
    h = loop.run(backend.create(spec("sb-hello", tag), 60))
    try:
        assert ok(h, "cat hello.txt; stat -c %U hello.txt") == "hello\nappuser\n"
    finally:
        loop.run(backend.delete(h))
    with pytest.raises(BackendError):
        backend.register_project("Bad Tag", tmp_path / "p")


def test_yaml_build_makes_a_usable_image(loop: LoopThread, backend: LocalBackend, project_dir: Path) -> None:
    text = f"""
images:
  - name: built
    base: {BUILTIN_IMAGE}
    plugins:
      - type: project
        source: local
        path: {project_dir}
      - type: base-system
        packages: [curl]
    commands:
      - echo built > /opt/built.txt
      - echo "$FOO" >> README.md
      - mkdir -p /usr/local/lib/built && touch /usr/local/lib/built/mod.py
      - rm /etc/debian_version
    env: {{FOO: bar}}
    runtime_class_name: gvisor
    resources: {{limits: {{memory: 1Gi}}}}
  - name: built-on-top
    base: BASE
    commands: ["echo top > /opt/top.txt"]
"""
    first = parse_images_yaml(text)[0]
    assert first.tag.startswith("built:") and len(first.tag) == len("built:") + 12
    assert parse_images_yaml(text)[0].tag == first.tag  # deterministic
    notes = " ".join(local_notes(first.raw))
    assert "runtime_class_name" in notes and "base-system" in notes
    lines: list[str] = []
    builder = backend.image_builder()
    tag = loop.run(builder.build(first, lines.append), 300)
    assert tag == first.tag and loop.run(builder.exists(tag))
    assert any("runtime_class_name" in line for line in lines)
    second = parse_images_yaml(text.replace("BASE", tag))[1]
    tag2 = loop.run(builder.build(second, lines.append), 300)
    h = loop.run(backend.create(spec("sb-built", tag2), 60))
    try:
        out = ok(h, "cat /opt/built.txt /opt/top.txt; tail -1 README.md; echo $FOO; ls /usr/local/lib/built; "
                    "test -e /etc/debian_version || echo no-version; stat -c %U README.md")
        assert out.split() == ["built", "top", "bar", "bar", "mod.py", "no-version", "appuser"]
        with client(h) as c:
            assert c.post("/api/project/reset", json={}).json()["status"] == "success"
        assert ok(h, "tail -1 README.md") == "bar\n"  # the image's project includes the build's changes
    finally:
        loop.run(backend.delete(h))
    bad = parse_images_yaml("images:\n  - name: broken\n    commands: ['echo oops >&2; exit 3']\n")[0]
    with pytest.raises(BackendError) as err:
        loop.run(builder.build(bad, lines.append), 300)
    assert "exit code 3" in err.value.message and "oops" in err.value.message
    assert not loop.run(builder.exists(bad.tag))
    assert not any((backend.state_dir / "builds" / "sandboxes").iterdir())


def test_yaml_parsing_rules() -> None:
    defs = parse_images_yaml("""
images:
  - tag: my/explicit:1
    project: {git: https://example.invalid/r.git, ref: main}
  - name: Upper
    project:
      repository: {server: github.com, owner: o, name: r}
      reference: abc
    commands: |
      RUN echo one
      RUN echo two
    plugins:
      - type: permissions
        paths: {/home/appuser: {owner: appuser, mode: "755"}}
      - type: idegym-server
        source: git
""")
    assert defs[0].tag == "my/explicit:1" and defs[0].project == {"git": "https://example.invalid/r.git",
                                                                    "ref": "main"}
    assert defs[1].tag.startswith("upper:")
    assert defs[1].project == {"git": "https://github.com/o/r.git", "ref": "abc"}
    assert defs[1].commands == ["chown -R appuser:appuser /home/appuser", "chmod -R 755 /home/appuser",
                                "echo one", "echo two"]
    assert any("idegym-server" in n for n in local_notes(defs[1].raw))
    for bad in ("images: []", "nope: 1", "images:\n  - tag: 'Bad Tag'", "images:\n  - commands: 3",
                "images: [1]", ":"):
        with pytest.raises(ValueError):
            parse_images_yaml(bad)


# -- without bubblewrap ------------------------------------------------------------------------------


def test_no_isolation_mode_still_works(loop: LoopThread, tmp_path: Path, project_dir: Path,
                                       caplog: pytest.LogCaptureFixture) -> None:
    from control_plane.backends.local import isolation as module

    caplog.set_level(logging.WARNING)
    said_before = "isolation" in module._said
    plain = LocalBackend(tmp_path / "plain", isolation="none")
    loop.run(plain.start())
    other = LocalBackend(tmp_path / "plain", isolation="none")
    loop.run(other.start())
    loop.run(other.close())
    assert plain.isolation == "none"
    warnings = [r for r in caplog.records if "NOT ISOLATED" in r.getMessage()]
    assert len(warnings) == (0 if said_before else 1)  # one loud warning per process
    try:
        tag = plain.register_project("test/plain:1", project_dir)
        h = loop.run(plain.create(spec("sb-plain", tag), 60))
        try:
            assert ok(h, "cat README.md; pwd") == f"calc\n{h.data['dir']}/project\n"
            ok(h, "rm README.md; echo x > new; (setsid nohup sleep 1000 >/dev/null 2>&1 &)")
            with client(h) as c:
                result = c.post("/api/project/reset", json={}).json()
            assert result["status"] == "success" and result["killed_processes"] >= 1
            assert ok(h, "cat README.md; ls") == "calc\nREADME.md\nlink.py\nrun.sh\nsrc\n"
            assert loop.run(plain.observe(h)).running
            snap = loop.run(plain.snapshot(h, "1"))
        finally:
            loop.run(plain.delete(h))
        assert leftovers(h) == []
        r = loop.run(plain.create(spec("sb-plain2", tag, snapshot=snap.snapshot_id), 60))
        try:
            assert ok(r, "cat README.md") == "calc\n"
        finally:
            loop.run(plain.delete(r))
        assert loop.run(plain.list_names()) == set()
    finally:
        loop.run(plain.close())
