"""Isolated runs: each program in namespaces of its own, at the cost of a few forks, not a sandbox.

What one run sees (``isolated_runs.Jails.spawn``), whatever the runs before it or beside it did:

* **files**: a mount namespace of its own in which every mount of the sandbox is read-only, with
  fresh tmpfs on ``/tmp`` and ``/dev/shm``, the run's own directory bound writable at the path
  it has outside, and the given directories (the tools' cgroup files) hidden. Nothing a run
  writes outside its directory lands anywhere, and it sees no other run's directory;
* **processes**: a pid namespace of its own, with a small init: it sees only its own processes,
  and when its program ends, the kernel kills every process still in the namespace (daemons,
  ``setsid`` or not) — a run leaves nothing running;
* **IPC and network**: namespaces of its own (no SysV shared memory, abstract Unix sockets or
  loopback ports shared with another run), with its own loopback up;
* **cgroups** of its own, given the tools' cgroup directories (``Jails.start``): the zygote
  lives in them and puts every run in child groups of its own, held to ``pids.max`` processes
  (and, in the memory controller, to a memory limit when one is given), so one run's fork bomb
  or memory hog is its own problem. The groups are a small pool (``run-<n>``, made with their
  limits when runs at once first need that many), each reused once the run in it has ended:
  when a run's init has been reaped, the kernel has ended every process of its pid namespace,
  so its groups are empty. A spare moves itself into free ones while it waits for its run
  (``_join``: the cheap way), so nothing of a run is ever outside them.

The namespaces are made by a *zygote*: a small single-threaded process the server starts while
it still holds CAP_SYS_ADMIN (``Jails.start``), before it takes that out of its bounding set. It
keeps a pool of *spare* run inits cloned ahead of demand into new namespaces, as many as runs may
go on at once, each with its view of the files made read-only and its own /proc mounted; a
request is handed to the oldest spare (the process the server watches: its exit status is the
program's), which makes the run's own mounts, takes the run's user and ``posix_spawn``s the
program, and the zygote clones another spare whenever no request waits. A spare serves one run
and no other. Nothing is executed but the program itself.

The server talks to the zygote over a SOCK_SEQPACKET socket: a request (JSON, with the run's
stdin/stdout/stderr and a status pipe as SCM_RIGHTS fds) is answered with the init's pid; the
init writes its program's wait status on the status pipe just before it exits. The server's side
(``Jails``) is ``isolated_runs.py``. This file holds what both sides share (``RunSpec``) and the
zygote, and runs as the zygote's script (``python -I -S jail.py <fd>``), so it uses nothing but
the standard library and imports nothing of the server.
"""

from __future__ import annotations

import array
import contextlib
import json
import marshal
import os
import select
import signal
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

try:
    from . import run_template as rt
except ImportError:  # run as the zygote's script (python -I -S jail.py): its directory is not on the path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import run_template as rt  # type: ignore[no-redef, import-not-found]

MAX_MESSAGE = rt.MAX_MESSAGE
RUN_PIDS_MAX = 256  # processes of one run (its init included): a fork bomb in one never starves the others
RUN_GROUP_PREFIX = "run-"
TEMPLATE_READY_SECONDS = 20.0  # the template's interpreter start (seconds only on a loaded host)
TEMPLATE_STARTS = 3  # failed starts in a row before spares are the zygote's own clones for good


@dataclass(frozen=True)
class Isolation:
    """What of the sandbox an isolated run keeps (the caller's part of a ``RunSpec``)."""

    bind: str  # the run's directory: bound writable at the same path, everything else read-only
    tmp_bytes: int = 256 << 20  # bound of the run's own /tmp and /dev/shm (each)
    hide: tuple[str, ...] = ()  # directories replaced by an empty read-only tmpfs


