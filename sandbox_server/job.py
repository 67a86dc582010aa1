"""One running command as the event loop sees it: its output pipes read into bounded sinks (watched
by the server's ``PipeWatch``), its exit watched through a pidfd (or told by its parent: the zygote
of isolated runs, or the tool user's spawner), done once it has exited and its pipes are closed or
have lingered (``Supervisor.run`` in ``process.py``)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal

from .output import BoundedOutput, read_available
from .pipe_watch import PipeWatch

F_SETPIPE_SZ = 1031
READ_CHUNK = 1 << 20
PIPE_SIZE = 1 << 20
DEFAULT_PIPE_SIZE = 1 << 16
# After the command's main process exits, how long to wait for the pipes to close: a background
# child that inherited them would otherwise hold the call open.
EXIT_LINGER = 0.1
ADOPTION_POLL = 0.002, 0.05  # first and longest wait between looks at a tool not re-parented to us yet


class Job:
    """One running command: done once it has exited and its pipes are closed (or lingered)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, watch: PipeWatch, pid: int, pipes: dict[int, BoundedOutput],
                 exit_status: asyncio.Future[int | None] | None = None) -> None:
        self.loop = loop
        self.watch = watch
        self.pid = pid
        self.done: asyncio.Future[None] = loop.create_future()
        self.exit_code: int | None = None
        self.timed_out = False
        self.mark = ""  # the command's CALL_ENV value
        self.open_pipes = set(pipes)
        self._pipe_ids: set[int] | None = None
        self.pidfd: int | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._adoption_wait = 0.0  # while it is not our child yet: the next wait before looking again
        # Told ended already (a quick tool of a spawner, which closes its copies of the pipes
        # before it tells): what the pipes hold is read now, and a pipe at its end is never
        # watched; one a background child still holds is.
        ended = exit_status is not None and exit_status.done() and not exit_status.cancelled() \
            and exit_status.result() is not None
        for fd, sink in pipes.items():
            os.set_blocking(fd, False)
            if ended and _read_to_end(fd, sink):
                os.close(fd)
                self.open_pipes.discard(fd)
            else:
                watch.add(fd, self._reader(fd, sink))
        if exit_status is not None:  # someone else's child: its parent tells us how it ended
            if ended:
                self._told(exit_status)
            else:
                exit_status.add_done_callback(self._told)
            return
        self._watch()

    @property
    def pipe_ids(self) -> set[int]:
        """The pipes still open (their inodes), as they were when first asked: a timeout's
        holders to end (a pipe at its end has no writer left)."""
        if self._pipe_ids is None:
            self._pipe_ids = {os.fstat(fd).st_ino for fd in self.open_pipes}
        return self._pipe_ids

    def _told(self, exit_status: asyncio.Future[int | None]) -> None:
        status = 9 if exit_status.cancelled() else exit_status.result()
        if status is None and self.pid:  # its parent died first: it is ours now (we are a subreaper)
            self._watch()
        else:
            self._exited(9 if status is None else status)

    def _watch(self) -> None:
        try:
            self.pidfd = os.pidfd_open(self.pid)
            self.loop.add_reader(self.pidfd, self._poll_exit)
        except OSError:  # pragma: no cover - kernels before 5.3
            self.pidfd = None
            self._poll_handle = self.loop.call_later(0.005, self._poll_exit)
        self._poll_exit()  # it may already have exited

    def _reader(self, fd: int, sink: BoundedOutput):
        grown = False

        def read() -> None:
            nonlocal grown
            for _ in range(64):
                data = read_available(fd, READ_CHUNK)
                if data is None:
                    return
                if not data:
                    self.watch.remove(fd)
                    os.close(fd)
                    self.open_pipes.discard(fd)
                    if self.exit_code is not None and not self.open_pipes:
                        self._finish()
                    return
                sink.feed(data)
                if not grown and len(data) >= DEFAULT_PIPE_SIZE:
                    grown = True  # a heavy writer: a bigger pipe means fewer wake-ups
                    grow_pipe(fd)

        return read

    def _poll_exit(self) -> None:
        if self.exit_code is not None:
            return
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            if self._exists():
                self._await_adoption()
                return
            pid, status = self.pid, 0  # reaped by someone else
        if pid == 0:
            if self.pidfd is None:
                self._poll_handle = self.loop.call_later(0.005, self._poll_exit)
            elif self._adoption_wait:  # adopted while it runs: its pidfd says when it ends
                self._adoption_wait = 0.0
                self.loop.add_reader(self.pidfd, self._poll_exit)
            return
        self._exited(status)

    def _exists(self) -> bool:
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, 0)  # a zombie too, until it is reaped
            else:
                os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _await_adoption(self) -> None:
        """The process exists but is not our child yet: a tool whose spawner was just killed is
        re-parented to us (a subreaper) only after the spawner's pipes closed, which told us it
        was gone; under load that takes a while. Look again shortly (its pidfd, readable once it
        has exited, would wake us in a loop meanwhile)."""
        if not self._adoption_wait:
            if self.pidfd is not None:
                self.loop.remove_reader(self.pidfd)
            self._adoption_wait = ADOPTION_POLL[0]
        self._poll_handle = self.loop.call_later(self._adoption_wait, self._poll_exit)
        self._adoption_wait = min(self._adoption_wait * 2, ADOPTION_POLL[1])

    def _exited(self, status: int) -> None:
        if self.exit_code is not None:
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
            self._linger = self.loop.call_later(EXIT_LINGER, self._finish)

    def _finish(self) -> None:
        if self._linger is not None:
            self._linger.cancel()  # no wake-up later for a call that is over
            self._linger = None
        if not self.done.done():
            self.done.set_result(None)

    def expire(self) -> None:
        if not self.done.done():
            self.timed_out = True
            self.done.set_result(None)


def _read_to_end(fd: int, sink: BoundedOutput) -> bool:
    """What a non-blocking pipe holds, into ``sink``; True when it is at its end (no writer left)."""
    for _ in range(64):
        data = read_available(fd, READ_CHUNK)
        if data is None:
            return False
        if not data:
            return True
        sink.feed(data)
    return False


def grow_pipe(fd: int) -> None:
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass


async def feed_stdin(loop: asyncio.AbstractEventLoop, fd: int, data: bytes) -> None:
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
