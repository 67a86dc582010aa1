"""Tools started by a process that already is their user: no setpriv exec, no thread hop per call.

A root server that runs a tool as the tool user (``appuser``) would otherwise execute
``setpriv`` for every call (~1.1 ms: its exec, dynamic linking and capability work, over a
plain vfork and exec of the tool), or fork itself without vfork (``Popen(user=...)``, ~1 ms).
Instead the server forks one *spawner* per tool user: it joins the tools' cgroups and takes the
tool user's oom_score_adj while still root, then becomes the user (groups, gid, uid: no
capability left) and is made non-dumpable, so that the user's own processes can neither ptrace
it nor read its memory or descriptors. It starts each tool with ``posix_spawn`` (vfork and
exec) in a new session, so a tool is born in the tools' groups as the user; the server watches
it as before (its pid, its process group, its call mark) and learns its wait status on a pipe.

The tool user can kill or stop its spawner (it is the same user); that costs it nothing but its
own calls: a spawner that is gone, or never read the request (stopped: no answer within
``ANSWER_TIMEOUT``, the request still in its socket), is replaced and the call is started the
long way (``process.Supervisor``); one that went after it had read the request is killed, and so
is whatever of that call may have started (found by its call mark): the call answers exit 126
and says why, and is never run twice. The next call forks a fresh spawner. A tool whose spawner
died or stopped is re-parented to the server (a subreaper), which then reaps it itself. Reward
checks and grading never use a spawner.

A spawner costs memory: ~3.3 MiB of its own dirty pages (a Python fork copies every page it
writes, refcounts included, out of what it shares with the server) and the server's pages it
pins; at 200 live sandboxes, 5.8 MiB PSS each before their first call, ~9.7 after
(``benchmarks/scale.py``). It is forked at the first tool call, and a project reset or
``/api/processes/terminate``, which ends everything else the episode started, keeps it when it
is ``pristine`` (its user may have changed its resource limits, priority or CPU affinity, which
the next episode's tools would inherit: then it is replaced). The protocol is the isolated runs'
one (``isolated_runs.py``): a JSON request with stdin, stdout, stderr and a status pipe as
SCM_RIGHTS descriptors, answered in order with the pid or an error.
"""

from __future__ import annotations

import array
import asyncio
import ctypes
import fcntl
import gc
import json
import os
import select
import signal
import socket
import struct
from collections.abc import Mapping, Sequence

