"""Running tool processes: process groups, bounded output, timeouts that kill everything.

One ``Supervisor`` per server. It makes the server a child subreaper, so every process a tool
starts — including daemons that double-fork and ``setsid`` away — stays a descendant of the
server and can be found and ended by ``kill_descendants`` (used by project reset). Exits are
watched through pidfds (no signal handler); orphans re-parented to us are reaped periodically,
so they never linger as zombies.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import logging
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .output import BoundedOutput

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36
F_SETPIPE_SZ = 1031
READ_CHUNK = 1 << 20
PIPE_SIZE = 1 << 20
DEFAULT_PIPE_SIZE = 1 << 16
# After the command's main process exits, how long to wait for the pipes to close: a background
# child that inherited them would otherwise hold the call open.
EXIT_LINGER = 0.1
MAX_DRAINERS = 256


@dataclass(frozen=True)
class UserSpec:
    name: str
    uid: int
    gid: int
    home: str
    shell: str

    @classmethod
    def lookup(cls, name_or_uid: str) -> UserSpec:
        """Raises ``KeyError`` when the user does not exist in this (sandbox's) passwd database."""
        entry = pwd.getpwuid(int(name_or_uid)) if name_or_uid.isdigit() else pwd.getpwnam(name_or_uid)
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir, entry.pw_shell or "/bin/bash")

    @classmethod
    def current(cls) -> UserSpec:
        try:
            return cls.lookup(str(os.getuid()))
        except KeyError:
            uid = os.getuid()
            return cls(str(uid), uid, os.getgid(), os.environ.get("HOME", "/"), "/bin/bash")


@dataclass
class ProcessResult:
    exit_code: int
    stdout: BoundedOutput
    stderr: BoundedOutput
    timed_out: bool
    duration: float


