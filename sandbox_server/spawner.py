"""Tools started by a process that already is their user: no user switch, no thread hop per call.

A root server that runs a tool as the tool user (``appuser``) would otherwise execute a helper
that switches users (``native/idegym-as-user``, or setpriv) for every call, or fork itself
without vfork (``Popen(user=...)``). Instead the server starts one *spawner* per tool user, a
small static C program (``native/spawner.c``, built by ``make``; without it tools start the long
way, ``process.Supervisor``). The server starts it with ``posix_spawn`` from its thread that lives
in the tools' cgroups, so it is born in them (moving it there would hold up every fork on the
host for an RCU grace period: ~10 ms of a sandbox's first call), and nothing of the server's
memory is copied (~0.1 MiB PSS a sandbox, where a fork of the Python server cost ~3). It takes
the tool user's oom_score_adj while still root, then becomes the user (groups, gid, uid: no
capability left), dies with the server (parent-death signal, set after the uid change that would
clear it) and is made non-dumpable, so that the user's own processes can neither ptrace it nor
read its memory, environment or descriptors. It keeps no descriptor but its socket (and a copy of
each running tool's stdout and stderr, closed just before it tells the tool's end: the server then
sees the pipes end with that message, in one wake-up, and finds them at their end when it reads
it, with nothing to watch; a timeout spares it as their holder). It starts
each tool with ``posix_spawn`` (vfork and exec) in a new session, so a tool is born in the tools'
groups as the user; the server watches it as before (its pid, its process group, its call mark)
and learns its wait status from the spawner, on the same socket (no descriptor of its own per
call: each one a loop's watcher costs ~20 us to add and remove).

The tool user can kill or stop its spawner (it is the same user); that costs it nothing but its
own calls: a spawner that is gone, or never read the request (stopped: no answer within
``ANSWER_TIMEOUT`` while it is stopped, the request still in its socket; one that runs but is slow,
on a loaded host, is waited for up to ``ANSWER_LIMIT``), is replaced and the call is started the
long way; one that went after it had read the request is killed, and so is whatever of that call
may have started (found by its call mark): the call answers exit 126 and says why, and is never
run twice. The next call starts a fresh spawner. A tool whose spawner died or stopped is
re-parented to the server (a subreaper), which then reaps it itself; the spawner reaps a tool
only after it said how it ended, so a status is never lost between the two. A stopped spawner is
noticed by a tool that has ended without its status (a tool still running after ``STATUS_GRACE``
is watched by its pidfd; a short call has no watch). Reward checks and grading never use a
spawner. A spawner that cannot be started, or fails its set-up, is reported once and no other is
tried: tools then start the long way.

It is started with the server (``Supervisor.start_spawner``, in the background: a call that comes
meanwhile waits for it), so that a new sandbox's first call costs what a later one does; one that
died is started again at the next call. A project reset or ``/api/processes/terminate``, which
ends everything else the episode started, keeps it when it is ``pristine`` (its user may have
changed its resource limits, priority or CPU affinity, which the next episode's tools would
inherit: then it is replaced).

The protocol (both ends are ours; ``native/spawner.c`` has the details): the spawner's first
message says it is ready (or why not); then each request (cwd, argv and environment as
NUL-terminated strings after their counts, with stdin, stdout and stderr as SCM_RIGHTS
descriptors) is answered in order with the tool's pid, or an errno and why not; each tool's end
is told after its answer, with its pid and wait status. A bash call, which waits for the tool's
end anyway, lets its answer wait for it (``ANSWER_HOLD``): a quick tool's answer and end then come
together, one wake-up of the server instead of two. A request longer than the socket takes
(``Spawner.max_request``: its send buffer, raised to ``MAX_REQUEST`` as far as the kernel allows)
is not sent: that tool starts the long way.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import fcntl
import functools
import os
import signal
import socket
import struct
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence

from . import procfs
from .run_template import RESET_SIGNALS

SPAWNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native", "idegym-spawner")
SOCKET_FD = 3  # the spawner's end of the socket, as spawner.c expects it
MAX_REQUEST = 2 << 20  # the longest request spawner.c reads (its MAX_REQUEST)
MESSAGE = struct.Struct("=iii")  # kind, pid, errno (ANSWERED) or wait status (EXITED); then a short text
ANSWERED, EXITED = 0, 1
COUNTS = struct.Struct("=III")  # a request's argc, envc and hold (microseconds)
# How long a tool's answer may wait for its end (spawner.c holds it back): a tool that ends
# sooner has its answer and its end reach the server together, one wake-up of it, not two.
ANSWER_HOLD = 0.005
SIOCOUTQ = 0x5411  # bytes sent on a socket and not yet read by its peer
ANSWER_TIMEOUT = 2.0  # a spawner stopped by its user: the call goes the long way after this
# A spawner that runs (it is not stopped) but has not answered is slow, on a loaded host: it is
# given up on only after this long.
ANSWER_LIMIT = 60.0
# A tool still running this long is watched (its pidfd); one that ended this long ago and whose
# spawner, stopped, has not said how is given up on.
STATUS_GRACE = 0.2
_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


def available() -> bool:
    """Whether this server can have spawners: root, and the program built."""
    return os.geteuid() == 0 and os.access(SPAWNER, os.X_OK)


class SpawnRefused(Exception):
    """The spawner could not start the tool (``errno`` as the spawner saw it), or is gone. With
    ``maybe_started`` it went (was killed or stopped) after it had the request: the tool may be
    running, so it must not be started again."""

    def __init__(self, message: str, errno: int = 0, maybe_started: bool = False) -> None:
        super().__init__(message)
        self.errno = errno
        self.maybe_started = maybe_started


class Spawner:
    """The server's handle on the spawner of one tool user."""

    def __init__(self, uid: int, gid: int, groups: Sequence[int], oom_score_adj: bytes) -> None:
        self.key = (uid, gid, tuple(groups))
        self._oom_score_adj = oom_score_adj
        self.pid = 0
        self.max_request = 0
        self.broken = ""  # why it failed its set-up (then no spawner is of use: it is reported once)
        self._ready = False  # it said so: from then on, it may have read what was sent
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._answers: list[tuple[asyncio.Future[int], asyncio.Future[int | None]]] = []  # in request order
        self._exits: dict[int, asyncio.Future[int | None]] = {}  # tools started, by pid, until their end is told
        self._null: int | None = None  # /dev/null for tools without stdin, opened once (an open per call shows)
        self._parent = 0  # the thread that started it, whose priority, limits and affinity it inherited

    @property
    def alive(self) -> bool:
        return self._sock is not None

    async def start(self, loop: asyncio.AbstractEventLoop,
                    launch_on: Callable[[Callable[[], None]], Awaitable[None]] | None = None) -> None:
        """Start the spawner (this process's child), on the thread ``launch_on`` runs a function
        on (to the end, even when the caller is cancelled; the thread that lives in the tools'
        cgroups: the spawner is born in them), else on this one. Raises ``OSError`` when it cannot."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self._sock = ours  # stop() closes it
        try:
            # The longest message a SOCK_SEQPACKET socket takes is its send buffer (less 32 bytes);
            # the kernel holds it to twice net.core.wmem_max (425952 bytes by default).
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_REQUEST)
            self.max_request = min(MAX_REQUEST, ours.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) - 32)
            if launch_on is None:
                self._launch(theirs)
            else:
                await launch_on(functools.partial(self._launch, theirs))
        except BaseException:
            self.stop()  # one that was started all the same (its caller cancelled) is ended
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self._loop = loop
        loop.add_reader(ours.fileno(), self._on_message)

    def _launch(self, theirs: socket.socket) -> None:
        fd = theirs.fileno()
        if fd == SOCKET_FD:  # dup2 onto itself would leave it close-on-exec with some libcs
            fd = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, SOCKET_FD + 1)
        try:
            self._parent = threading.get_native_id()
            self.pid = os.posix_spawn(
                SPAWNER, [SPAWNER, str(self.key[0]), str(self.key[1]), ",".join(map(str, self.key[2])) or "-",
                          self._oom_score_adj.decode()], {},
                file_actions=[(os.POSIX_SPAWN_DUP2, fd, SOCKET_FD),
                              (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                              (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)],
                setsigdef=RESET_SIGNALS, setsigmask=())
        finally:
            if fd != theirs.fileno():
                os.close(fd)

    def pristine(self) -> bool:
        """Whether the spawner has what a fresh one would inherit: nothing its user can change on
        it (resource limits, priority, CPU affinity) differs from the thread that started it, and
        it runs (it is continued if stopped). One that is not is no fit for the next episode's
        tools. (Compared with that thread now, not as it was: a claimed warm sandbox's tasks are
        all given the normal priority, the spawner with them.)"""
        if self._sock is None:
            return False
        try:
            os.kill(self.pid, signal.SIGCONT)
            return _attributes(self.pid) == _attributes(self._parent)
        except OSError:
            return False

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, stdin: int, stdout: int,
                    stderr: int, hold: float = 0.0, extra: Mapping[str, str] | None = None
                    ) -> tuple[int, asyncio.Future[int | None]]:
        """Start a tool: its pid, and a future of its wait status (``None`` when the spawner died
        first: the tool, if it still runs, is then this process's child, re-parented to it).
        With ``hold`` (seconds) the answer may come that much later, with the tool's end. Its
        environment: ``env`` (a ``ToolEnv`` is encoded once) and ``extra``, which must name none
        of ``env``'s variables."""
        if self._sock is None or self._loop is None or self._null is None:
            raise SpawnRefused("the spawner is gone")
        request = _request(argv, env, cwd, hold, extra)
        if len(request) > self.max_request:
            raise SpawnRefused(f"a request of {len(request)} bytes, over the spawner's {self.max_request}")
        loop = self._loop
        answer: asyncio.Future[int] = loop.create_future()
        exit_status: asyncio.Future[int | None] = loop.create_future()
        try:
            self._sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                            array.array("i", [stdin if stdin >= 0 else self._null, stdout, stderr]))])
        except OSError as exc:
            # A message is sent whole or not at all: one the socket has no room for (other
            # requests not read yet, or too long for the kernel) is started the long way.
            if not isinstance(exc, (BlockingIOError, InterruptedError)) and exc.errno not in (
                    errno.EMSGSIZE, errno.ENOBUFS, errno.ENOMEM):
                self.stop()
            raise SpawnRefused(f"the spawner cannot be sent the request: {exc}") from exc
        self._answers.append((answer, exit_status))
        timer = loop.call_later(ANSWER_TIMEOUT, self._unanswered, answer)
        try:
            pid = await answer
        finally:
            timer.cancel()
        if not exit_status.done():
            self._watch_exit(pid, exit_status)
        return pid, exit_status

    def _watch_exit(self, pid: int, exit_status: asyncio.Future[int | None]) -> None:
        """A tool that has exited but whose status does not come (its spawner stopped by the
        user; one that runs is waited for up to ``ANSWER_LIMIT``) ends the spawner: the tool, a
        zombie then re-parented to this process, is reaped here (``Job``) with its true status.
        Watched (a pidfd) only once it has run ``STATUS_GRACE``: most tools end sooner, and their
        status comes without a watcher of their own."""
        assert self._loop is not None
        loop = self._loop
        pidfd: list[int] = []

        def watch() -> None:
            if exit_status.done():
                return
            try:
                pidfd.append(os.pidfd_open(pid))
            except OSError:  # reaped: its status is on the way (the spawner tells before it reaps)
                return
            loop.add_reader(pidfd[0], exited)

        def unwatch() -> None:
            if pidfd:
                loop.remove_reader(pidfd[0])
                os.close(pidfd.pop())

        def exited() -> None:
            unwatch()
            if not exit_status.done():
                loop.call_later(STATUS_GRACE, stop_unless_told, STATUS_GRACE)

        def stop_unless_told(waited: float) -> None:
            if exit_status.done() or self._sock is None:
                return
            # Running but slow (a burst of tools ending on a loaded host): its statuses come.
            # Only a spawner its user stopped (or one silent for ANSWER_LIMIT) is given up.
            state = procfs.stat(self.pid)
            if state is not None and state.state not in ("T", "t", "Z", "X") and waited < ANSWER_LIMIT:
                loop.call_later(STATUS_GRACE, stop_unless_told, waited + STATUS_GRACE)
                return
            self.stop()

        timer = loop.call_later(STATUS_GRACE, watch)

        def told(_: asyncio.Future[int | None]) -> None:
            timer.cancel()
            unwatch()

        exit_status.add_done_callback(told)

    def _unanswered(self, answer: asyncio.Future[int], waited: float = ANSWER_TIMEOUT) -> None:
        if answer.done() or self._sock is None:
            return
        state = procfs.stat(self.pid)
        if state is not None and state.state not in ("T", "t", "Z", "X") and waited < ANSWER_LIMIT:
            assert self._loop is not None  # running, sleeping or in the kernel: slow, not stopped
            self._loop.call_later(ANSWER_TIMEOUT, self._unanswered, answer, waited + ANSWER_TIMEOUT)
            return
        # Stopped by its user, most likely: held still, its socket says whether it ever read the
        # newest request (unread bytes stay charged to our end until it does).
        try:
            os.kill(self.pid, signal.SIGSTOP)
            unread = struct.unpack("i", fcntl.ioctl(self._sock.fileno(), SIOCOUTQ, b"\0" * 4))[0]
        except OSError:
            unread = 0
        message = f"the spawner did not answer within {waited:g} s"
        if unread and self._answers and not self._answers[-1][0].done():
            self._answers.pop()[0].set_exception(SpawnRefused(message))  # never read: nothing of it ran
        if not answer.done():
            answer.set_exception(SpawnRefused(message, maybe_started=self._ready))
        self.stop()

    def _on_message(self) -> None:
        assert self._sock is not None
        while self._sock is not None:
            try:
                data = self._sock.recv(4096)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not self._told(data):  # its end closed (or a message of no spawner of ours)
                self.stop()
                return

    def _told(self, data: bytes) -> bool:
        """Take one message of the spawner; False when it is none (its end closed) or it failed."""
        if len(data) < MESSAGE.size:
            return False
        kind, pid, value = MESSAGE.unpack_from(data)
        if kind == EXITED:
            exit_status = self._exits.pop(pid, None)
            if exit_status is not None and not exit_status.done():
                exit_status.set_result(value)
        elif not self._ready:
            if value:
                self.broken = data[MESSAGE.size:].decode(errors="replace")
                return False
            self._ready = True
        elif self._answers:
            answer, exit_status = self._answers.pop(0)
            if pid > 0:
                # Known now, before any other message: its end may be the next one.
                self._exits[pid] = exit_status
                if not answer.done():
                    answer.set_result(pid)
            elif not answer.done():
                answer.set_exception(SpawnRefused(data[MESSAGE.size:].decode(errors="replace"), value))
        return True

    def stop(self) -> None:
        """End the spawner; the tools it started go on (re-parented to this process). What it
        said before it died is still taken: a tool's end it told is that tool's status."""
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
                _, status = os.waitpid(self.pid, 0)
                if not self._ready and not self.broken and os.WIFEXITED(status):
                    self.broken = f"it exited with {os.WEXITSTATUS(status)} before it was ready"
            except (ProcessLookupError, ChildProcessError):
                pass
            self.pid = 0
        if self._sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())
            sock, self._sock = self._sock, None
            with contextlib.suppress(OSError):
                while self._told(sock.recv(4096, socket.MSG_DONTWAIT)):
                    pass
            sock.close()
        if self._null is not None:
            os.close(self._null)
            self._null = None
        # Requests it had: once it was ready, it may have started their tools.
        for answer, _ in self._answers:
            if not answer.done():
                answer.set_exception(SpawnRefused("the spawner was killed", maybe_started=self._ready))
        self._answers.clear()
        # Tools whose end it did not tell: this process's children now (the spawner is reaped).
        for exit_status in self._exits.values():
            if not exit_status.done():
                exit_status.set_result(None)
        self._exits.clear()


