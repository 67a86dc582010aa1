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
import ctypes
import fcntl
import json
import os
import platform
import resource
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY = 0x1
SYS_MOUNT_SETATTR = 442  # x86_64 and aarch64 alike (the new syscall table)
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_READ, PR_CAPBSET_DROP = 23, 24
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
MAX_MESSAGE = 1 << 20  # a request: argv, env and paths (never file contents)
FAILED_TO_ISOLATE = 126
STATUS = struct.Struct("=iddd")  # what a run's init writes as it exits (``RunReport``)
RUN_PIDS_MAX = 256  # processes of one run (its init included): a fork bomb in one never starves the others
RUN_GROUP_PREFIX = "run-"
# Python ignores these; a program starts with them at their defaults, as subprocess gives them.
RESET_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class Isolation:
    """What of the sandbox an isolated run keeps (the caller's part of a ``RunSpec``)."""

    bind: str  # the run's directory: bound writable at the same path, everything else read-only
    tmp_bytes: int = 256 << 20  # bound of the run's own /tmp and /dev/shm (each)
    hide: tuple[str, ...] = ()  # directories replaced by an empty read-only tmpfs


@dataclass(frozen=True)
class RunReport:
    """How a run went, as its init tells the server when it exits."""

    status: int  # the program's wait status
    spawned: float  # when (``time.monotonic``: the server's clock too) the program was spawned; 0 if never
    init_cpu: float  # seconds of CPU of the init itself, from its clone (its set-up ahead of demand too)
    program_cpu: float  # seconds of CPU of the program and of every process of the run the init reaped

    def pack(self) -> bytes:
        return STATUS.pack(self.status, self.spawned, self.init_cpu, self.program_cpu)

    @classmethod
    def unpack(cls, data: bytes) -> RunReport:
        return cls(*STATUS.unpack(data))


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
        ok = _libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET) == 0
        try:
            if ok:  # what the zygote's own view takes (mount_setattr: Linux 5.12)
                _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount /")
                _all_read_only()
        except OSError:
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    return "" if status == 0 else "this kernel or sandbox refuses new mount/pid/IPC/network namespaces"


# -- the zygote ---------------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_pylibc = ctypes.PyDLL(None, use_errno=True)  # holds the GIL through the call (clone)
_pylibc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.syscall.restype = ctypes.c_long


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
                       flags, data.encode() if data else None), f"mount {target}")


def _all_read_only() -> None:
    attr = struct.pack("QQQQ", MOUNT_ATTR_RDONLY, 0, 0, 0)
    buf = ctypes.create_string_buffer(attr, len(attr))
    _check(_libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, buf, len(attr)), "mount_setattr /")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sh14x", b"lo", flags | IFF_UP))


def _join(groups: Sequence[str]) -> None:
    """Move this (single-threaded) process into ``groups``, one per controller: "0" written to
    ``tasks`` moves the writer alone, which spares the kernel the lock a write of a pid takes on
    cgroup v1 (an RCU grace period: 12 ms, 40 under load, where this costs 0.3)."""
    for group in groups:
        _write(os.path.join(group, "tasks"), "0")


