"""The runs' template interpreter and the run inits it clones (the zygote, ``jail.py``, asks).

A fresh ``python3`` spends ~10 ms of CPU starting before a HumanEval program's first line, most of
a run. So the zygote starts the image's ``python3`` once, with the options and the environment a
run's has (``-u``; the runner's variables), on this file: the *template*. It imports what a plain
start does, plus what the system calls below need (``ctypes``, ``_socket``, ``resource``…; a
program's process drops them from ``sys.modules``), and never receives a run's data: asked for
a spare (its run groups and a channel, nothing else) it clones one into new mount, pid, IPC and
network namespaces, as the zygote's child (``CLONE_PARENT``), and answers its
pid. The spare is a run's init (``spare``): it makes its namespaces ready, waits for its run on
its channel, and then either ``fork``s the program's process, which runs the run's script in the
interpreter it already is (``Program``: a fresh ``__main__``, the run's ``sys.argv``, path,
environment and descriptors; the modules a plain start has, no others), or, for any other program
or a run whose start would differ from the template's, ``posix_spawn``s it. Each spare serves one
run; each program's process runs one program and exits.

What forked runs share with the template, and so with each other, is what it was before any run:
the hash seed (``PYTHONHASHSEED``) and the address layout of its memory (ASLR is per exec). What
a program's process shows in ``/proc/self/cmdline`` and ``environ`` is the template's start; its
``sys.argv``, ``sys.orig_argv`` and ``os.environ`` are its run's.

This file runs as the template's script under the image's interpreter (3.10 or later; the zygote
falls back to cloning spares itself, with ``posix_spawn`` only, when that fails), so it uses only
the standard library. The server imports it for ``RunReport``.
"""

import sys

_PLAIN_START = frozenset(sys.modules)  # before this file's imports: what a program's process keeps

import ctypes  # noqa: E402 - after the snapshot of a plain start's modules
import gc  # noqa: E402
import marshal  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import struct  # noqa: E402
import time  # noqa: E402
from _signal import (  # type: ignore[import-not-found]  # noqa: E402
    SIG_DFL,
    SIG_IGN,
    SIGCHLD,
    SIGHUP,
    SIGINT,
    SIGKILL,
    SIGPIPE,
    SIGTERM,
    SIGXFSZ,
    default_int_handler,
    set_wakeup_fd,
)
from _signal import signal as set_signal  # noqa: E402
from _socket import AF_INET, CMSG_SPACE, SCM_RIGHTS, SOCK_DGRAM, SOL_SOCKET, socket  # noqa: E402

CLONE_PARENT = 0x00008000
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
RUN_NAMESPACES = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY = 0x1
SYS_MOUNT_SETATTR = 442  # x86_64 and aarch64 alike (the new syscall table)
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_READ, PR_CAPBSET_DROP = 23, 24
TOOL_DROPPED = (21, 19)  # CAP_SYS_ADMIN, CAP_SYS_PTRACE
LINUX_CAPABILITY_VERSION_3 = 0x20080522
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
MAX_MESSAGE = 1 << 20  # a request: argv, env and paths (never file contents)
FAILED_TO_ISOLATE = 126
STATUS = struct.Struct("=iddd")  # what a run's init writes as it exits (``RunReport``)
# Python ignores these; a program starts with them at their defaults, as subprocess gives them.
RESET_SIGNALS = (SIGPIPE, SIGXFSZ, SIGCHLD, SIGTERM, SIGINT, SIGHUP)

_libc = ctypes.CDLL(None, use_errno=True)
_pylibc = ctypes.PyDLL(None, use_errno=True)  # holds the GIL through the call (clone)
_pylibc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.syscall.restype = ctypes.c_long
_ARM = os.uname().machine in ("aarch64", "arm64")
_SYS_CLONE, _SYS_CAPGET, _SYS_CAPSET = (220, 90, 91) if _ARM else (56, 125, 126)


