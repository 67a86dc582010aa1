"""Turning a ready warm-pool sandbox into a fork's child, in a few milliseconds.

A warm sandbox of the parent's image and kind runs a sandbox server that nothing has used yet.
Its root trees are replaced under it: a new overlay per tree the fork changed (the fork's levels
over the same image layers, a fresh writable layer) is made here, with paths resolved in this
namespace, and attached in the sandbox's mount namespace on top of the old one (``mount_api``),
which nothing reaches any more; what was mounted inside a replaced tree (the server's runtime
under ``/opt/idegym``, ``/etc/resolv.conf``) is moved up onto the new one. The project overlay is
replaced the same way (a new one on top, over the fork's project levels, which are bound
read-only where the server finds them for a reset to the fork point; a reset unmounts and mounts
only the top one). Nothing is unmounted: an unmount waits for an RCU grace period. The server
keeps running: every path it and the tools it starts look up from then on resolves in the new
trees, exactly as in a child launched on the fork's layers (``rootfs.lower_layers``).

A fork's members are remounted all at once by a native helper (``native/remount.c``, ``adopt_all``:
each in a process of its own, none under the interpreter lock), or, where it is not built, one by
one in Python on threads that join the sandbox's namespace (``adopt``); both follow one plan.

Not for an OCI image: its root is one overlay mounted as ``/``, which a running process cannot
be moved off. Such a child is launched instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sandbox_server import procfs
from sandbox_server.project import FORK_LAYERS

from ..base import BackendError
from . import mount_api, mounts, ns_threads
from .fork_layers import ForkStack
from .handle_data import LocalHandleData, required
from .image_trees import TREES
from .images import ResolvedImage
from .rootfs import fork_inside

# Where adopt runs: threads that join a sandbox's mount namespace and come back (a thread
# started per child waited for the scheduler on a busy host).
THREADS = ns_threads.NamespaceThreads("idegym-adopt")
# ``adopt_all``'s native helper (``make native``; without it each member is remounted by ``adopt``).
REMOUNT = Path(__file__).parent / "native" / "idegym-remount"
# Its bound (within the fork's own): a fork's remounts take milliseconds; one that hangs (a mount
# call stuck in the kernel) is killed with its member processes, and its members are launched instead.
REMOUNT_TIMEOUT = 30.0


def unsuitable(warm: LocalHandleData, image: ResolvedImage, parent: LocalHandleData) -> str | None:
    """Why the sandbox ``warm`` records cannot become a child of ``parent`` (None when it can)."""
    if image.is_oci:
        return "an OCI image's root is one overlay, which cannot be swapped under a running server"
    if warm.isolation != "bwrap" or warm.space != "sandboxes":
        return "not a bubblewrap sandbox"
    for key, mine, theirs in (("image_id", warm.image_id, parent.image_id),
                              ("run_as_root", warm.run_as_root, parent.run_as_root),
                              ("network", warm.network, parent.network)):
        if mine != theirs:
            return f"its {key} differs from the parent's"
    if warm.forks or warm.snapshot or warm.adopted:
        return "it has layers of its own already"
    if not procfs.recorded_alive(warm.server):
        return "its server is gone"
    return None


def adopt(state_dir: Path, data: LocalHandleData, image: ResolvedImage, stack: ForkStack) -> None:
    """Remount the trees and project of the sandbox ``data`` describes onto ``stack`` (see the
    module doc); ``data`` records the stack, which the caller made the sandbox a holder of
    (released when it is deleted). Runs on ``THREADS``: it joins the sandbox's mount namespace."""
    ns_threads.require()
    _remount(state_dir, _plan(state_dir, data, image, stack))


def adopt_all(state_dir: Path, members: list[LocalHandleData], image: ResolvedImage,
              stack: ForkStack, timeout: float) -> list[BaseException | None]:
    """``adopt`` for each of ``members`` at once, by ``REMOUNT`` (a native helper: each member in a
    process of its own, no interpreter lock); each member's failure, or None. Any thread. The
    helper runs in a process group of its own, killed whole after ``timeout`` seconds."""
    plans = [_plan(state_dir, data, image, stack) for data in members]
    request = [b"idegym-remount/1", str(state_dir).encode(), FORK_LAYERS.encode(), str(len(plans)).encode()]
    for plan in plans:
        request += [str(plan.server[0]).encode(), str(plan.server[1]).encode(), plan.layers.encode(),
                    plan.project_dir.encode(), plan.record.encode(), str(plan.like or "").encode(),
                    str(len(plan.trees)).encode()]
        for tree, lowers in plan.trees:
            request += [tree.encode(), str(len(lowers)).encode(), *map(os.fsencode, lowers)]
        request += [str(len(plan.project)).encode(), *map(os.fsencode, plan.project), str(len(plan.binds)).encode()]
        for source, target in plan.binds:
            request += [os.fsencode(source), target.encode()]
    done = _run_bounded([str(REMOUNT)], b"".join(f + b"\0" for f in request), timeout)
    if done.returncode not in (0, 1):
        raise BackendError(f"{REMOUNT} refused the remount ({done.returncode}): "
                           f"{done.stderr.decode(errors='replace').strip()}", 500)
    failures: list[BaseException | None] = [None] * len(plans)
    for line in done.stdout.decode(errors="replace").splitlines():
        index, err, what = line.split(" ", 2)
        failures[int(index)] = OSError(int(err), what)
    if done.returncode == 1 and all(f is None for f in failures):
        raise BackendError(f"{REMOUNT} failed without saying why", 500)
    return failures


