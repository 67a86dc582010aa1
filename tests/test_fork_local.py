"""Fork on the local backend with real sandboxes (``docs/fork.md``): ``LocalBackend.fork``.

Children launched on the fork's layers and warm sandboxes remounted onto them are checked
side by side: each must hold exactly the parent's filesystem at the fork, then go its own way.
One backend and one event loop for the module; every test removes what it made and checks that
nothing (process, mount, cgroup, directory, fork layer) is left.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.backends.base import BackendError, ForkChild, Limits, SandboxHandle
from control_plane.backends.local import LocalBackend, adopt
from control_plane.backends.local import fork as local_fork
from control_plane.backends.local.cgroups import Cgroups
from control_plane.backends.local.fork_layers import ForkLayers
from control_plane.backends.local.handle_data import LocalHandleData
from control_plane.backends.local.layout import read_meta
from sandbox_server import procfs
from tests.local_helpers import (
    LoopThread,
    bash,
    delete_sandboxes,
    leftovers,
    loop_thread,
    ok,
    spec,
    start_backend,
    wait_for,
    write_calc_project,
)
from tests.local_helpers import client as _client

CAN_ISOLATE = os.geteuid() == 0 and shutil.which("bwrap") is not None
pytestmark = pytest.mark.skipif(not CAN_ISOLATE, reason="needs root and bubblewrap")
MiB = 1 << 20

# What the parent leaves in every tree: new files, a changed and a deleted image file, a
# directory replaced by a new one (opaque), a symlink, a hard link, modes and owners.
ROOT_WRITES = """set -e
mkdir -p /usr/local/forked && echo usr > /usr/local/forked/u && ln /usr/local/forked/u /usr/local/forked/hard
echo etc > /etc/forked.conf; echo var > /var/forked; mkdir -p /opt/forked && echo opt > /opt/forked/o
echo root > /root/forked; echo tmp > /tmp/forked; mkdir -p /tmp/forked.d && echo deep > /tmp/forked.d/x
cd /home/appuser/work
echo changed >> src/calc.py; rm README.md; ln -s src/calc.py link2.py; chmod 600 run.sh
rm -rf src/deep && mkdir src/deep && echo new > src/deep/only.txt
mkdir -p /home/appuser/.cache && echo cache > /home/appuser/.cache/c && chown -R 1000:1000 /home/appuser/.cache
"""
PATHS = "/usr/local/forked /etc /var /opt/forked /root /home /tmp"
DIGEST = (f"find {PATHS} -path /var/tmp -prune -o -printf '%y %m %U %G %n %p %l\\n' 2>/dev/null | LC_ALL=C sort; "
          f"find {PATHS} -type f -print0 2>/dev/null | LC_ALL=C sort -z | xargs -0 -r sha256sum")


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    yield from loop_thread()


@pytest.fixture(scope="module")
def backend(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    b = start_backend(loop, tmp_path_factory.mktemp("fork") / "state")
    yield b
    delete_sandboxes(loop, b)
    assert b.fork_layers.layer_ids() == set()
    loop.run(b.close())


@pytest.fixture(scope="module")
def image(backend: LocalBackend, tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("proj") / "calc"
    write_calc_project(root)
    return backend.register_project("test/fork-calc:1", root)


def _fork(loop: LoopThread, backend: LocalBackend, parent: SandboxHandle, names: list[str],
          warm: dict[str, SandboxHandle] | None = None, image: str | None = None,
          root: bool = False, limits: Limits | None = None) -> list[SandboxHandle]:
    children = [ForkChild(spec(n, image or parent.data["image"], root=root, limits=limits), (warm or {}).get(n))
                for n in names]
    return loop.run(backend.fork(parent, children, 120))


def _remove(loop: LoopThread, backend: LocalBackend, *handles: SandboxHandle) -> None:
    for h in handles:
        loop.run(backend.delete(h))
        assert leftovers(h) == [], h.name


def test_children_hold_the_parents_whole_filesystem_and_are_isolated_every_way(
        loop: LoopThread, backend: LocalBackend, image: str) -> None:
    parent = loop.run(backend.create(spec("p-full", image, root=True), 120))
    warm = loop.run(backend.create(spec("w-full", image, root=True), 120))
    ok(parent, ROOT_WRITES)
    at_fork = ok(parent, DIGEST)
    cold, adopted = _fork(loop, backend, parent, ["c-full", "w-full"], {"w-full": warm}, image, root=True)
    assert adopted.name == "w-full" and adopted.data.get("adopted") and not cold.data.get("adopted")
    # The copy went to a filesystem of the layer's own, which the children's overlays hold: it is
    # not left in the host's mount tree (a killed control plane would leave it there for good;
    # it is detached just after the fork answers).
    layer = backend.fork_layers.path(cold.data["forks"][0])
    assert (layer / "layers.ext4").is_file()
    assert wait_for(lambda: not os.path.ismount(layer / "fs"), timeout=10)
    assert [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(layer) in line] == []
    for child in (cold, adopted):
        assert ok(child, DIGEST) == at_fork, child.name
        # the read-only runtime, the project's overlay and the checks still work in the child
        out = ok(child, "python3 -c 'print(40 + 2)'; cat src/calc.py | tail -1; ls README.md 2>&1 | grep -c 'No such'")
        assert out.splitlines() == ["42", "changed", "1"], child.name
    # every side writes; nobody else sees it
    ok(parent, "echo later > /etc/parent-later; rm src/calc.py")
    ok(cold, "echo mine > /root/cold-only; echo cold >> run.sh")
    ok(adopted, "echo mine > /usr/local/forked/adopted-only; rm -rf src")
    assert ok(parent, "ls /root/cold-only /usr/local/forked/adopted-only 2>&1 | grep -c 'No such'; ls src") \
        == "2\ndeep\n"
    assert ok(cold, "cat src/calc.py | tail -1; ls /etc/parent-later /usr/local/forked/adopted-only 2>&1 "
                    "| grep -c 'No such'") == "changed\n2\n"
    assert ok(adopted, "ls /etc/parent-later /root/cold-only src 2>&1 | grep -c 'No such'; tail -1 run.sh") \
        == "3\necho run\n"
    # the parent's tools never see a child's processes, nor the other way round
    ok(cold, "(sleep 300 &) ; true")
    assert "sleep 300" not in ok(parent, "ps -eo args")
    _remove(loop, backend, parent, cold, adopted)


def _spawner_of(handle: SandboxHandle) -> int:
    """The host pid of the tool user's spawner in sandbox ``handle`` (0: none yet)."""
    server = LocalHandleData.of(handle.data).server
    assert server is not None
    for pid in procfs.children(server[0]):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"/idegym-spawner"):
                return pid
        except OSError:
            continue
    return 0