@dataclass
class RunSpec:
    """One isolated process: what it runs, as whom, and its isolation (the zygote's request)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    uid: int
    gid: int
    groups: list[int]
    bind: str
    tmp_bytes: int
    hide: list[str] = field(default_factory=list)
    oom_score_adj: int = 500

    @classmethod
    def of(cls, argv: list[str], env: dict[str, str], cwd: str, uid: int, gid: int, groups: list[int],
           isolation: Isolation, oom_score_adj: int) -> RunSpec:
        return cls(argv, env, cwd, uid, gid, groups, isolation.bind, isolation.tmp_bytes, list(isolation.hide),
                   oom_score_adj)


# -- whether this process can make them ----------------------------------------------------------


def probe() -> str:
    """Why this process cannot make a run's namespaces ("" when it can): a forked child tries."""
    if sys.platform != "linux":
        return "isolated runs need Linux namespaces"
    if os.geteuid() != 0:
        return "isolated runs need the server to run as root (in its sandbox's user namespace)"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only makes syscalls and exits
        try:  # what the zygote's own view takes (mount_setattr: Linux 5.12)
            rt.unshare(rt.RUN_NAMESPACES)
            rt.mount(None, "/", None, rt.MS_REC | rt.MS_PRIVATE)
            rt.all_read_only()
            ok = True
        except OSError:
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    return "" if status == 0 else "this kernel or sandbox refuses new mount/pid/IPC/network namespaces"


# -- the zygote ---------------------------------------------------------------------------------------

def _private_view() -> None:
    """Put the zygote in a mount namespace of its own, a private copy of the sandbox's: every
    run's namespace is cloned from it, so no run pays for making its mounts private (milliseconds:
    the propagation of every mount changes), and nothing a run mounts reaches the sandbox."""
    rt.unshare(rt.CLONE_NEWNS)
    rt.mount(None, "/", None, rt.MS_REC | rt.MS_PRIVATE)