class RunReport:
    """How a run went, as its init tells the server when it exits."""

    __slots__ = ("status", "spawned", "init_cpu", "program_cpu")

    def __init__(self, status: int, spawned: float, init_cpu: float, program_cpu: float) -> None:
        self.status = status  # the program's wait status
        self.spawned = spawned  # when (``time.monotonic``: the server's clock too) the program started; 0 if never
        self.init_cpu = init_cpu  # seconds of CPU of the init itself, from its clone (its set-up ahead of demand)
        self.program_cpu = program_cpu  # seconds of CPU of the program and every process of the run reaped

    def pack(self) -> bytes:
        return STATUS.pack(self.status, self.spawned, self.init_cpu, self.program_cpu)

    @classmethod
    def unpack(cls, data: bytes) -> "RunReport":
        return cls(*STATUS.unpack(data))


# -- system calls -----------------------------------------------------------------------------------


def check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    check(_libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
                      flags, data.encode() if data else None), f"mount {target}")


def unshare(flags: int) -> None:
    check(_libc.unshare(flags), "unshare")


def all_read_only() -> None:
    attr = struct.pack("QQQQ", MOUNT_ATTR_RDONLY, 0, 0, 0)
    buf = ctypes.create_string_buffer(attr, len(attr))
    check(_libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, buf, len(attr)), "mount_setattr /")


def die_with_parent() -> None:
    _libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)


def drop_tool_capabilities() -> None:
    """As the server does for its tools: programs never get CAP_SYS_ADMIN or CAP_SYS_PTRACE back."""
    for cap in TOOL_DROPPED:
        if _libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1:
            check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "dropping capabilities")