def _pid_inside(pid: int) -> int:
    """``pid`` as its sandbox's pid namespace numbers it."""
    line = next(li for li in Path(f"/proc/{pid}/status").read_text().splitlines() if li.startswith("NSpid:"))
    return int(line.split()[-1])


def test_a_warm_sandbox_s_spawner_started_before_the_fork_serves_the_child_s_trees_only(
        loop: LoopThread, backend: LocalBackend, image: str) -> None:
    """The tool user's spawner starts with the server: a warm sandbox has one before a fork
    remounts it, and the child's first call comes from it. What it starts sees the child's trees
    (the parent's files at the fork) and writes to the child's own layer, nobody else's.

    Can fail: it did: the spawner was started by the child's first call (none before the fork)."""
    parent = loop.run(backend.create(spec("p-spawn", image), 120))
    warm = loop.run(backend.create(spec("w-spawn", image), 120))
    assert wait_for(lambda: _spawner_of(warm) != 0, timeout=10), "no spawner before the fork"
    before = _spawner_of(warm)
    ok(parent, "echo at-fork > parent-file; echo at-fork > /tmp/parent-tmp")
    (adopted,) = _fork(loop, backend, parent, ["w-spawn"], {"w-spawn": warm})
    assert adopted.data.get("adopted")
    out = ok(adopted, "echo $PPID; id -u; cat parent-file /tmp/parent-tmp; echo child > child-file")
    assert out.splitlines() == [str(_pid_inside(before)), "1000", "at-fork", "at-fork"]
    assert _spawner_of(adopted) == before
    assert ok(parent, "ls child-file 2>&1 | grep -c 'No such'") == "1\n"
    _remove(loop, backend, parent, adopted)