@dataclass
class _Spare:
    """An init cloned ahead of demand, waiting for its run on ``channel``."""

    pid: int
    channel: socket.socket
    pidfd: int  # to kill it, never a reaped pid's successor

    def discard(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        self.channel.close()
        os.close(self.pidfd)


class _Template:
    """The zygote's handle on the runs' template interpreter (``run_template.py``): started
    with the image's ``python3``, the runs' options (``-u``) and environment, asked for spares
    (their run groups and channel only), started again when it died."""

    def __init__(self, python: str, env: dict[str, str], per_run: list[str]) -> None:
        self.argv = [python, "-u", os.path.abspath(rt.__file__)]
        self.env = env
        self.per_run = per_run
        self.pid = 0
        self.sock: socket.socket | None = None
        self.failures = 0  # starts that failed in a row
        self.failed = ""  # why it could not start TEMPLATE_STARTS times in a row: spares are the zygote's clones

    def start(self) -> bool:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            os.set_inheritable(theirs.fileno(), True)
            # stdout as a run's is (not a terminal: a forked run's sys.stdout is made at this start);
            # stderr the zygote's, for what a spare says before its run
            self.pid = os.posix_spawn(self.argv[0], [*self.argv, str(theirs.fileno()), ",".join(self.per_run),
                                                     self.argv[0]],
                                      self.env, setsigdef=rt.RESET_SIGNALS, setsigmask=(),
                                      file_actions=[(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)])
        except OSError as exc:
            ours.close()
            return self._failed(f"cannot start {self.argv[0]}: {exc}")
        finally:
            theirs.close()
        ready, _, _ = select.select([ours], [], [], TEMPLATE_READY_SECONDS)
        try:
            answer = marshal.loads(ours.recv(64)) if ready else None
        except (OSError, EOFError, ValueError):
            answer = None
        if answer != self.pid:  # it exited (an interpreter too old for run_template.py) or hung
            ours.close()
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.pid = 0
            return self._failed(f"{self.argv[0]} did not start as the runs' template")
        self.sock = ours
        self.failures = 0
        return True

    def _failed(self, why: str) -> bool:
        self.failures += 1
        if self.failures >= TEMPLATE_STARTS:
            self.failed = why
        os.write(2, f"idegym jail: no runs' template: {why}\n".encode(errors="replace"))
        return False

    def gone(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.pid = 0

    def clone(self, channel: socket.socket, groups: list[str]) -> int | None:
        """A spare cloned by the template (the zygote's child, with ``channel``): its pid, or
        None when there is no template (it died and would not start again)."""
        for _attempt in range(2):  # a template found dead is started again at once
            if self.sock is None and (self.failed or not self.start()):
                return None
            assert self.sock is not None
            try:
                self.sock.sendmsg([marshal.dumps(groups)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                             array.array("i", [channel.fileno()]))])
                answer = marshal.loads(self.sock.recv(MAX_MESSAGE))
            except (OSError, EOFError, ValueError):  # it died
                self.gone()
                continue
            if isinstance(answer, str):
                raise OSError(answer)
            return int(answer)
        return None


class _Zygote:
    """The zygote's state: the server's socket and a pool of *spares*, inits cloned ahead of
    demand (fresh namespaces made, read-only view and /proc ready), so that a run starts with what
    is its own only. The pool holds as many spares as runs may go on at once (``spares``): the
    zygote refills it one clone at a time whenever no request waits, so runs that come together
    each find one instead of waiting for a clone. Spares are the template's clones
    (``run_template.py``) when there is one, else the zygote's own."""

    def __init__(self, sock: socket.socket, cgroups: Mapping[str, str] | None = None, pids_max: int | None = None,
                 memory_max: int | None = None, spares: int = 1, template: Mapping | None = None) -> None:
        self.sock = sock
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.spares: list[_Spare] = []  # oldest (most likely ready) first
        self.wanted = max(spares, 1)
        cgroups = dict(cgroups or {})
        # Runs' own groups only where they have limits of their own: every level of a hierarchy
        # costs each fork, charge and wake-up of the run a little.
        self.cgroups = [path for ctrl, path in cgroups.items() if ctrl == "pids" or (ctrl == "memory" and memory_max)]
        self.pids_max = pids_max
        self.memory_max = memory_max
        self.free: list[str] = []  # run groups (``run-<n>`` in each of those controllers) that hold nothing
        self.made = 0
        self.slot_of: dict[int, str] = {}  # a spare's or a run's init -> its groups
        self.draining: list[str] = []  # groups of ended runs whose last tasks are still leaving
        for group in cgroups.values():  # so that every run is born below the tools' groups
            _write(os.path.join(group, "cgroup.procs"), str(os.getpid()))
        self.template = _Template(template["python"], dict(template["env"]), list(template["per_run"])) \
            if template else None
        if self.template is not None:
            self.template.start()

    def _slot(self) -> str:
        """Free run groups: one of the pool, or a new one with the runs' limits."""
        if self.free:
            return self.free.pop()
        name = f"{RUN_GROUP_PREFIX}{self.made}"
        for group in self.cgroups:
            child = os.path.join(group, name)
            os.makedirs(child, exist_ok=True)  # (left by a zygote before this one)
            if self.pids_max is not None and os.path.exists(os.path.join(child, "pids.max")):
                _write(os.path.join(child, "pids.max"), str(self.pids_max))
            if self.memory_max is not None and os.path.exists(os.path.join(child, "memory.limit_in_bytes")):
                _write(os.path.join(child, "memory.limit_in_bytes"), str(self.memory_max))
                with contextlib.suppress(OSError):  # no swap either, where the kernel accounts it
                    _write(os.path.join(child, "memory.memsw.limit_in_bytes"), str(self.memory_max))
        self.made += 1
        return name

    def ungroup(self, ended: set[int]) -> None:
        """Give back the groups of ended inits: the pid namespace of each is empty once its init
        is reaped; a group whose last task is still leaving is looked at again shortly."""
        self.draining += [self.slot_of.pop(pid) for pid in ended if pid in self.slot_of]
        for slot in list(self.draining):
            if not any(_read(os.path.join(group, slot, "cgroup.procs")) for group in self.cgroups):
                self.draining.remove(slot)
                self.free.append(slot)

    def clone_spare(self) -> _Spare:
        """One more spare for the pool: the template's clone, or the zygote's own without one."""
        slot = None
        if self.cgroups:
            try:
                slot = self._slot()
            except OSError as exc:  # the run is still bounded by the tools' groups
                os.write(2, f"idegym jail: no cgroups of its own for the next run: {exc}\n".encode())
        groups = [os.path.join(group, slot) for group in self.cgroups] if slot else []
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = self.template.clone(theirs, groups) if self.template is not None else None
            if pid is None:
                # nothing of the zygote's nor of the other spares (their channels, their pidfds)
                others = [fd for spare in self.spares for fd in (spare.channel.fileno(), spare.pidfd)]
                if self.template is not None and self.template.sock is not None:
                    others.append(self.template.sock.fileno())
                made = rt.clone_spare(rt.RUN_NAMESPACES, theirs.fileno(), groups,
                                      (self.sock.fileno(), self.wake_r, self.wake_w, ours.fileno(), *others))
                assert isinstance(made, int)  # the spare never returns without a template
                pid = made
        except BaseException:
            ours.close()
            theirs.close()
            if slot is not None:
                self.free.append(slot)
            raise
        theirs.close()
        spare = _Spare(pid, ours, os.pidfd_open(pid))
        if slot is not None:
            self.slot_of[pid] = slot
        self.spares.append(spare)
        return spare

    def hand_over(self, spec: RunSpec, fds: array.array) -> int:
        """Give the run to a spare of the pool (cloning one when there is none): the init's pid.
        Each spare is used once: its channel is closed once it has its run."""
        data = marshal.dumps(vars(spec))
        fresh = False
        while True:
            if not self.spares:
                self.clone_spare()
                fresh = True
            spare = self.spares.pop(0)
            try:
                with open(f"/proc/{spare.pid}/oom_score_adj", "w") as fh:
                    fh.write(str(spec.oom_score_adj))
                spare.channel.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                spare.channel.close()
                os.close(spare.pidfd)
                return spare.pid
            except BaseException as exc:
                spare.discard()
                if not fresh and isinstance(exc, (ProcessLookupError, FileNotFoundError, ConnectionError)):
                    continue  # it died waiting: the next one, or a fresh one
                raise

    def forget(self, ended: set[int]) -> None:
        """Spares that died waiting (killed) leave the pool, and so does a template that died
        (started again for the next spare); the loop clones others."""
        for spare in [s for s in self.spares if s.pid in ended]:
            self.spares.remove(spare)
            spare.discard()
        if self.template is not None and self.template.pid in ended:
            self.template.gone()

    def request(self) -> bool:
        """One request from the server, answered; False once the server is gone."""
        data, fds = recv_with_fds(self.sock, 16)
        if not data:
            return False
        try:
            if len(fds) != 4:
                raise ValueError(f"a run needs stdin, stdout, stderr and a status pipe, got {len(fds)} fds")
            pid = self.hand_over(RunSpec(**json.loads(data)), fds)
            self.sock.send(json.dumps({"pid": pid}).encode())
        except Exception as exc:  # noqa: BLE001 - a bad request is answered, never fatal
            self.sock.send(json.dumps({"error": f"the zygote refused the run: {exc}"}).encode())
        finally:
            for fd in fds:
                os.close(fd)
        return True


def recv_with_fds(sock: socket.socket, most: int, flags: int = 0) -> tuple[bytes, array.array]:
    """One message and the descriptors that came with it (at most ``most``)."""
    fds = array.array("i")
    data, ancdata, _flags, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(most * fds.itemsize), flags)
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, fds


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except FileNotFoundError:
        return ""