from .jail import RESET_SIGNALS, _executable, recv_with_fds
from .output import read_available

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
SIOCOUTQ = 0x5411  # bytes sent on a socket and not yet read by its peer
ANSWER_TIMEOUT = 2.0  # a spawner stopped by its user: the call goes the long way after this
STATUS_GRACE = 0.2  # a tool ended this long ago and its spawner has not said how: it is stopped
_libc = ctypes.CDLL(None, use_errno=True)


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

    def __init__(self, uid: int, gid: int, groups: Sequence[int], cgroup_dirs: Sequence[str],
                 oom_score_adj: bytes) -> None:
        self.key = (uid, gid, tuple(groups))
        self._cgroup_dirs = list(cgroup_dirs)
        self._oom_score_adj = oom_score_adj
        self.pid = 0
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._answers: list[asyncio.Future[int]] = []
        self._pristine: tuple = ()

    @property
    def alive(self) -> bool:
        return self._sock is not None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Fork the spawner (it is this process's child); raises ``OSError`` when it cannot."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the spawner; never returns into the server's code
            code = 1
            try:
                ours.close()
                _become(self.key, self._cgroup_dirs, self._oom_score_adj, theirs.fileno())
                code = _serve(theirs)
            except BaseException as exc:  # noqa: BLE001 - said on the server's stderr, then gone
                os.write(2, f"idegym spawner: {type(exc).__name__}: {exc}\n".encode(errors="replace"))
            finally:
                os._exit(code)
        theirs.close()
        self.pid = pid
        self._sock = ours
        self._pristine = _attributes(pid)
        ours.setblocking(False)
        self._loop = loop
        loop.add_reader(ours.fileno(), self._on_message)

    def pristine(self) -> bool:
        """Whether the spawner has what it was given: nothing its user can change on it (resource
        limits, priority, CPU affinity) was changed, and it runs (it is continued if stopped).
        One that is not is no fit for the next episode's tools."""
        if self._sock is None:
            return False
        try:
            os.kill(self.pid, signal.SIGCONT)
            return _attributes(self.pid) == self._pristine
        except OSError:
            return False

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, stdin: int, stdout: int,
                    stderr: int) -> tuple[int, asyncio.Future[int | None]]:
        """Start a tool: its pid, and a future of its wait status (``None`` when the spawner died
        first: the tool, if it still runs, is then this process's child, re-parented to it)."""
        if self._sock is None or self._loop is None:
            raise SpawnRefused("the spawner is gone")
        loop = self._loop
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) if stdin < 0 else None  # subprocess.DEVNULL
        status_r, status_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        answer: asyncio.Future[int] = loop.create_future()
        exit_status: asyncio.Future[int | None] = loop.create_future()
        try:
            self._sock.sendmsg([json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd}).encode()],
                               [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                 array.array("i", [stdin if null is None else null, stdout, stderr, status_w]))])
        except OSError as exc:
            os.close(status_r)
            self.stop()
            raise SpawnRefused(f"the spawner is gone: {exc}") from exc
        finally:
            os.close(status_w)
            if null is not None:
                os.close(null)
        self._answers.append(answer)
        timer = loop.call_later(ANSWER_TIMEOUT, self._unanswered, answer)
        try:
            pid = await answer
        except BaseException:
            os.close(status_r)
            raise
        finally:
            timer.cancel()
        loop.add_reader(status_r, _read_status, loop, status_r, exit_status)
        self._watch_exit(pid, exit_status)
        return pid, exit_status

    def _watch_exit(self, pid: int, exit_status: asyncio.Future[int | None]) -> None:
        """A tool that has exited but whose status does not come (its spawner stopped by the
        user) ends the spawner: the tool, a zombie then re-parented to this process, is reaped
        here (``Job``) with its true status."""
        assert self._loop is not None
        loop = self._loop
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # already gone and reaped: its status is on the pipe
            return

        watching = [True]

        def unwatch() -> None:
            if watching[0]:
                watching[0] = False
                loop.remove_reader(pidfd)
                os.close(pidfd)

        def exited() -> None:
            unwatch()
            if not exit_status.done():
                loop.call_later(STATUS_GRACE, lambda: exit_status.done() or self.stop())

        def told(_: asyncio.Future[int | None]) -> None:
            unwatch()

        loop.add_reader(pidfd, exited)
        exit_status.add_done_callback(told)

    def _unanswered(self, answer: asyncio.Future[int]) -> None:
        if answer.done() or self._sock is None:
            return
        # Stopped by its user, most likely: held still, its socket says whether it ever read the
        # newest request (unread bytes stay charged to our end until it does).
        try:
            os.kill(self.pid, signal.SIGSTOP)
            unread = struct.unpack("i", fcntl.ioctl(self._sock.fileno(), SIOCOUTQ, b"\0" * 4))[0]
        except OSError:
            unread = 0
        message = f"the spawner did not answer within {ANSWER_TIMEOUT} s"
        if unread and self._answers and not self._answers[-1].done():
            self._answers.pop().set_exception(SpawnRefused(message))  # never read: nothing of it ran
        if not answer.done():
            answer.set_exception(SpawnRefused(message, maybe_started=True))
        self.stop()

    def _on_message(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(4096)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.stop()
                return
            message = json.loads(data)
            if self._answers:
                answer = self._answers.pop(0)
                if answer.done():
                    continue
                if "error" in message:
                    answer.set_exception(SpawnRefused(message["error"], message.get("errno", 0)))
                else:
                    answer.set_result(message["pid"])

    def stop(self) -> None:
        """End the spawner; the tools it started go on (re-parented to this process)."""
        if self._sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        for answer in self._answers:  # requests it had: it may have started their tools
            if not answer.done():
                answer.set_exception(SpawnRefused("the spawner was killed", maybe_started=True))
        self._answers.clear()
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.pid = 0


def _attributes(pid: int) -> tuple:
    """What a process's own user may change on it and its children would inherit."""
    with open(f"/proc/{pid}/limits") as fh:
        limits = fh.read()
    return limits, os.getpriority(os.PRIO_PROCESS, pid), frozenset(os.sched_getaffinity(pid))


def _read_status(loop: asyncio.AbstractEventLoop, fd: int, exit_status: asyncio.Future[int | None]) -> None:
    data = read_available(fd, 4)
    if data is None:
        return
    loop.remove_reader(fd)
    os.close(fd)
    if not exit_status.done():
        exit_status.set_result(struct.unpack("i", data)[0] if len(data) == 4 else None)


# -- the spawner -------------------------------------------------------------------------------------


def _become(key: tuple[int, int, tuple[int, ...]], cgroup_dirs: Sequence[str], oom_score_adj: bytes,
            keep: int) -> None:
    """In the fresh fork, still root: what the tools inherit, then the tool user for good."""
    gc.disable()  # no collection walks (and so copies) the pages shared with the server
    gc.freeze()
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # dies with the server
    if os.getppid() == 1:  # the server died before the line above
        os._exit(1)
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)
    for directory in cgroup_dirs:
        with open(os.path.join(directory, "cgroup.procs"), "w") as fh:
            fh.write("0")
    with open("/proc/self/oom_score_adj", "wb") as fh:
        fh.write(oom_score_adj)
    uid, gid, groups = key
    os.setgroups(list(groups))
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # every capability gone with root
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the user's processes cannot ptrace or read it