def _minor_faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def test_a_child_made_from_the_warm_pool_pays_nothing_more_on_its_first_call(
        loop: LoopThread, backend: LocalBackend, image: str) -> None:
    """A warm-pool sandbox answered one tool call before it was handed out (``readiness.warm_up``):
    the pages its server shares with the zygote that a call writes are its own already, so a fork
    child's first call copies about as few as a later call (page faults: counted, not timed).

    Can fail: it did: the first call of such a child took ~220 minor faults in its server (~1.5 ms
    of CPU), a later one 1."""
    parent = loop.run(backend.create(spec("p-first", image), 120))
    warm = loop.run(backend.create(spec("w-first", image), 120, background=True))
    backend.claim(warm)
    (child,) = _fork(loop, backend, parent, ["w-first"], {"w-first": warm})
    assert child.data.get("adopted")
    server = LocalHandleData.of(child.data).server
    assert server is not None
    faults = []
    for _ in range(2):
        before = _minor_faults(server[0])
        ok(child, "true")
        faults.append(_minor_faults(server[0]) - before)
    assert faults[0] <= faults[1] + 50, faults
    _remove(loop, backend, parent, child)


def test_a_file_being_written_during_the_fork_is_never_torn(loop: LoopThread, backend: LocalBackend,
                                                            image: str) -> None:
    """The parent rewrites 8 MiB in place, one write() at a time, without pause: each child has
    one whole version of it (the freezer stops the writer between two writes, never inside one)."""
    parent = loop.run(backend.create(spec("p-torn", image), 120))
    writer = ("import os\nfd = os.open('big.bin', os.O_RDWR | os.O_CREAT, 0o644)\n"
              "data = [bytes([k]) * (8 << 20) for k in range(4)]\nk = 0\n"
              "while True:\n    os.pwrite(fd, data[k % 4], 0)\n    k += 1\n")
    ok(parent, f"cat > writer.py <<'EOF'\n{writer}EOF\n(python3 writer.py > /dev/null 2>&1 &); "
               "while [ \"$(stat -c %s big.bin 2>/dev/null)\" != 8388608 ]; do sleep 0.05; done")
    children = []
    try:
        for round_ in range(3):
            (child,) = _fork(loop, backend, parent, [f"c-torn-{round_}"])
            children.append(child)
            out = ok(child, "python3 -c \"d = open('big.bin', 'rb').read(); print(len(d), len(set(d)))\"")
            assert out == f"{8 << 20} 1\n", f"round {round_}: a torn copy ({out.strip()}: size, distinct bytes)"
            assert "writer.py" not in ok(child, "ps -eo args")  # no process is copied
    finally:
        _remove(loop, backend, parent, *children)