class ToolEnv(Mapping[str, str]):
    """An environment that does not change, encoded as the spawner reads it once: a tool call's
    is the same every time (its user's), and encoding its variables cost every call ~5 us."""

    __slots__ = ("_variables", "_encoded")

    def __init__(self, variables: Mapping[str, str]) -> None:
        self._variables = dict(variables)
        self._encoded: bytes | None = None

    def __getitem__(self, name: str) -> str:
        return self._variables[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._variables)

    def __len__(self) -> int:
        return len(self._variables)

    def __contains__(self, name: object) -> bool:
        return name in self._variables

    def encoded(self) -> bytes:
        if self._encoded is None:
            self._encoded = _encoded_env(self._variables)
        return self._encoded


def _encoded_env(env: Mapping[str, str]) -> bytes:
    if any(not name or "=" in name for name in env):
        raise SpawnRefused("a malformed variable name: not for the spawner")
    return _encoded([f"{name}={value}" for name, value in env.items()])


def _encoded(strings: list[str]) -> bytes:
    """``strings``, each NUL-terminated, as ``os.fsencode`` would encode them; a NUL of their own
    is refused, as ``posix_spawn`` refuses it (the long way then says so)."""
    body = "\0".join(strings) + "\0" if strings else ""
    if body.count("\0") != len(strings):
        raise SpawnRefused("a NUL byte: not for the spawner")
    return body.encode(_FS_ENCODING, _FS_ERRORS)


def _request(argv: Sequence[str], env: Mapping[str, str], cwd: str, hold: float = 0.0,
             extra: Mapping[str, str] | None = None) -> bytes:
    """cwd, argv and the environment (``env``, then ``extra``, which names none of ``env``'s
    variables) as spawner.c reads them."""
    if not argv or not argv[0]:
        raise SpawnRefused("an empty program: not for the spawner")
    added = extra or {}
    variables = (env.encoded() if isinstance(env, ToolEnv) else _encoded_env(env)) + _encoded_env(added)
    return (COUNTS.pack(len(argv), len(env) + len(added), round(hold * 1e6)) + _encoded([cwd, *argv])
            + variables)


def _attributes(pid: int) -> tuple:
    """What a process's (or thread's) own user may change on it and its children would inherit."""
    with open(f"/proc/{pid}/limits") as fh:
        limits = fh.read()
    return limits, os.getpriority(os.PRIO_PROCESS, pid), frozenset(os.sched_getaffinity(pid))