def _prepare(groups: Sequence[str]) -> None:
    """What a run's init does before its run is known (as a spare, ``_Zygote``): into its run
    groups, its view of the sandbox read-only, its own /proc, its loopback up."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the zygote gone: the run too
    try:
        _join(groups)  # first: every process of the run is born in them
    except OSError as exc:  # the run is still bounded by the tools' groups
        os.write(2, f"idegym jail: a run without cgroups of its own: {exc}\n".encode(errors="replace"))
    os.setsid()  # the server signals the run's process group, as any command's
    # The clone copied the zygote's mount namespace (``_private_view``): nothing propagates back.
    _all_read_only()
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this namespace's processes only
    _mount("/proc/sys", "/proc/sys", None, MS_BIND | MS_REC)
    _mount(None, "/proc/sys", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _loopback_up()


def _isolate(spec: RunSpec) -> None:
    """The run's own files: fresh /tmp and /dev/shm, hidden directories, its directory writable."""
    run_dir = os.open(spec.bind, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # before /tmp is covered
    tmpfs = f"size={spec.tmp_bytes},nr_inodes={max(spec.tmp_bytes >> 12, 1024)},mode=1777"
    for path in ("/tmp", "/dev/shm"):
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, tmpfs)
    for path in spec.hide:
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k,mode=0755")
    parent = os.path.dirname(os.path.normpath(spec.bind))
    fresh = any(parent == d or parent.startswith(d + "/") for d in ("/tmp", "/dev/shm"))
    if not fresh and parent != "/":  # runs' directories elsewhere ($TMPDIR): none but its own seen
        _mount("tmpfs", parent, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,nr_inodes=64,mode=0755")
    os.makedirs(spec.bind, exist_ok=True)
    _mount(f"/proc/self/fd/{run_dir}", spec.bind, None, MS_BIND)
    _mount(None, spec.bind, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV)  # writable again
    os.close(run_dir)


def _become(spec: RunSpec) -> None:
    os.setgroups(spec.groups)
    os.setresgid(spec.gid, spec.gid, spec.gid)
    os.setresuid(spec.uid, spec.uid, spec.uid)
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # nothing it executes gains privileges (setuid bits)
    os.chdir(spec.cwd)


def _executable(name: str, env: dict[str, str]) -> str:
    if "/" in name:
        return name
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(directory or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(f"{name!r} is not on PATH")


def _spare(channel: socket.socket, groups: Sequence[str]) -> None:
    """Pid 1 of a run's namespaces, cloned into them by the zygote before the run is asked for:
    prepares what it can, waits for its run (``_Zygote.hand_over``), isolates it, takes the run's
    user, starts the program (``posix_spawn``), reaps, and exits as the program did. The kernel
    then kills whatever is left in the namespace."""
    unprepared: BaseException | None = None
    try:
        _prepare(groups)
    except BaseException as exc:  # noqa: BLE001 - said when the run comes
        unprepared = exc
    fds = array.array("i")
    try:
        data, ancdata, _flags, _ = channel.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(4 * fds.itemsize))
    except OSError:
        data, ancdata = b"", []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    if not data or len(fds) != 4:
        os._exit(0)  # retired unused (the zygote's end closed)
    channel.close()
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds[:3]:
        os.close(fd)
    status_fd = fds[3]
    spawned = 0.0
    try:
        if unprepared is not None:
            raise unprepared
        spec = RunSpec(**json.loads(data))
        _isolate(spec)
        _become(spec)
        program = os.posix_spawn(_executable(spec.argv[0], spec.env), spec.argv, spec.env,
                                 setsigdef=RESET_SIGNALS, setsigmask=())
        spawned = time.monotonic()  # the clock is the server's: no time namespace of its own
    except BaseException as exc:  # noqa: BLE001 - a run that cannot start says why and exits
        try:
            os.write(2, f"idegym: could not start the isolated run: {exc}\n".encode(errors="replace"))
        finally:
            _end(status_fd, (127 if isinstance(exc, FileNotFoundError) else FAILED_TO_ISOLATE) << 8, spawned)
    for fd in (0, 1, 2):
        os.close(fd)  # the run's output ends with its processes, not with this one
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            _end(status_fd, 1 << 8, spawned)
        if pid == program:
            _end(status_fd, status, spawned)


def _end(status_fd: int, status: int, spawned: float) -> None:
    """The init's exit: its ``RunReport`` to the server (one write, under PIPE_BUF, so it
    arrives whole), then the program's exit code."""
    try:
        own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        os.write(status_fd, RunReport(status, spawned, own.ru_utime + own.ru_stime,
                                      reaped.ru_utime + reaped.ru_stime).pack())
    finally:
        code = os.waitstatus_to_exitcode(status)
        os._exit(128 - code if code < 0 else code)


def _clone(flags: int) -> int:
    """``clone(2)`` without a new stack: a fork into new namespaces. Python's fork hooks do not
    run in the child, which is fine for this single-threaded process; the GIL stays held."""
    if platform.machine() in ("aarch64", "arm64"):
        pid = _pylibc.syscall(220, flags | signal.SIGCHLD, 0, 0, 0, 0)
    else:
        pid = _pylibc.syscall(56, flags | signal.SIGCHLD, 0, 0, 0, 0)
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"clone: {os.strerror(err)}")
    return pid