def test_fork_of_a_fork_of_a_fork_and_resets(loop: LoopThread, backend: LocalBackend, image: str) -> None:
    """Depth 3: each generation adds a file and deletes one of its parent's; RESET of a child goes
    back to the image, ``to_fork_point`` back to the project at its fork; a parent stopped first
    leaves its children working."""
    gen0 = loop.run(backend.create(spec("g0", image), 120))
    ok(gen0, "echo 0 > gen0.txt; echo zero > /home/appuser/gen0-home")
    handles = [gen0]
    for depth in (1, 2, 3):
        (child,) = _fork(loop, backend, handles[-1], [f"g{depth}"])
        ok(child, f"echo {depth} > gen{depth}.txt; rm gen{depth - 1}.txt")
        handles.append(child)
    g3 = handles[-1]
    assert ok(g3, "ls gen*.txt; cat /home/appuser/gen0-home") == "gen3.txt\nzero\n"
    assert len(g3.data["forks"]) == 3
    layers = backend.fork_layers.layer_ids()
    # the parents go first; the youngest keeps working on what it stands on
    for h in handles[:-1]:
        loop.run(backend.delete(h))
    assert set(g3.data["forks"]) <= backend.fork_layers.layer_ids()
    assert ok(g3, "ls gen*.txt; echo more > more.txt && cat more.txt") == "gen3.txt\nmore\n"
    with _client(g3) as c:
        r = c.post("/api/project/reset", json={"to_fork_point": True})
        assert r.status_code == 200 and r.json()["status"] == "success", r.text
    assert ok(g3, "ls gen*.txt; ls more.txt 2>&1 | grep -c 'No such'") == "gen2.txt\n1\n"
    with _client(g3) as c:
        r = c.post("/api/project/reset", json={})
        assert r.status_code == 200 and r.json()["status"] == "success", r.text
    assert ok(g3, "ls; cat /home/appuser/gen0-home") == "README.md\nrun.sh\nsrc\nzero\n"  # the image's project
    _remove(loop, backend, g3)
    assert backend.fork_layers.layer_ids() & layers == set()  # the last user gone, the layers went


def _loop_backing_files(state: Path) -> list[str]:
    """The backing files under the state directory ``state`` of the host's loop devices."""
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            name = backing.read_text().strip()
        except OSError:
            continue
        if name.startswith(f"{state}/"):
            found.append(name)
    return found


def _loop_devices_of(state: Path) -> int:
    """Loop devices whose backing file is under the state directory ``state``."""
    return len(_loop_backing_files(state))


def test_a_chain_of_forks_stays_shallow_and_keeps_every_generation(loop: LoopThread, backend: LocalBackend,
                                                                   image: str) -> None:
    """Seven generations, each forked from the last (which is then deleted), each adding files,
    deleting its parent's, replacing a directory (opaque) and editing /etc: no child stands on
    more than ``max_stack`` fork layers (deeper ones are merged into the new layer), every child
    holds exactly its parent's files at the fork, and the loop devices of the backend stay as
    many at depth 7 as at depth 2.

    Can fail: on main every generation stood on one more layer (a 100-deep chain had 842 loop
    devices, and each fork was slower than the last): the stack here reached 3 at depth 3.
    """
    saved = backend.fork_layers.max_stack
    backend.fork_layers.max_stack = 2
    current = loop.run(backend.create(spec("chain-0", image, root=True), 120))
    ok(current, "echo 0 > gen0.txt; rm README.md; echo conf-0 > /etc/chain.conf; mkdir -p /opt/chain/d && "
                "echo 0 > /opt/chain/d/f0")
    try:
        for depth in range(1, 8):
            before = ok(current, DIGEST)
            (child,) = _fork(loop, backend, current, [f"chain-{depth}"], root=True)
            assert len(child.data["forks"]) <= 2, (depth, child.data["forks"])
            assert ok(child, DIGEST) == before, f"depth {depth}: the child differs from its parent at the fork"
            _remove(loop, backend, current)
            current = child
            replace = "rm -rf src/deep && mkdir src/deep && echo d > src/deep/only.txt; " if depth % 3 == 0 else ""
            ok(current, f"echo {depth} > gen{depth}.txt; rm gen{depth - 1}.txt; {replace}"
                        f"echo conf-{depth} >> /etc/chain.conf; echo {depth} > /opt/chain/d/f{depth}")
            # its own layers, its stack and the spare for the next fork's layer, no more
            assert wait_for(lambda: _loop_devices_of(backend.state_dir) <= 1 + 2 + len(backend.fork_layers.spares()),
                            timeout=30), (depth, _loop_backing_files(backend.state_dir), backend.fork_layers.spares())
            assert len(backend.fork_layers.spares()) <= 1
        assert ok(current, "ls; cat /etc/chain.conf | wc -l; ls /opt/chain/d | wc -l; ls src/deep") == \
            "gen7.txt\nrun.sh\nsrc\n8\n8\nonly.txt\n"
    finally:
        backend.fork_layers.max_stack = saved
        _remove(loop, backend, current)