def _lose_tool_capabilities() -> None:
    """Take CAP_SYS_ADMIN and CAP_SYS_PTRACE out of this process's own sets too: a root run forked
    from here, not executed, has what an executed one gets from the bounding set, no more."""
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # (effective, permitted, inheritable) for capabilities 0-31, then 32-63
    check(_libc.syscall(_SYS_CAPGET, header, data), "capget")
    for cap in TOOL_DROPPED:
        for field in range(3):
            data[3 * (cap // 32) + field] &= ~(1 << (cap % 32)) & 0xFFFFFFFF
    check(_libc.syscall(_SYS_CAPSET, header, data), "capset")


def clone(flags: int) -> int:
    """``clone(2)`` without a new stack: a fork into new namespaces. Python's fork hooks do not
    run in the child, which is fine for this single-threaded process; the GIL stays held."""
    pid = _pylibc.syscall(_SYS_CLONE, flags | SIGCHLD, 0, 0, 0, 0)
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"clone: {os.strerror(err)}")
    return pid


def _loopback_up() -> None:
    s = socket(AF_INET, SOCK_DGRAM)
    try:
        ifreq = ctypes.create_string_buffer(struct.pack("16sh14x", b"lo", 0), 32)
        check(0 if _libc.ioctl(s.fileno(), SIOCGIFFLAGS, ifreq) >= 0 else -1, "SIOCGIFFLAGS lo")
        flags = struct.unpack_from("16sh", ifreq.raw)[1]
        struct.pack_into("h", ifreq, 16, flags | IFF_UP)
        check(0 if _libc.ioctl(s.fileno(), SIOCSIFFLAGS, ifreq) >= 0 else -1, "SIOCSIFFLAGS lo")
    finally:
        s.close()


def recv_with_fds(sock: socket, most: int) -> tuple[bytes, list[int]]:
    """One message and the descriptors that came with it (at most ``most``)."""
    data, ancdata, _flags, _ = sock.recvmsg(MAX_MESSAGE, CMSG_SPACE(4 * most))
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == SOL_SOCKET and kind == SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds += struct.unpack(f"{usable // 4}i", payload[:usable])
    return data, fds


# -- a run's init -------------------------------------------------------------------------------------


def _join(groups: list[str]) -> None:
    """Move this (single-threaded) process into ``groups``, one per controller: "0" written to
    ``tasks`` moves the writer alone, which spares the kernel the lock a write of a pid takes on
    cgroup v1 (an RCU grace period: 12 ms, 40 under load, where this costs 0.3)."""
    for group in groups:
        fd = os.open(os.path.join(group, "tasks"), os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)


def _prepare(groups: list[str]) -> None:
    """What a run's init does before its run is known: into its run groups, its view of the
    sandbox read-only, its own /proc, its loopback up."""
    die_with_parent()  # the zygote gone: the run too
    try:
        _join(groups)  # first: every process of the run is born in them
    except OSError as exc:  # the run is still bounded by the tools' groups
        os.write(2, f"idegym jail: a run without cgroups of its own: {exc}\n".encode(errors="replace"))
    os.setsid()  # the server signals the run's process group, as any command's
    drop_tool_capabilities()
    # The clone copied the zygote's mount namespace (private): nothing propagates back.
    all_read_only()
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this namespace's processes only
    mount("/proc/sys", "/proc/sys", None, MS_BIND | MS_REC)
    mount(None, "/proc/sys", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _loopback_up()


def _isolate(spec: dict) -> None:
    """The run's own files: fresh /tmp and /dev/shm, hidden directories, its directory writable."""
    bind = spec["bind"]
    run_dir = os.open(bind, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # before /tmp is covered
    tmp_bytes = spec["tmp_bytes"]
    tmpfs = f"size={tmp_bytes},nr_inodes={max(tmp_bytes >> 12, 1024)},mode=1777"
    for path in ("/tmp", "/dev/shm"):
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, tmpfs)
    for path in spec["hide"]:
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k,mode=0755")
    parent = os.path.dirname(os.path.normpath(bind))
    fresh = any(parent == d or parent.startswith(d + "/") for d in ("/tmp", "/dev/shm"))
    if not fresh and parent != "/":  # runs' directories elsewhere ($TMPDIR): none but its own seen
        mount("tmpfs", parent, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,nr_inodes=64,mode=0755")
    os.makedirs(bind, exist_ok=True)
    mount(f"/proc/self/fd/{run_dir}", bind, None, MS_BIND)
    mount(None, bind, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV)  # writable again
    os.close(run_dir)


def _become(spec: dict) -> None:
    os.setgroups(spec["groups"])
    os.setresgid(spec["gid"], spec["gid"], spec["gid"])
    os.setresuid(spec["uid"], spec["uid"], spec["uid"])
    if spec["uid"] == 0:  # (another user has none left)
        _lose_tool_capabilities()
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # nothing it executes gains privileges (setuid bits)
    os.chdir(spec["cwd"])


def executable(name: str, env: dict[str, str]) -> str:
    if "/" in name:
        return name
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(directory or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(f"{name!r} is not on PATH")


class Program:
    """What a program's process runs, in the interpreter it was forked as: its script's source
    and path, and the fresh ``__main__`` it runs in (this file's ``__main__`` block)."""

    def __init__(self, source: bytes, path: str, main: dict) -> None:
        self.source = source
        self.path = path
        self.main = main


class _Template:
    """What the template started as, which a forked run's start must equal (``forkable``)."""

    def __init__(self, per_run: tuple[str, ...], started_as: str) -> None:
        self.executable = os.path.realpath(started_as)  # what a run's argv[0] must be (a shim, perhaps)
        self.options = list(sys.orig_argv[1:sys.orig_argv.index(sys.argv[0])])  # e.g. ["-u"]
        self.per_run = per_run  # variables each run sets for itself (HOME, TMPDIR…): read after the start
        with open("/proc/self/environ", "rb") as fh:  # as given, before the interpreter's start changed it
            given = dict(item.decode(errors="surrogateescape").split("=", 1)
                         for item in fh.read().split(b"\0") if b"=" in item)
        self.env = {k: v for k, v in given.items() if k not in per_run}
        # what the start set (LC_CTYPE when it coerced the C locale): a forked run's environment has it too
        self.added = {k: v for k, v in os.environ.items() if given.get(k) != v}
        self.path0 = sys.path[0]

    def forkable(self, argv: list[str], env: dict[str, str]) -> str | None:
        """The script of a run whose interpreter would start as the template did (same binary,
        options and environment but the per-run variables), else None."""
        n = len(self.options)
        if len(argv) < n + 2 or argv[1:n + 1] != self.options or argv[n + 1].startswith("-"):
            return None
        if {k: v for k, v in env.items() if k not in self.per_run} != self.env:
            return None
        try:
            if os.path.realpath(executable(argv[0], env)) != self.executable:
                return None
        except FileNotFoundError:
            return None
        return argv[n + 1]


_template: _Template | None = None  # set in the template process (``serve``)


def _forked(spec: dict, script: str) -> Program:
    """In a program's process just forked from its init: become what ``python3 -u script args``
    would have started as, or exec it when that cannot be told apart (a user site-packages
    directory in the run's HOME)."""
    assert _template is not None
    argv, env = spec["argv"], spec["env"]
    os.closerange(3, 1 << 20)  # what a fresh program has: the run's stdin, stdout and stderr
    set_signal(SIGINT, default_int_handler)  # as Python's start sets it
    os.environ.clear()
    os.environ.update(env, **_template.added)
    site = sys.modules.get("site")
    if site is not None and site.ENABLE_USER_SITE:
        vars(site).update(USER_BASE=None, USER_SITE=None)  # computed from HOME at the start: the run's
        if os.path.isdir(site.getusersitepackages()):
            os.execve(executable(argv[0], env), argv, env)
    path = os.path.abspath(script)
    try:
        with open(path, "rb") as fh:
            source = fh.read()
    except OSError:  # python3 itself says so, and how it exits
        os.execve(executable(argv[0], env), argv, env)
    for name in [m for m in sys.modules if m not in _PLAIN_START]:
        del sys.modules[name]
    main = type(sys)("__main__")
    sys.modules["__main__"] = main
    loader = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", path)
    main.__dict__.update(__file__=path, __cached__=None, __loader__=loader, __builtins__=sys.modules["builtins"],
                         __annotations__={})
    sys.argv = [script, *argv[len(_template.options) + 2:]]
    sys.orig_argv = [argv[0], *argv[1:]]
    sys.path_importer_cache.pop(_template.path0, None)
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    return Program(source, path, main.__dict__)


def spare(channel: socket, groups: list[str]) -> Program | None:
    """Pid 1 of a run's namespaces, cloned before the run is asked for: prepares what it can,
    waits for its run, isolates it, takes the run's user, starts the program (forked when the
    template can be it, else ``posix_spawn``ed), reaps, and exits as the program did. The kernel
    then kills whatever is left in the namespace. Returns only in a forked program's process."""
    unprepared: BaseException | None = None
    try:
        _prepare(groups)
    except BaseException as exc:  # noqa: BLE001 - said when the run comes
        unprepared = exc
    try:
        data, fds = recv_with_fds(channel, 4)
    except OSError:
        data, fds = b"", []
    if not data or len(fds) != 4:
        os._exit(0)  # retired unused (the zygote's end closed)
    channel.close()
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds[:3]:
        os.close(fd)
    status_fd = fds[3]
    os.set_inheritable(status_fd, False)  # the program never writes the init's report
    spawned = 0.0
    try:
        if unprepared is not None:
            raise unprepared
        spec = marshal.loads(data)
        _isolate(spec)
        _become(spec)
        script = _template.forkable(spec["argv"], spec["env"]) if _template is not None else None
        if script is not None:
            program = os.fork()
            if program == 0:
                try:
                    return _forked(spec, script)
                except BaseException as exc:  # noqa: BLE001 - before the program's first line
                    os.write(2, f"idegym: could not start the isolated run: {exc}\n".encode(errors="replace"))
                    os._exit(FAILED_TO_ISOLATE)
        else:
            program = os.posix_spawn(executable(spec["argv"][0], spec["env"]), spec["argv"], spec["env"],
                                     setsigdef=RESET_SIGNALS, setsigmask=())
        spawned = time.monotonic()  # the clock is the server's: no time namespace of its own
    except BaseException as exc:  # noqa: BLE001 - a run that cannot start says why and exits
        try:
            os.write(2, f"idegym: could not start the isolated run: {exc}\n".encode(errors="replace"))
        finally:
            _end(status_fd, (127 if isinstance(exc, FileNotFoundError) else FAILED_TO_ISOLATE) << 8, spawned)
    set_signal(SIGINT, SIG_IGN)  # pid 1 with a handler would take a run's kill -INT 1
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


def clone_spare(flags: int, channel_fd: int, groups: list[str], close: tuple[int, ...]) -> Program | int:
    """Clone one spare (``flags``: the run's namespaces, ``CLONE_PARENT`` from the template): its
    pid here; in the spare, what ``spare`` returns (a program's process only). ``close``: the
    cloner's descriptors the spare must not keep."""
    pid = clone(flags)
    if pid:
        return pid
    set_wakeup_fd(-1)
    set_signal(SIGCHLD, SIG_DFL)
    for fd in close:
        os.close(fd)
    program = spare(socket(fileno=channel_fd), groups)
    assert program is not None
    return program


# -- the template ---------------------------------------------------------------------------------------


def serve(fd: int, per_run: tuple[str, ...], started_as: str) -> Program:
    """The template's loop: a spare cloned for each request of the zygote (its run groups and
    channel, nothing of a run), its pid answered. Returns only in a forked program's process."""
    global _template
    die_with_parent()
    drop_tool_capabilities()
    _template = _Template(per_run, started_as)
    control = socket(fileno=fd)
    # Out of the collector's sight: a program's collections never touch (and copy) the template's objects.
    gc.freeze()
    control.send(marshal.dumps(os.getpid()))  # ready
    while True:
        try:
            data, fds = recv_with_fds(control, 1)
        except InterruptedError:
            continue
        if not data:
            os._exit(0)  # the zygote is gone
        reply: object
        try:
            if len(fds) != 1:
                raise ValueError(f"a spare needs its channel, got {len(fds)} fds")
            made = clone_spare(RUN_NAMESPACES | CLONE_PARENT, fds[0], marshal.loads(data), (fd,))
        except Exception as exc:  # noqa: BLE001 - answered, never fatal
            reply = f"the template could not clone a spare: {exc}"
        else:
            if isinstance(made, Program):
                return made  # in a program's process
            reply = made
        for received in fds:
            os.close(received)
        control.send(marshal.dumps(reply))


def exit_code(exc: SystemExit) -> int:
    """The exit status ``python3`` gives an uncaught ``SystemExit`` (printing a non-integer code)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def exit_forked(main: dict, code: int, interrupted: bool) -> None:
    """End a forked program as the interpreter's exit would, as far as a program can tell: its
    non-daemon threads joined, its ``atexit`` callbacks run, its globals released (their
    finalizers run, files it left open flushed), output flushed, the status (or SIGINT's death).
    The template's objects are not torn down: that would copy every page the program shares with
    it (~4 ms, as much as the run saves)."""
    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()
    import atexit

    atexit._run_exitfuncs()
    _flush_stdio()
    for name in ("last_type", "last_value", "last_traceback"):
        sys.__dict__.pop(name, None)
    main.clear()
    gc.collect()
    _flush_stdio()
    if interrupted:
        set_signal(SIGINT, SIG_DFL)
        os.kill(os.getpid(), SIGINT)
    try:
        os._exit(code)
    except OverflowError:
        os._exit(-1)


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001 - as the interpreter's exit ignores it
            pass


if __name__ == "__main__":
    # Returns only in a forked program's process, which runs its script here, as ``python3 script``
    # would but for this frame: an uncaught exception is printed without it.
    _program = serve(int(sys.argv[1]), tuple(filter(None, sys.argv[2].split(","))), sys.argv[3])
    _code, _interrupted = 0, False
    try:
        exec(compile(_program.source, _program.path, "exec", dont_inherit=True), _program.main)
    except SystemExit as _exit:
        _code = exit_code(_exit)
    except BaseException as _exc:
        _tb = _exc.__traceback__.tb_next if _exc.__traceback__ is not None else None
        _exc.__traceback__ = _tb
        sys.last_type, sys.last_value, sys.last_traceback = type(_exc), _exc, _tb
        sys.excepthook(type(_exc), _exc, _tb)
        _code, _interrupted = 1, type(_exc) is KeyboardInterrupt
    exit_forked(_program.main, _code, _interrupted)