def serve(fd: int, config: dict) -> None:
    """The zygote's loop: a request in, a run's init handed its run and its pid out; the next
    spare cloned; ended inits reaped. The zygote keeps its capabilities to start the template
    again; every spare drops CAP_SYS_ADMIN and CAP_SYS_PTRACE from its bounding set."""
    rt.die_with_parent()
    _private_view()
    zygote = _Zygote(socket.socket(fileno=fd), config.get("cgroups"), config.get("pids_max"),
                     config.get("memory_max"), config.get("spares", 1), config.get("template"))
    signal.set_wakeup_fd(zygote.wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    poller = select.poll()
    poller.register(zygote.sock.fileno(), select.POLLIN)
    poller.register(zygote.wake_r, select.POLLIN)
    zygote.clone_spare()
    while True:
        # A pool short of spares gets one more per pass, after any request already waiting.
        short = len(zygote.spares) < zygote.wanted
        for ready, _ in poller.poll(0 if short else 100 if zygote.draining else None):
            if ready == zygote.wake_r:
                while True:
                    try:
                        os.read(zygote.wake_r, 4096)
                    except BlockingIOError:
                        break
            elif not zygote.request():
                return
        ended = _reap()
        if ended:
            zygote.forget(ended)
        if ended or zygote.draining:
            zygote.ungroup(ended)
        if len(zygote.spares) < zygote.wanted:
            zygote.clone_spare()


def _reap() -> set[int]:
    """Collect ended inits (their statuses went to the server on their own pipes)."""
    ended: set[int] = set()
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.add(pid)


if __name__ == "__main__":
    serve(int(sys.argv[1]), json.loads(sys.argv[2]))