def test_children_keep_the_parents_limits(loop: LoopThread, backend: LocalBackend, image: str) -> None:
    limits = Limits(memory_bytes=192 * MiB, cpu_millicores=500)
    parent = loop.run(backend.create(spec("p-lim", image, limits=limits), 120))
    (child,) = _fork(loop, backend, parent, ["c-lim"], limits=limits)
    try:
        for h in (parent, child):
            memory = Path(h.data["cgroups"]["memory"], "memory.limit_in_bytes").read_text().strip()
            assert int(memory) == 192 * MiB, h.name
            assert Path(h.data["cgroups"]["cpu"], "cpu.cfs_quota_us").read_text().strip() == "50000"
        hog = bash(child, "python3 -c 'b = bytearray(1 << 30); print(len(b))'")
        assert hog["exit_code"] == 137 and hog.get("oom_killed"), hog
        assert ok(parent, "echo alive") == "alive\n"  # the child's OOM is the child's
    finally:
        _remove(loop, backend, parent, child)


def test_layers_nobody_holds_are_removed_when_the_backend_starts(loop: LoopThread, backend: LocalBackend,
                                                                 image: str, tmp_path: Path) -> None:
    """A fork cut off by a crash (its holder names a dead process) and a child deleted while the
    control plane was down leave holders nobody will release: the next start removes them."""
    parent = loop.run(backend.create(spec("p-sweep", image), 120))
    (child,) = _fork(loop, backend, parent, ["c-sweep"])
    layer = child.data["forks"][0]
    dead = 1 << 22  # above pid_max's default: no such process
    backend.fork_layers.hold([layer], f"o-{dead}-cutoff")
    backend.fork_layers.hold([layer], "s-deleted-while-down")
    again = LocalBackend(backend.state_dir, isolation="bwrap")
    loop.run(again.start())
    try:
        assert backend.fork_layers.holders(layer) == {"s-c-sweep"}  # the live child's hold stays
        _remove(loop, backend, child)
        assert layer not in backend.fork_layers.layer_ids()
    finally:
        loop.run(again.close())
        _remove(loop, backend, parent)


def test_a_parent_that_is_not_running_cannot_be_forked_and_nothing_is_left(loop: LoopThread, backend: LocalBackend,
                                                                           image: str) -> None:
    parent = loop.run(backend.create(spec("p-dead", image), 120))
    warm = loop.run(backend.create(spec("w-dead", image), 120))
    loop.run(backend.require_started().stop(backend.sandboxes, parent.name, LocalHandleData.of(parent.data)))
    with pytest.raises(BackendError) as err:
        _fork(loop, backend, parent, ["c-dead", "w-dead"], {"w-dead": warm})
    assert err.value.status == 409 and "not running" in err.value.message
    assert leftovers(warm) == []  # a warm sandbox handed in is used or removed
    assert not (backend.sandboxes.root / "c-dead").exists()
    _remove(loop, backend, parent)