def _drop_tool_capabilities() -> None:
    # As the server does for its tools: programs never get CAP_SYS_ADMIN or CAP_SYS_PTRACE back.
    for cap in (21, 19):
        if _libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1:
            _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "dropping capabilities")


def _private_view() -> None:
    """Put the zygote in a mount namespace of its own, a private copy of the sandbox's: every
    run's namespace is cloned from it, so no run pays for making its mounts private (milliseconds:
    the propagation of every mount changes), and nothing a run mounts reaches the sandbox."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)


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


class _Zygote:
    """The zygote's state: the server's socket and a pool of *spares*, inits cloned ahead of
    demand (fresh namespaces made, read-only view and /proc ready), so that a run starts with what
    is its own only. The pool holds as many spares as runs may go on at once (``spares``): the
    zygote refills it one clone at a time whenever no request waits, so runs that come together
    each find one instead of waiting for a clone."""

    def __init__(self, sock: socket.socket, cgroups: Mapping[str, str] | None = None, pids_max: int | None = None,
                 memory_max: int | None = None, spares: int = 1) -> None:
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
        """One more spare for the pool."""
        slot = None
        if self.cgroups:
            try:
                slot = self._slot()
            except OSError as exc:  # the run is still bounded by the tools' groups
                os.write(2, f"idegym jail: no cgroups of its own for the next run: {exc}\n".encode())
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = _clone(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET)
        except BaseException:
            if slot is not None:
                self.free.append(slot)
            raise
        if pid == 0:  # pragma: no cover - runs in the spare
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            # nothing of the zygote's nor of the other spares (their channels, their pidfds)
            others = [fd for spare in self.spares for fd in (spare.channel.fileno(), spare.pidfd)]
            for fd in (self.sock.fileno(), self.wake_r, self.wake_w, ours.fileno(), *others):
                os.close(fd)
            _spare(theirs, [os.path.join(group, slot) for group in self.cgroups] if slot else [])
        theirs.close()
        spare = _Spare(pid, ours, os.pidfd_open(pid))
        if slot is not None:
            self.slot_of[pid] = slot
        self.spares.append(spare)
        return spare

    def hand_over(self, data: bytes, spec: RunSpec, fds: array.array) -> int:
        """Give the run to a spare of the pool (cloning one when there is none): the init's pid.
        Each spare is used once: its channel is closed once it has its run."""
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
        """Spares that died waiting (killed) leave the pool; the loop clones others."""
        for spare in [s for s in self.spares if s.pid in ended]:
            self.spares.remove(spare)
            spare.discard()

    def request(self) -> bool:
        """One request from the server, answered; False once the server is gone."""
        data, fds = recv_with_fds(self.sock, 16)
        if not data:
            return False
        try:
            if len(fds) != 4:
                raise ValueError(f"a run needs stdin, stdout, stderr and a status pipe, got {len(fds)} fds")
            pid = self.hand_over(data, RunSpec(**json.loads(data)), fds)
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
    spare cloned; ended inits reaped."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    _private_view()
    _drop_tool_capabilities()
    zygote = _Zygote(socket.socket(fileno=fd), config.get("cgroups"), config.get("pids_max"),
                     config.get("memory_max"), config.get("spares", 1))
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