class _Job:
    """One running command: done once it has exited and its pipes are closed (or lingered)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pid: int, pipes: dict[int, BoundedOutput]) -> None:
        self.loop = loop
        self.pid = pid
        self.done: asyncio.Future[None] = loop.create_future()
        self.exit_code: int | None = None
        self.timed_out = False
        self.open_pipes = set(pipes)
        self.pipe_ids = set()
        for fd, sink in pipes.items():
            os.set_blocking(fd, False)
            self.pipe_ids.add(os.fstat(fd).st_ino)
            loop.add_reader(fd, self._reader(fd, sink))
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
            loop.add_reader(self.pidfd, self._poll_exit)
        except OSError:  # pragma: no cover - kernels before 5.3
            self.pidfd = None
            self._poll_handle = loop.call_later(0.005, self._poll_exit)
        self._poll_exit()  # it may already have exited

    def _reader(self, fd: int, sink: BoundedOutput):
        grown = False

        def read() -> None:
            nonlocal grown
            for _ in range(64):
                try:
                    data = os.read(fd, READ_CHUNK)
                except BlockingIOError:
                    return
                except OSError:
                    data = b""
                if not data:
                    self.loop.remove_reader(fd)
                    os.close(fd)
                    self.open_pipes.discard(fd)
                    if self.exit_code is not None and not self.open_pipes:
                        self._finish()
                    return
                sink.feed(data)
                if not grown and len(data) >= DEFAULT_PIPE_SIZE:
                    grown = True  # a heavy writer: a bigger pipe means fewer wake-ups
                    _grow_pipe(fd)

        return read

    def _poll_exit(self) -> None:
        if self.exit_code is not None:
            return
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = self.pid, 0
        if pid == 0:
            if self.pidfd is None:
                self._poll_handle = self.loop.call_later(0.005, self._poll_exit)
            return
        code = os.waitstatus_to_exitcode(status)
        self.exit_code = 128 - code if code < 0 else code
        if self.pidfd is not None:
            self.loop.remove_reader(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = None
        if not self.open_pipes:
            self._finish()
        else:  # a background child may hold the pipes: give them a moment, then stop waiting
            self.loop.call_later(EXIT_LINGER, self._finish)

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def expire(self) -> None:
        if not self.done.done():
            self.timed_out = True
            self.done.set_result(None)

    async def wait_exit(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.exit_code is None and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        return self.exit_code is not None


class Supervisor:
    """Spawns the server's child processes and reaps orphans re-parented to it."""

    def __init__(self) -> None:
        self._tracked: set[int] = set()
        self._drainers = 0
        self._reaper: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
                log.warning("could not become a child subreaper; daemons may escape reset")
        except OSError:  # pragma: no cover - non-Linux
            log.warning("prctl unavailable; daemons may escape reset")
        self._schedule_reaper()

    def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()

    def _schedule_reaper(self) -> None:
        assert self._loop is not None
        self._reaper = self._loop.call_later(1.0, self._reap_orphans)

    def _reap_orphans(self) -> None:
        self._reap_orphans_now()
        self._schedule_reaper()

    # -- running ------------------------------------------------------------------------------

    async def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        user: UserSpec | None = None,
        timeout: float,
        grace: float,
        max_output: int | None,
        stdin: bytes | None = None,
    ) -> ProcessResult:
        """Run ``argv`` in a new session and wait for it, its pipes and, on timeout, its group.

        Returns within ``timeout + grace`` plus a few tens of milliseconds, whatever the command
        does: on timeout the process group and every process still holding the output pipes get
        SIGTERM, then SIGKILL once ``grace`` has passed.
        """
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        out, err = BoundedOutput(max_output), BoundedOutput(max_output)
        kwargs: dict = {}
        if user is not None and user.uid != os.getuid():
            kwargs.update(user=user.uid, group=user.gid, extra_groups=_groups_of(user))
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        in_r, in_w = os.pipe2(os.O_CLOEXEC) if stdin else (subprocess.DEVNULL, None)
        try:
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env),
                stdin=in_r,
                stdout=out_w,
                stderr=err_w,
                start_new_session=True,
                close_fds=True,
                **kwargs,
            )
        except BaseException:
            for fd in (out_r, err_r, in_w):
                if fd is not None:
                    os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w) + ((in_r,) if in_w is not None else ()):
                os.close(fd)
        self._tracked.add(proc.pid)
        try:
            job = _Job(loop, proc.pid, {out_r: out, err_r: err})
            if in_w is not None:
                asyncio.ensure_future(_feed_stdin(loop, in_w, stdin or b""))
            timer = loop.call_later(timeout, job.expire)
            try:
                await job.done
            finally:
                timer.cancel()
            if job.timed_out:
                await self._terminate(job, grace)
            for fd in list(job.open_pipes):
                # Pipes still held (a daemon kept them) are drained in the background, so the
                # daemon never dies of SIGPIPE, yet nothing more is retained.
                self._hand_to_drainer(loop, fd)
        finally:
            self._tracked.discard(proc.pid)
        proc.returncode = job.exit_code if job.exit_code is not None else 137  # Popen must not reap
        code = 124 if job.timed_out else proc.returncode
        return ProcessResult(code, out, err, job.timed_out, time.monotonic() - started)

    async def _terminate(self, job: _Job, grace: float) -> None:
        _signal_group_and_holders(job.pid, job.pipe_ids, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (job.exit_code is None or job.open_pipes):
            await asyncio.sleep(0.01)
        if job.exit_code is None or job.open_pipes:
            _signal_group_and_holders(job.pid, job.pipe_ids, signal.SIGKILL)
            deadline = time.monotonic() + 0.3
            while time.monotonic() < deadline and (job.exit_code is None or job.open_pipes):
                await asyncio.sleep(0.005)

    def _hand_to_drainer(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        loop.remove_reader(fd)
        if self._drainers >= MAX_DRAINERS:
            os.close(fd)
            return
        self._drainers += 1

        def drain() -> None:
            try:
                while os.read(fd, READ_CHUNK):
                    pass
            except BlockingIOError:
                return
            except OSError:
                pass
            loop.remove_reader(fd)
            os.close(fd)
            self._drainers -= 1

        loop.add_reader(fd, drain)

    # -- reset support ------------------------------------------------------------------------

    async def kill_descendants(self, grace: float) -> int:
        """End every process this server started, directly or not. Returns how many there were."""
        victims = descendants(os.getpid())
        if not victims:
            return 0
        for pid in victims:
            _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        pause = 0.001  # most processes die at once: look again soon, then less often
        while time.monotonic() < deadline:
            if not [p for p in victims if _alive(p)]:
                break
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.02)
        survivors = descendants(os.getpid())
        for pid in survivors:
            _kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and [p for p in survivors if _alive(p)]:
            await asyncio.sleep(0.005)
        self._reap_orphans_now()
        return len(set(victims) | set(survivors))

    def _reap_orphans_now(self) -> None:
        """Collect exited children we did not start ourselves (daemons re-parented to us)."""
        for pid in _children():
            if pid not in self._tracked:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass


def _children() -> list[int]:
    pids: list[int] = []
    try:
        for task in os.scandir("/proc/self/task"):
            try:
                with open(f"{task.path}/children") as fh:
                    pids.extend(int(p) for p in fh.read().split())
            except OSError:
                continue
    except OSError:
        pass
    return pids


def _groups_of(user: UserSpec) -> list[int]:
    import grp

    try:
        return [g.gr_gid for g in grp.getgrall() if user.name in g.gr_mem and g.gr_gid != user.gid]
    except OSError:
        return []


def _remaining(started: float, timeout: float) -> float:
    return max(timeout - (time.monotonic() - started), 0.0)


def _grow_pipe(fd: int) -> None:
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass


async def _feed_stdin(loop: asyncio.AbstractEventLoop, fd: int, data: bytes) -> None:
    os.set_blocking(fd, False)
    view = memoryview(data)
    try:
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_writer(fd, ready.set_result, None)
                try:
                    await ready
                finally:
                    loop.remove_writer(fd)
    except OSError:  # the program closed its stdin early
        pass
    finally:
        os.close(fd)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _signal_group_and_holders(pgid: int, pipe_ids: set[int], sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pipe_holders(pipe_ids):
        _kill(pid, sig)


def pipe_holders(pipe_inodes: set[int]) -> list[int]:
    """Processes (other than us) holding one of the given pipes open."""
    targets = {f"pipe:[{ino}]" for ino in pipe_inodes}
    me = os.getpid()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                try:
                    if os.readlink(fd.path) in targets:
                        found.append(int(entry.name))
                        break
                except OSError:
                    continue
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.EACCES, errno.ESRCH, errno.EPERM):
                raise
    return found


def descendants(root: int) -> list[int]:
    """All live descendants of ``root`` (children of children included), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] in (b"Z", b"X"):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found