def test_freezing_is_what_keeps_copies_whole(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The fork layer is copied between ``freeze`` and ``thaw`` of the parent's groups (the order
    the torn-write test depends on)."""
    calls: list[str] = []
    monkeypatch.setattr(Cgroups, "freeze", staticmethod(lambda paths, timeout=2.0: calls.append("freeze") or True))
    monkeypatch.setattr(Cgroups, "thaw", staticmethod(lambda paths: calls.append("thaw")))
    monkeypatch.setattr(ForkLayers, "_copy_layers", staticmethod(lambda sb, level: calls.append("copy") or 0))
    monkeypatch.setattr(ForkLayers, "_copy_tmp", staticmethod(lambda data, dest: calls.append("tmp") or 0))
    layers = ForkLayers(tmp_path)
    layer, _ = layers.take(LocalHandleData(dir="/nonexistent/sb", cgroups={"freezer": "/x"}), "o-1-test")
    assert calls == ["freeze", "copy", "tmp", "thaw"]
    assert layers.holders(layer) == {"o-1-test"}
    assert layers.release("o-1-test") == [layer] and layers.layer_ids() == set()


def _mounts_under(path: Path) -> list[str]:
    """Mount points under ``path`` in this process's mount namespace."""
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split()[4].startswith(f"{path}/")]


def _own_backend_and_parent(loop: LoopThread, tmp_path: Path, name: str) -> tuple[LocalBackend, Path, SandboxHandle]:
    """A backend of the test's own (not the module's), its fork layers' directory and a parent
    sandbox of image ``test/fork-<name>:1``."""
    own = start_backend(loop, tmp_path / "state")
    own.register_project(f"test/fork-{name}:1", write_calc_project(tmp_path / "calc"))
    parent = loop.run(own.create(spec(f"p-{name}", f"test/fork-{name}:1"), 120))
    return own, own.state_dir / "forks", parent


def test_the_next_fork_copies_into_a_filesystem_made_before_it_was_asked_for(
        loop: LoopThread, tmp_path: Path) -> None:
    """After a fork answered, the layer filesystem of the next fork (a loop device and a mount,
    5-30 ms on its path) is made in the background: the next fork of the same bounds copies into
    it. A spare of a process that is gone is swept at start, one of this process is removed at
    close: no mount, no loop device is left.

    Can fail: on main a fork made its layer's filesystem while it was asked for; between forks
    nothing was mounted under the fork layers."""
    own, forks, parent = _own_backend_and_parent(loop, tmp_path, "spare")
    children = []
    try:
        ok(parent, "echo one > one.txt")
        children += _fork(loop, own, parent, ["c-spare-1"])
        # the spare made and the new layer detached (both due at the same moment, on two threads);
        # a spare is mounted before it is handed out: the next fork takes it once it is listed
        assert wait_for(lambda: len(own.fork_layers.spares()) == 1
                        and [p for p in _mounts_under(forks) if "/.spare-" in p] == _mounts_under(forks) != [],
                        timeout=30), (_mounts_under(forks), own.fork_layers.spares())
        (spare,) = [Path(p).parent for p in _mounts_under(forks)]
        assert own.fork_layers.spares() == [spare]
        assert spare.name.startswith(f".spare-{os.getpid()}-f-")
        children += _fork(loop, own, parent, ["c-spare-2"])
        assert children[-1].data["forks"][0] == spare.name.split("-", 2)[2]  # .spare-<pid>-<layer id>
        assert ok(children[-1], "cat one.txt") == "one\n"
        # one left by a control plane that was killed: swept at the next start
        assert wait_for(lambda: len(own.fork_layers.spares()) == 1, timeout=30)
        (mine,) = own.fork_layers.spares()
        dead = forks / f".spare-{_dead_pid()}-f-{'0' * 12}"
        mine.rename(dead)
        own._sweep_fork_layers()
        assert not dead.exists() and _mounts_under(forks) == []
        children += _fork(loop, own, parent, ["c-spare-3"])  # the stale spare is skipped, not used
        assert ok(children[-1], "cat one.txt") == "one\n"
        assert wait_for(lambda: len(own.fork_layers.spares()) == 1, timeout=30)
    finally:
        _remove(loop, own, *children, parent)
        loop.run(own.close())
    assert _mounts_under(forks) == [] and _loop_devices_of(own.state_dir) == 0


