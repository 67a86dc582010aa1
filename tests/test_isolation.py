"""Hostile sandboxes and their neighbours (``docs/security.md`` §2): what one sandbox does to memory, CPU and
processes stays in its own cgroups, and ending it never depends on anything outside its records.

Real bubblewrap sandboxes of the local backend, real cgroups, real processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.backends.base import BackendError, Limits, SandboxHandle
from control_plane.backends.local import LocalBackend
from control_plane.backends.local.cgroups import CONTROLLERS, Cgroups, controller_mounts
from sandbox_server import procfs
from sandbox_server.spawner import SPAWNER
from tests.local_helpers import (
    LoopThread,
    bash,
    client,
    leftovers,
    loop_thread,
    ok,
    spec,
    start_backend,
    stop_backend,
    wait_for,
)

MiB = 1 << 20

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (bubblewrap sandboxes, cgroups)")


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    yield from loop_thread()


@pytest.fixture(scope="module")
def backend(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    b = start_backend(loop, tmp_path_factory.mktemp("iso") / "state", delete_timeout=12)
    yield b
    stop_backend(loop, b)


def _create(loop: LoopThread, backend: LocalBackend, name: str, **kw) -> SandboxHandle:
    return loop.run(backend.create(spec(name, **kw), 60))


# -- memory ----------------------------------------------------------------------------------------


@pytest.mark.security
def test_the_server_survives_whatever_its_tools_do_to_memory(loop: LoopThread, backend: LocalBackend) -> None:
    """Tools that make themselves the OOM killer's equals (``oom_score_adj`` 0) and fill the
    sandbox's memory with many processes, each smaller than the server, never take the server.

    Can fail: on main the server and its tools shared one memory group, the server was the
    largest process in it, and the OOM killer took it (the next call answered 410)."""
    h = _create(loop, backend, "iso-oom", limits=Limits(memory_bytes=256 * MiB))
    try:
        server = h.data["server"]
        hog = ("python3 -c \"import time; b = bytearray(24 << 20); b[::4096] = b'x' * len(b[::4096]); "
               "time.sleep(4)\"")
        result = bash(h, f"echo 0 > /proc/self/oom_score_adj; for i in $(seq 16); do {hog} & done; wait; "
                         "echo done", timeout=60)
        assert result["stdout"].strip().endswith("done"), result
        assert procfs.recorded_alive(server), "the sandbox server was killed"
        with client(h) as c:
            assert c.get("/api/health").status_code == 200
        assert ok(h, "echo alive") == "alive\n"
        assert loop.run(backend.observe(h)).running
    finally:
        loop.run(backend.delete(h))


# -- stages: fresh groups the server empties -----------------------------------------------------


@pytest.mark.security
def test_a_stage_runs_in_fresh_groups_that_are_emptied_when_it_ends(tmp_path: Path) -> None:
    """``Supervisor.stage``: every tool started inside the block is born in the stage's child
    groups, and when the block ends every process in them, ``setsid`` daemons included, is gone
    and so are the groups; tools outside a stage run in the tools' groups, and so does the tool
    user's spawner (born there: no move) and the tools it starts. Inside a stage, tools of the
    tool user start the long way (from the server), in the stage's groups."""
    mounts = controller_mounts()
    tools = {ctrl: mounts[ctrl] / f"idegym-test-stage-{os.getpid()}" for ctrl in CONTROLLERS if ctrl in mounts}
    links = tmp_path / "tools"
    links.mkdir()
    for ctrl, path in tools.items():
        path.mkdir()
        os.symlink(path, links / ctrl)
    # In a process of its own: a supervisor running as root drops CAP_SYS_ADMIN from its
    # process's bounding set (for its tools), which would cripple everything this one starts.
    scenario = f"""
import asyncio, json, os
from sandbox_server import procfs
from sandbox_server.spawner import SPAWNER
from sandbox_server.process import Supervisor
from sandbox_server.tool_cgroups import ToolCgroups
from sandbox_server.users import UserSpec

async def main():
    supervisor = Supervisor(tool_cgroups=ToolCgroups({str(links)!r}), spawners=True)
    supervisor.start()
    nobody = UserSpec.lookup("nobody")
    path = {{"PATH": "/usr/bin:/bin"}}
    try:
        plain = await supervisor.run(["cat", "/proc/self/cgroup"], cwd="/", env={{}}, timeout=10, grace=1,
                                     max_output=None)
        spawned = await supervisor.run(["sh", "-c", "echo $PPID; cat /proc/self/cgroup"], cwd="/", env=path,
                                       user=nobody, timeout=10, grace=1, max_output=None)
        spawner = int(spawned.stdout.text().splitlines()[0])
        spawner_groups = open(f"/proc/{{spawner}}/cgroup").read()
        async with supervisor.stage("check"):
            inside = await supervisor.run(["sh", "-c", "cat /proc/self/cgroup; setsid sleep 1000 & echo $!"],
                                          cwd="/", env={{}}, timeout=10, grace=1, max_output=None)
            daemon = int(inside.stdout.text().splitlines()[-1])
            ran = procfs.alive(daemon)
            staged = await supervisor.run(["sh", "-c", "echo $PPID; cat /proc/self/cgroup"], cwd="/", env=path,
                                          user=nobody, timeout=10, grace=1, max_output=None)
        print(json.dumps([plain.stdout.text(), inside.stdout.text(), ran, procfs.alive(daemon),
                          spawned.stdout.text(), spawner == os.getpid(), spawner_groups, staged.stdout.text()]))
    finally:
        supervisor.stop()

asyncio.run(main())
"""

    try:
        run = subprocess.run([sys.executable, "-c", scenario], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        plain, inside, daemon_ran, daemon_after, spawned, spawner_is_server, spawner, staged = json.loads(run.stdout)
        name = f"idegym-test-stage-{os.getpid()}"
        assert re.search(rf"pids:/{name}\n", plain), plain
        assert re.search(rf"pids:/{name}/check\n", inside), inside
        assert daemon_ran and not daemon_after
        if os.access(SPAWNER, os.X_OK):
            assert not spawner_is_server, spawned
            for groups in (spawned, spawner):
                assert all(re.search(rf"[:,]{ctrl}:/{name}\n", groups) for ctrl in tools), groups
        assert re.search(rf"pids:/{name}/check\n", staged) and staged.splitlines()[0] != spawned.splitlines()[0]
        assert not any((path / "check").exists() for path in tools.values())
    finally:
        for path in tools.values():
            if (path / "check").exists():
                (path / "check").rmdir()
            path.rmdir()



@pytest.mark.security
def test_grading_stages_run_in_fresh_groups_that_are_gone_after_them(loop: LoopThread, backend: LocalBackend) -> None:
    """``POST /api/grade`` runs each stage in ``Supervisor.stage``: a stage's processes are in a
    child group of the tools' delegated groups named after it, its ``setsid`` daemon is gone when
    the grade answers, and so is the group on the host.

    Can fail: grading that only killed the server's descendants ran its stages in the tools'
    groups themselves (no ``/setup`` group in ``/proc/self/cgroup``)."""
    h = _create(loop, backend, "iso-grade")
    try:
        script = "cat /proc/self/cgroup; setsid sleep 1000 >/dev/null 2>&1 & echo daemon=$!; exit 1"
        with client(h) as c:
            resp = c.post("/api/grade", json={"stages": [{"name": "setup", "script": script, "timeout": 30}]})
        assert resp.status_code == 200, resp.text
        output = resp.json()["setup"]["output"]
        assert re.search(r"\bpids:\S*/setup\n", output), output
        assert resp.json()["errors"] == [], resp.json()
        assert ok(h, "ps -eo args | grep -c '^sleep 1000' || true").strip() == "0"
        for ctrl, path in h.data["cgroups"].items():
            assert not os.path.exists(os.path.join(path, "tools", "delegated", "setup")), ctrl
    finally:
        loop.run(backend.delete(h))

# -- ending a sandbox ---------------------------------------------------------------------------------


class _ProcOpens:
    """Every ``/proc`` path opened or listed in this process while active (a Python audit hook:
    hooks cannot be removed, so one instance is installed once and switched on and off)."""

    _instance: _ProcOpens | None = None

    def __init__(self) -> None:
        self.active = False
        self.seen: list[str] = []
        sys.addaudithook(self._hook)

    @classmethod
    def get(cls) -> _ProcOpens:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def _hook(self, event: str, args: tuple) -> None:
        if self.active and event in ("open", "os.scandir", "os.listdir") and args and args[0] is not None:
            path = os.fsdecode(args[0]) if isinstance(args[0], (str, bytes, os.PathLike)) else str(args[0])
            if path.startswith("/proc"):
                self.seen.append(path)


@pytest.mark.security
def test_ending_a_sandbox_reads_only_its_own_records(loop: LoopThread, backend: LocalBackend,
                                                     tmp_path: Path) -> None:
    """A delete finds the sandbox's processes from its cgroups and recorded pids: it never lists
    ``/proc`` nor reads another process's ``cmdline`` (one stuck in the kernel hung every delete
    of the control plane), and a process outside the sandbox that merely names its directory is
    left alone.

    Can fail: on main the delete read every process's ``/proc/<pid>/cmdline`` and killed every
    process whose command line mentioned the sandbox's directory."""
    h = _create(loop, backend, "iso-records")
    ok(h, "(setsid sleep 1000 >/dev/null 2>&1 &); sleep 1000 >/dev/null 2>&1 &")
    bystander = subprocess.Popen(["sh", "-c", "sleep 1000; :", "bystander", f"{h.data['dir']}/",
                                  f"{h.data['run_dir']}/"], start_new_session=True)
    audit = _ProcOpens.get()
    try:
        audit.seen.clear()
        audit.active = True
        try:
            loop.run(backend.delete(h))
        finally:
            audit.active = False
        others = sorted({p for p in audit.seen if p == "/proc" or p.rstrip("/").endswith(("cmdline", "environ"))})
        assert others == [], others
        assert bystander.poll() is None, "a process outside the sandbox was killed"
    finally:
        os.killpg(bystander.pid, signal.SIGKILL)  # its sleep too: killing sh alone left it to init
        bystander.wait()
    assert leftovers(h) == []


def _freeze_elsewhere(pid: int, group: Path) -> None:
    """Move ``pid`` into a freezer group of the test's and freeze it: like a process stuck in the
    kernel, it cannot die until thawed (SIGKILL stays pending)."""
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(pid))
    (group / "freezer.state").write_text("FROZEN")
    assert wait_for(lambda: (group / "freezer.state").read_text().strip() == "FROZEN", 5)