def _run_bounded(argv: list[str], stdin: bytes, timeout: float) -> subprocess.CompletedProcess[bytes]:
    """``argv`` fed ``stdin``, in a session of its own; past ``timeout`` seconds (or when the
    caller is interrupted) its whole process group is killed, its children too."""
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except BaseException as exc:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()  # not its pipes: a member process stuck in the kernel may hold them
            if isinstance(exc, subprocess.TimeoutExpired):
                raise BackendError(f"{argv[0]} did not finish within {timeout:g} s: it was killed with its "
                                   "processes", 504) from None
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@dataclass(frozen=True)
class _Plan:
    """One remount: paths on the host relative to the state directory where they are below it
    (the sandbox's /proc/mounts shows no host path)."""

    server: list[int]
    layers: str  # the sandbox's layer directory
    trees: list[tuple[str, list[str]]]  # each tree the fork changed, with its lower directories, top first
    project: list[str]  # the project's lower directories, top first
    binds: list[tuple[Path, str]]  # each fork level of the project and where the sandbox sees it
    record: str  # the FORK_LAYERS list
    like: Path | None  # whose owner, mode and times the project's upper takes
    project_dir: str


def _plan(state_dir: Path, data: LocalHandleData, image: ResolvedImage, stack: ForkStack) -> _Plan:
    """The remount of the sandbox ``data`` describes onto ``stack``, which ``data`` records."""
    data.forks = list(stack.ids)
    data.adopted = True
    state = f"{state_dir}/"

    def rel(path: str | Path) -> str:
        text = str(path)
        return text[len(state):] if text.startswith(state) else text

    project_levels = stack.project_levels()
    return _Plan(server=required(data.server, "server"), layers=rel(Path(data.dir) / "layers"),
                 trees=[(t, [rel(p) for p in [*stack.tree_levels(t), *image.lowers[t]]])
                        for t in TREES if stack.tree_levels(t)],
                 project=[*map(rel, project_levels), rel(image.project)],
                 binds=[(level, fork_inside(i)) for i, level in enumerate(project_levels)],
                 record=json.dumps([fork_inside(i) for i in range(len(project_levels))]),
                 like=project_levels[0] if project_levels else None, project_dir=image.project_dir)


def _remount(state_dir: Path, plan: _Plan) -> None:
    os.chdir(state_dir)  # the plan's paths are relative to it
    layers = Path(plan.layers)
    fds: list[int] = []
    try:
        tree_fds = {}
        for tree, lowers in plan.trees:
            upper, work = _fresh_layer(layers / tree)
            fd = mount_api.overlay(lowers, str(upper), str(work),
                                   attrs=mount_api.MOUNT_ATTR_NOSUID | mount_api.MOUNT_ATTR_NODEV)
            fds.append(fd)
            tree_fds[tree] = fd
        upper, work = _fresh_layer(layers / "project", like=plan.like)
        (layers / "project" / FORK_LAYERS).write_text(plan.record)
        project_fd = mount_api.overlay(plan.project, str(upper), str(work), userxattr=True)
        fds.append(project_fd)
        binds = []
        for level, _inside in plan.binds:
            binds.append(mount_api.clone(level, recursive=False, readonly=True))
            fds.append(binds[-1])
        keep = _submounts(plan.server[0], tree_fds, plan.project_dir)
        ns = os.open(f"/proc/{plan.server[0]}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        try:
            ns_threads.enter(ns)  # from here on, paths are the sandbox's (until the leave below)
        finally:
            os.close(ns)
        moved = []
        for point in keep:
            moved.append((point, mount_api.clone(point, recursive=True)))
            fds.append(moved[-1][1])
        # The old project overlay is covered, not unmounted: an unmount waits for an RCU grace
        # period (~2 ms, most of a remount's time), and nothing reaches what is covered.
        for tree, fd in tree_fds.items():
            mount_api.attach(fd, f"/{tree}")
        for point, fd in moved:
            os.makedirs(point, exist_ok=True)
            mount_api.attach(fd, point)
        for fd, (_level, inside) in zip(binds, plan.binds, strict=True):
            os.makedirs(inside, exist_ok=True)
            mount_api.attach(fd, inside)
        mount_api.attach(project_fd, plan.project_dir)
    finally:
        for fd in fds:
            os.close(fd)
        ns_threads.leave()


def _fresh_layer(layer: Path, like: Path | None = None) -> tuple[Path, Path]:
    """New ``upper``/``work`` in ``layer``; the old pair (still used by the overlay being covered)
    is kept under other names. The upper's root takes ``like``'s owner and mode (the overlay's
    root takes them from its upper)."""
    upper, work = layer / "upper", layer / "work"
    for path in (upper, work):
        if path.exists():
            path.rename(layer / f".warm-{path.name}")
    upper.mkdir(mode=0o755)
    work.mkdir(mode=0o700)
    if like is not None:
        st = os.stat(like)
        os.chown(upper, st.st_uid, st.st_gid)
        os.chmod(upper, stat.S_IMODE(st.st_mode))
        os.utime(upper, ns=(st.st_atime_ns, st.st_mtime_ns))
    return upper, work


def _submounts(pid: int, trees: Iterable[str], project_dir: str) -> list[str]:
    """Mount points mounted directly inside the trees about to be covered (their contents are
    carried along by a recursive clone), the project's own mount excepted."""
    try:
        lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    except OSError as exc:
        raise BackendError(f"the sandbox's server (pid {pid}) is gone: {exc}", 409) from exc
    entries = []
    for line in lines:
        fields = line.split(" ", 5)
        entries.append((fields[0], fields[1], mounts.unescape(fields[4])))
    tops = {}
    for mount_id, _parent, point in entries:  # later lines are mounted later: on top
        if point in {f"/{t}" for t in trees}:
            tops[point] = mount_id
    wanted = set(tops.values())
    return [point for _mid, parent, point in entries if parent in wanted and point != project_dir]