def test_a_fork_layer_is_detached_after_the_children_s_first_calls_and_at_close(
        loop: LoopThread, tmp_path: Path) -> None:
    """A new fork layer's filesystem is made read-only and detached (which writes its copy out:
    12-23 ms of disk work under load) ``SPARE_AFTER`` seconds after the fork answered, not beside
    the children's first calls; a child deleted before then, and the backend's close, leave no
    mount and no loop device.

    Can fail: on main the detach began as the fork answered (done ~20 ms later)."""
    own, forks, parent = _own_backend_and_parent(loop, tmp_path, "detach")
    children = []
    try:
        ok(parent, "echo one > one.txt")
        warm = loop.run(own.create(spec("w-detach", "test/fork-detach:1"), 120, background=True))
        children += _fork(loop, own, parent, ["w-detach"], {"w-detach": warm})
        answered = time.monotonic()
        assert children[0].data.get("adopted")
        layer = own.fork_layers.path(children[0].data["forks"][0])
        assert ok(children[0], "cat one.txt") == "one\n"
        assert wait_for(lambda: not os.path.ismount(layer / "fs"), timeout=10, interval=0.005)
        assert time.monotonic() - answered >= 0.9 * local_fork.SPARE_AFTER
        assert ok(children[0], "cat one.txt") == "one\n"  # its copy was written out whole
        # deleted before its layer is detached, then the backend closed before the next one is
        children += _fork(loop, own, parent, ["c-detach"])
        _remove(loop, own, children.pop())
    finally:
        _remove(loop, own, *children, parent)
        loop.run(own.close())
    assert _mounts_under(forks) == [] and _loop_devices_of(own.state_dir) == 0


def _dead_pid() -> int:
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid += 1
    return pid


def test_an_adopted_child_s_record_is_written_after_the_answer_and_before_its_delete(
        loop: LoopThread, backend: LocalBackend, image: str) -> None:
    """The record (sandbox.json) of a warm sandbox made a child is written half a second after the
    fork answered, off its path and after the children's first calls: it names the child's fork
    layers then; a delete at once drops the write (or waits for one under way) and leaves nothing
    (no record written into a directory being removed)."""
    parent = loop.run(backend.create(spec("p-rec", image), 120))
    try:
        for round_ in range(3):
            warm = loop.run(backend.create(spec(f"w-rec{round_}", image), 120, background=True))
            (child,) = _fork(loop, backend, parent, [f"w-rec{round_}"], {f"w-rec{round_}": warm})
            assert child.data.get("adopted")
            if round_ == 0:
                sb, forks = Path(child.data["dir"]), child.data["forks"]
                assert wait_for(lambda sb=sb, forks=forks: (read_meta(sb) or LocalHandleData()).forks == forks,
                                timeout=10)
                record = read_meta(sb)
                assert record is not None and record.adopted
            _remove(loop, backend, child)  # at once: the record's write may be under way
            assert not Path(child.data["dir"]).exists()
    finally:
        _remove(loop, backend, parent)