@pytest.mark.security
def test_a_stuck_delete_is_bounded_and_never_delays_another(loop: LoopThread, backend: LocalBackend) -> None:
    """A sandbox with a process that cannot die (frozen outside its groups, as if stuck in the
    kernel) fails to delete within the backend's bound, saying which process in which state,
    while a neighbour deleted at the same time goes at once; once the process can die, deleting
    again (the watcher's retry) removes everything.

    Can fail: on main a delete waited up to 16 s for such a process, and its reason did not say
    what the process was doing."""
    freezer = controller_mounts().get("freezer")
    if freezer is None:
        pytest.skip("no freezer controller")
    stuck, other = _create(loop, backend, "iso-stuck"), _create(loop, backend, "iso-neighbour")
    group = freezer / f"idegym-test-stuck-{os.getpid()}"
    try:
        ok(stuck, "sleep 1000 >/dev/null 2>&1 &")
        def sleepers() -> list[int]:
            procs = [int(p) for root, _, _ in os.walk(stuck.data["cgroups"]["pids"])
                     for p in Path(root, "cgroup.procs").read_text().split()]
            return [p for p in procs if Path(f"/proc/{p}/comm").read_text().strip() == "sleep"]

        assert wait_for(sleepers, 5)
        victim = sleepers()[0]
        _freeze_elsewhere(victim, group)

        async def both() -> tuple[float | BaseException, float | BaseException]:
            async def timed(h: SandboxHandle) -> float:
                started = time.monotonic()
                await backend.delete(h)
                return time.monotonic() - started

            first, second = await asyncio.gather(timed(stuck), timed(other), return_exceptions=True)
            return first, second

        started = time.monotonic()
        stuck_result, other_result = loop.run(both())
        took = time.monotonic() - started
        assert isinstance(other_result, float) and other_result < 6, other_result
        assert isinstance(stuck_result, BackendError), stuck_result
        assert f"{victim} (" in stuck_result.message and "did not end" in stuck_result.message, stuck_result.message
        assert f"{victim} (D, parent " in stuck_result.message, stuck_result.message  # frozen: the kernel's D
        assert took < 12, took
        assert leftovers(other) == []
        (group / "freezer.state").write_text("THAWED")
        loop.run(backend.delete(stuck))  # the retry
        assert leftovers(stuck) == []
    finally:
        if group.exists():
            (group / "freezer.state").write_text("THAWED")
            wait_for(lambda: not (group / "cgroup.procs").read_text().split(), 5)
            group.rmdir()