def _serve(sock: socket.socket) -> int:
    """Requests in, tools started and their pids out; each ended tool's wait status to its pipe."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    running: dict[int, int] = {}  # pid -> its status pipe
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        for ready, _ in poller.poll():
            if ready == wake_r:
                _drain(wake_r)
            elif not _request(sock, running):
                return 0
        _reap(running)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _request(sock: socket.socket, running: dict[int, int]) -> bool:
    # Little Python runs here, and nothing of subprocess: every object a call touches has its
    # page copied out of what the spawner shares with the server (~2 MiB a sandbox with Popen).
    data, fds = recv_with_fds(sock, 4, socket.MSG_CMSG_CLOEXEC)
    if not data:
        return False
    try:
        if len(fds) != 4:
            raise ValueError(f"a tool needs stdin, stdout, stderr and a status pipe, got {len(fds)} fds")
        request = json.loads(data)
        env = request["env"]
        os.chdir(request["cwd"])
        # A new session, the signals Python ignores back at their defaults, only 0-2 inherited
        # (the received descriptors are close-on-exec): what Popen(start_new_session=True) gives.
        pid = os.posix_spawn(_executable(request["argv"][0], env), request["argv"], env, setsid=True,
                             file_actions=[(os.POSIX_SPAWN_DUP2, fds[0], 0), (os.POSIX_SPAWN_DUP2, fds[1], 1),
                                           (os.POSIX_SPAWN_DUP2, fds[2], 2)],
                             setsigdef=RESET_SIGNALS, setsigmask=())
    except Exception as exc:  # noqa: BLE001 - answered; the server starts the tool the long way
        sock.send(json.dumps({"error": str(exc), "errno": getattr(exc, "errno", None) or 0}).encode())
        for fd in fds:
            os.close(fd)
        return True
    for fd in fds[:3]:
        os.close(fd)
    running[pid] = fds[3]
    sock.send(json.dumps({"pid": pid}).encode())
    return True


def _reap(running: dict[int, int]) -> None:
    while running:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        status_fd = running.pop(pid, -1)
        if status_fd >= 0:
            try:
                os.write(status_fd, struct.pack("i", status))
            except OSError:
                pass
            os.close(status_fd)