@pytest.mark.parametrize("remount", ["native", "python"])
def test_a_warm_member_that_cannot_be_remounted_is_launched_and_the_others_are_adopted(
        loop: LoopThread, backend: LocalBackend, image: str, remount: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm members of a fork are remounted in one job (``adopt.adopt_all``, the native
    helper, each member in a process of its own) or, without the helper, one job each: a member
    whose remount fails is deleted and a child launched in its place; the others are adopted."""
    if remount == "python":
        monkeypatch.setattr(adopt, "REMOUNT", Path("/nonexistent/idegym-remount"))
    elif not os.access(adopt.REMOUNT, os.X_OK):
        pytest.skip("the helper is not built (make native)")
    parent = loop.run(backend.create(spec("p-part", image), 120))
    names = ["w-part0", "w-part1", "w-part2"]
    warm = {n: loop.run(backend.create(spec(n, image), 120, background=True)) for n in names}
    ok(parent, "echo at-fork > parent-file")
    # Its project layer cannot take a fresh upper: the one it has cannot be set aside.
    (Path(warm["w-part1"].data["dir"]) / "layers/project/.warm-upper/kept").mkdir(parents=True)
    children = _fork(loop, backend, parent, names, warm)
    try:
        assert [c.name for c in children] == names
        assert [bool(c.data.get("adopted")) for c in children] == [True, False, True]
        for child in children:
            assert ok(child, "cat parent-file; echo mine > own-file") == "at-fork\n", child.name
        assert ok(parent, "ls own-file 2>&1 | grep -c 'No such'") == "1\n"
    finally:
        _remove(loop, backend, parent, *children)


def test_a_remount_helper_that_hangs_is_killed_with_its_processes_and_the_members_are_launched(
        loop: LoopThread, backend: LocalBackend, image: str, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """``adopt_all``'s helper is bounded (``adopt.REMOUNT_TIMEOUT``, within the fork's timeout):
    one that hangs, as a mount call stuck in the kernel would, is killed with every process of its
    group, and the members it was to remount are deleted and launched instead. A stand-in helper
    hangs here: it reads the request, starts a process of its own and waits for it."""
    pids = tmp_path / "pids"
    hang = tmp_path / "idegym-remount"
    hang.write_text(f"#!/bin/sh\ncat >/dev/null\nsleep 40 &\necho $$ $! > {pids}\nwait\n")
    hang.chmod(0o755)
    monkeypatch.setattr(adopt, "REMOUNT", hang)
    monkeypatch.setattr(adopt, "REMOUNT_TIMEOUT", 1.0)
    parent = loop.run(backend.create(spec("p-hang", image), 120))
    names = ["w-hang0", "w-hang1"]
    warm = {n: loop.run(backend.create(spec(n, image), 120, background=True)) for n in names}
    ok(parent, "echo at-fork > parent-file")
    began = time.monotonic()
    children = _fork(loop, backend, parent, names, warm)
    took = time.monotonic() - began
    try:
        assert took < 20, f"the fork waited {took:.1f} s for a helper bounded at 1 s"
        helper, member = map(int, pids.read_text().split())
        assert procfs.wait_gone([helper, member], timeout=10) == []
        assert [bool(c.data.get("adopted")) for c in children] == [False, False]
        for child in children:
            assert ok(child, "cat parent-file") == "at-fork\n", child.name
    finally:
        _remove(loop, backend, parent, *children)


def test_a_fork_cancelled_while_its_layer_is_taken_leaves_no_layer_held_or_mounted(
        loop: LoopThread, backend: LocalBackend, image: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork cancelled (its client gone) while its new layer is being taken: the take runs on in
    its thread; once it ends, what it did is undone (the layers it entered left, its holds and the
    warm members' let go), so the new layer goes while the warm sandboxes live on."""
    import asyncio
    import threading

    taken: list[str] = []
    gate, in_take = threading.Event(), threading.Event()
    real_take = local_fork._take

    def take_then_wait(*args: object, **kwargs: object) -> object:
        result = real_take(*args, **kwargs)  # type: ignore[arg-type]
        taken.append(result[0])
        in_take.set()
        gate.wait(30)  # the fork is cancelled meanwhile
        return result

    monkeypatch.setattr(local_fork, "_take", take_then_wait)
    parent = loop.run(backend.create(spec("p-cancel", image), 120))
    warm = loop.run(backend.create(spec("w-cancel", image), 120, background=True))
    try:
        forking = asyncio.run_coroutine_threadsafe(
            backend.fork(parent, [ForkChild(spec("w-cancel", image), warm)], 120), loop.loop)
        assert in_take.wait(30)
        forking.cancel()
        gate.set()
        (layer_id,) = taken
        layer = backend.fork_layers.path(layer_id)
        assert wait_for(lambda: layer_id not in backend.fork_layers.layer_ids(), timeout=10), \
            backend.fork_layers.holders(layer_id)
        assert [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(layer) in line] == []
        assert ok(warm, "echo alive") == "alive\n"
    finally:
        gate.set()
        _remove(loop, backend, parent, warm)