def test_a_delete_reads_the_groups_twice_however_long_a_killed_process_takes_to_die(
        loop: LoopThread, backend: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the sandbox's processes are killed, the delete waits for them to exit (their pidfds)
    and reads its groups once more, not again and again while they die: one that takes a second
    (frozen outside the sandbox's freezer group, thawed a second later) costs no more looks.

    Can fail: on main the groups' ``cgroup.procs`` (every group of every controller) were read
    every 1-10 ms until they were empty."""
    freezer = controller_mounts().get("freezer")
    if freezer is None:
        pytest.skip("no freezer controller")
    h = _create(loop, backend, "iso-slow-death")
    group = freezer / f"idegym-test-slow-{os.getpid()}"
    reads: list[int] = []  # how many processes each read of the groups found
    procs = Cgroups.procs

    def counted(paths: dict[str, str]) -> set[int]:
        found = procs(paths)
        reads.append(len(found))
        return found

    def sleepers() -> list[int]:
        return [p for p in procs(h.data["cgroups"]) if Path(f"/proc/{p}/comm").read_text().strip() == "sleep"]

    try:
        ok(h, "sleep 1000 >/dev/null 2>&1 &")
        assert wait_for(sleepers, 5)
        _freeze_elsewhere(sleepers()[0], group)
        thaw = threading.Timer(1.0, lambda: (group / "freezer.state").write_text("THAWED"))
        monkeypatch.setattr(Cgroups, "procs", staticmethod(counted))
        started = time.monotonic()
        thaw.start()
        loop.run(backend.delete(h))
        took = time.monotonic() - started
        monkeypatch.undo()
        assert took >= 1.0, took  # it waited for the frozen process
        assert len(reads) == 2, reads
        assert leftovers(h) == []
    finally:
        monkeypatch.undo()
        if group.exists():
            (group / "freezer.state").write_text("THAWED")
            wait_for(lambda: not (group / "cgroup.procs").read_text().split(), 5)
            group.rmdir()


@pytest.mark.security
def test_a_fork_bomb_is_gone_within_five_seconds_of_its_sandbox_being_stopped(loop: LoopThread,
                                                                               backend: LocalBackend) -> None:
    h = _create(loop, backend, "iso-bomb")
    bash(h, "bomb() { bomb | bomb & }; bomb", timeout=5)
    pids = h.data["cgroups"]["pids"]
    assert wait_for(lambda: int(Path(pids, "pids.current").read_text()) > 200, 10)
    started = time.monotonic()
    loop.run(backend.delete(h))
    took = time.monotonic() - started
    assert took < 5, took
    assert leftovers(h) == []


# -- CPU -----------------------------------------------------------------------------------------------


def test_each_sandbox_has_a_cpu_weight_and_its_quota(loop: LoopThread, backend: LocalBackend) -> None:
    """``cpu.shares`` follows the sandbox's CPU (1024 per core; a sandbox without resources weighs
    one core), and a CPU limit is a CFS quota.

    Can fail: on main a sandbox's weight was the kernel's default whatever it asked for."""
    small = _create(loop, backend, "iso-cpu-small", limits=Limits(cpu_millicores=250))
    plain = _create(loop, backend, "iso-cpu-plain")
    try:
        cpu = Path(small.data["cgroups"]["cpu"])
        assert (cpu / "cpu.shares").read_text().strip() == "256"
        assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "25000"
        assert Path(plain.data["cgroups"]["cpu"], "cpu.shares").read_text().strip() == "1024"
    finally:
        loop.run(backend.delete(small))
        loop.run(backend.delete(plain))


def _echo_times(h: SandboxHandle, n: int) -> list[float]:
    times = []
    with client(h) as c:
        for _ in range(n):
            started = time.perf_counter()
            assert c.post("/api/tools/bash", json={"command": "echo hi"}).status_code == 200
            times.append(time.perf_counter() - started)
    return times


def _burning(group: Path) -> int:
    """Processes of ``group`` (and its children) that have had a twentieth of a CPU-second."""
    busy = 0
    for root, _, _ in os.walk(group):
        for pid in Path(root, "cgroup.procs").read_text().split():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # ended meanwhile
                continue
            busy += int(fields[11]) + int(fields[12]) >= os.sysconf("SC_CLK_TCK") // 20  # utime + stime
    return busy


class _RunnableSampler(threading.Thread):
    """Samples the host's runnable tasks (``/proc/loadavg``'s fourth field) every 5 ms while
    ``recording`` is set, until ``done``."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[int] = []
        self.recording = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.005):
            if self.recording.is_set():
                self.samples.append(int(Path("/proc/loadavg").read_text().split()[3].split("/")[0]))


@pytest.mark.security
@pytest.mark.slow
def test_a_cpu_burner_does_not_starve_its_neighbour(loop: LoopThread, backend: LocalBackend) -> None:
    """A neighbour's ``echo`` stays within 3x its idle median while another sandbox burns every
    core (more busy loops than cores).

    Idle and busy are measured in alternating rounds (the burner frozen, then thawed), so both see
    the same foreign load. Scheduling latency is only meaningful on a host that others do not load:
    every group of the local backend sits under one parent (so that sandboxes together can never
    starve the control plane), and with many foreign runnable tasks that parent waits its turn
    behind them whenever the burner keeps it runnable. So the host's runnable tasks are sampled
    while the burner runs, and the test skips when others kept a core's worth of them runnable."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    if load > 2 * cores:
        pytest.skip(f"the host is busy (load average {load:.1f}): scheduling latency cannot be judged here")
    neighbour, burner = _create(loop, backend, "iso-echo"), _create(loop, backend, "iso-burn")
    groups = burner.data["cgroups"]
    try:
        _echo_times(neighbour, 5)  # warm
        loops = 2 * cores
        ok(burner, f"for i in $(seq {loops}); do (while :; do :; done) >/dev/null 2>&1 & done")
        assert wait_for(lambda: _burning(Path(groups["pids"])) >= loops, 10)
        idle: list[float] = []
        busy: list[float] = []
        sampler = _RunnableSampler()
        sampler.start()
        try:
            for _ in range(4):
                assert Cgroups.freeze(groups) is True
                try:
                    idle += _echo_times(neighbour, 10)
                finally:
                    Cgroups.thaw(groups)
                sampler.recording.set()
                busy += _echo_times(neighbour, 10)
                sampler.recording.clear()
        finally:
            sampler.done.set()
            sampler.join()
        # Runnable besides the burner's loops: the sampler, the neighbour's server and its echo.
        others = statistics.median(sampler.samples) - loops - 3
        if others >= cores:
            pytest.skip(f"{others:g} foreign tasks were runnable beside the burner: "
                        f"scheduling latency cannot be judged here")
        p50_idle, p50_busy = statistics.median(idle), statistics.median(busy)
        assert p50_busy < 3 * p50_idle, \
            f"idle p50 {p50_idle * 1e3:.1f} ms, with a burner next door {p50_busy * 1e3:.1f} ms " \
            f"({others:g} other tasks runnable)"
    finally:
        loop.run(backend.delete(burner))
        loop.run(backend.delete(neighbour))


# -- host secrets ----------------------------------------------------------------------------------


@pytest.mark.security
def test_no_host_file_is_readable_beyond_what_toolchains_run(loop: LoopThread, backend: LocalBackend) -> None:
    """A marker planted in every host directory the sandbox runtime takes something from (the
    interpreter's prefix, the virtualenv, each site-packages' parent, CARGO_HOME where
    ``credentials.toml`` lives, RUSTUP_HOME) is nowhere in the sandbox: only the binaries and
    libraries under them are bound.

    Can fail: on main the whole CARGO_HOME, RUSTUP_HOME and the interpreter's prefix were bound
    at /opt/idegym/toolchains/... and /opt/idegym/python."""
    import secrets
    import site

    home = Path(os.path.expanduser("~"))
    homes = {Path(sys.base_prefix), Path(sys.prefix),
             Path(os.environ.get("CARGO_HOME") or home / ".cargo"),
             Path(os.environ.get("RUSTUP_HOME") or home / ".rustup")}
    homes |= {Path(p).parent for p in site.getsitepackages()}
    token = f"idegym-marker-{secrets.token_hex(6)}"
    planted = []
    for where in sorted(p.resolve() for p in homes if p.is_dir() and not str(p.resolve()).startswith("/usr")):
        marker = where / token
        try:
            marker.write_text(f"secret of {where}\n")
        except OSError:
            continue
        planted.append(marker)
    assert planted
    try:
        h = _create(loop, backend, "iso-secrets")
        try:
            found = ok(h, f"find / -xdev -maxdepth 6 -name '{token}' 2>/dev/null; "
                          f"find /opt/idegym -maxdepth 6 -name '{token}' 2>/dev/null; echo end", timeout=120)
            assert found.split() == ["end"], found
            assert ok(h, "python3 -c 'import sys; print(sys.version_info[0])'").strip() == "3"
        finally:
            loop.run(backend.delete(h))
    finally:
        for marker in planted:
            marker.unlink()


# -- storage -----------------------------------------------------------------------------------------


@pytest.mark.security
def test_a_sandbox_without_a_storage_request_is_bounded_by_default(loop: LoopThread, backend: LocalBackend) -> None:
    """Without ``ephemeral-storage`` a sandbox's writes land on a filesystem of its own with the
    backend's default bound in bytes and in files, not on the host's disk.

    Can fail: on main such a sandbox wrote to the state directory's disk (it filled 2 GiB and
    made 200k files there)."""
    from control_plane.backends.local.storage import DEFAULT_STORAGE_BYTES, DEFAULT_STORAGE_INODES

    h = _create(loop, backend, "iso-default-storage")
    try:
        size, inodes = ok(h, "df --output=size,itotal -B1 /home/appuser/work | tail -1").split()
        assert 0.9 * DEFAULT_STORAGE_BYTES <= int(size) <= DEFAULT_STORAGE_BYTES, size
        assert int(inodes) <= DEFAULT_STORAGE_INODES, inodes
        assert h.data.get("layers_fs") == "ext4"
    finally:
        loop.run(backend.delete(h))
    assert leftovers(h) == []


@pytest.mark.security
def test_storage_and_file_bounds_stop_a_sandbox_filling_the_disk(loop: LoopThread, tmp_path: Path) -> None:
    """With the backend's bounds set small (as ``--sandbox-storage``/``--sandbox-inodes`` do), a
    sandbox that writes more than its bytes, or makes more files than its bound, gets ENOSPC in
    its project, its home and /tmp; deleting it frees everything (no loop device is left)."""
    small = LocalBackend(tmp_path / "state", isolation="bwrap", storage_bytes=48 * MiB, storage_inodes=3000)
    loop.run(small.start())
    try:
        h = loop.run(small.create(spec("iso-small-disk"), 60))
        try:
            fill = bash(h, "for d in /home/appuser/work /home/appuser /tmp; do "
                           "dd if=/dev/zero of=$d/big bs=1M count=100 2>&1 | grep -c 'No space'; rm -f $d/big; "
                           "mkdir $d/many; n=0; while [ $n -lt 4000 ]; do : > $d/many/f$n 2>/dev/null || break; "
                           "n=$((n+1)); done; echo $n; rm -rf $d/many; done", timeout=120)
            counts = fill["stdout"].split()
            assert counts[0::2][:2] == ["1", "1"], fill  # /tmp is RAM: 1 GiB by default, bounded in files only
            assert all(int(n) < 3000 for n in counts[1::2]), fill
        finally:
            loop.run(small.delete(h))
        assert leftovers(h) == []
        # Within moments, not at once: a sandbox being made on the other worker at the time of the
        # delete holds a copy of the mount until its bubblewrap drops the old root (seen in CI).
        assert wait_for(lambda: str(tmp_path) not in subprocess.run(["losetup", "-a"], capture_output=True,
                                                                    text=True).stdout, 5)
    finally:
        loop.run(small.close())


_ATTACH_RACE = """
import multiprocessing, os, sys
from pathlib import Path
from control_plane.backends.base import BackendError
from control_plane.backends.local import storage

def attach_and_let_go(image):
    failed = 0
    for _ in range(40):
        try:
            _device, fd = storage._attach(Path(image), readonly=True)
        except BackendError:
            failed += 1
        else:
            os.close(fd)  # the device detaches itself
    return failed

if __name__ == "__main__":
    with multiprocessing.get_context("fork").Pool(24) as pool:
        print(sum(pool.map(attach_and_let_go, sys.argv[1:], chunksize=1)))
"""


def test_sandboxes_made_at_once_all_get_a_loop_device(tmp_path: Path) -> None:
    """Every caller racing for a free loop device is told the same one and one wins each round;
    24 processes attaching at once (as several control planes on a host making sandboxes do)
    all get one.

    Can fail: the race was given 16 rounds, and sandboxes failed to start with 'no free loop
    device' while four control planes made sandboxes (72 of 960 attaches here)."""
    images = []
    for i in range(24):
        image = tmp_path / f"image-{i}"
        image.write_bytes(b"")
        os.truncate(image, 1 << 20)
        images.append(str(image))
    # a process of its own: forking this one (its threads) is not safe
    out = subprocess.run([sys.executable, "-c", _ATTACH_RACE, *images], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "0", f"{out.stdout.strip()} of 960 attaches found no free loop device"


def test_deleting_a_sandbox_gives_its_layer_back_while_neighbours_run(loop: LoopThread, backend: LocalBackend) -> None:
    """A deleted sandbox's bounded layer (its loop device and image) is released at once, even
    while sandboxes created after it still run (their bubblewrap monitors live in copies of the
    host's mounts taken at their start).

    Can fail: before those copies dropped other sandboxes' layers, a deleted sandbox's loop device
    stayed attached (and its disk space taken) until every later sandbox had ended."""
    first = _create(loop, backend, "iso-layer-first")
    second = _create(loop, backend, "iso-layer-second")
    try:
        image = Path(first.data["dir"], "layers.ext4")
        assert image.exists()
        loop.run(backend.delete(first))
        assert wait_for(lambda: str(image) not in subprocess.run(["losetup", "-a"], capture_output=True,
                                                                 text=True).stdout, 5)
    finally:
        loop.run(backend.delete(second))


def test_a_new_sandboxs_layer_image_holds_little(loop: LoopThread, backend: LocalBackend) -> None:
    """A new sandbox's bounded layer (8 GiB by default) is a sparse image holding well under a
    MiB: every start copies it, and the host writes it back to disk later.

    Can fail: the template kept ext4's blocks reserved for growing the filesystem, 4 MiB of its
    4.2, copied by every start (40 MiB written for 8 starts)."""
    h = _create(loop, backend, "iso-layer-small")
    try:
        image = Path(h.data["dir"], "layers.ext4")
        assert image.stat().st_size >= 8 << 30
        assert image.stat().st_blocks * 512 < 1 << 20, f"{image.stat().st_blocks * 512} bytes allocated"
    finally:
        loop.run(backend.delete(h))


@pytest.mark.security
def test_a_stuck_stop_ends_deletion_failed_and_the_watcher_retries(tmp_path: Path) -> None:
    """Through the control plane: stopping a server whose sandbox holds a process that cannot
    die ends DELETION_FAILED with the reason (the process and its state), within the backend's
    bound (``--delete-timeout``, 8 s here: 20 s by default); once the process can die, the watcher's
    sweep removes what was left, and the server is STOPPED."""
    from tests.cp_helpers import ControlPlaneProcess

    freezer = controller_mounts().get("freezer")
    if freezer is None:
        pytest.skip("no freezer controller")
    state = tmp_path / "state"
    group = freezer / f"idegym-test-stuck-cp-{os.getpid()}"
    cp = ControlPlaneProcess(state, ["--warm-pool", "0", "--delete-timeout", "8"])
    try:
        client = cp.register("stuck")
        sid = cp.start_server(client, reuse_strategy="NONE")["server_id"]
        cp.bash(client, sid, "sleep 1000 >/dev/null 2>&1 &")
        sandbox = next(p for p in (state / "sandboxes").iterdir())
        pids = next(Path(p) for p in Path("/sys/fs/cgroup/pids").glob(f"idegym/*/{sandbox.name}"))
        def sleepers() -> list[int]:
            procs = [int(p) for root, _, _ in os.walk(pids) for p in Path(root, "cgroup.procs").read_text().split()]
            return [p for p in procs if Path(f"/proc/{p}/comm").read_text().strip() == "sleep"]

        assert wait_for(sleepers, 5)
        victim = sleepers()[0]
        _freeze_elsewhere(victim, group)
        started = time.monotonic()
        stop = cp.http.request("DELETE", "/api/idegym-servers", json={"client_id": client, "server_id": sid})
        op = cp.wait_op(stop.json()["operation_id"], 60)
        assert 6 < time.monotonic() - started < 15  # the kill waited until a second before the bound
        assert op["status"] == "FAILED", op
        status = cp.status(client, sid)
        assert status["availability"] == "DELETION_FAILED" and f"{victim} (" in status["details"], status
        assert sandbox.exists()  # kept for the retry, with its record
        (group / "freezer.state").write_text("THAWED")
        assert wait_for(lambda: not sandbox.exists() and not pids.exists(), 30), "the watcher did not retry the delete"
        assert wait_for(lambda: cp.status(client, sid)["availability"] == "STOPPED", 10), cp.status(client, sid)
    finally:
        if group.exists():
            (group / "freezer.state").write_text("THAWED")
            wait_for(lambda: not (group / "cgroup.procs").read_text().split(), 5)
            group.rmdir()
        cp.stop()
