"""Background processes and interactive terminal sessions (``/api/sessions/*``).

A session is a tool process started like a bash call (``Supervisor.run``: the tool user, its own
session, the tools' cgroups, a timeout that ends its whole tree) that the call does not wait
for: its output (stdout and stderr together) goes to a ``StreamBuffer`` that keeps the latest
``max_output_bytes`` and counts every byte, so a reader asks for what came after the offset it
has (``wait``: until something does, or the process ends) and learns what it missed. A session
keeps its stdin open for ``write``. With ``pty`` the command runs in a pseudo-terminal made by
``script`` (util-linux): it sees a terminal (prompt, line editing, full-screen programs), the
output is what the terminal shows (escape sequences and all; ``screen`` has the latest lines
without them), ``resize`` sets the terminal's size on its pseudo-terminal (SIGWINCH).

Bounded like the rest: at most ``MAX_LIVE`` running sessions, ``MAX_KEPT`` records; a reset or a
terminate ends every session's processes with every other tool process and forgets them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import os
import re
import signal
import struct
import termios
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from . import procfs
from .errors import ApiError, NotFound
from .models import SessionInfo
from .output import BoundedOutput
from .process import ProcessResult
from .trees import freeze_trees

MAX_LIVE = 16
MAX_KEPT = 64
MAX_KEPT_BYTES = 64 << 20  # the output every kept session may hold, together: the server's memory
RESIZE_WAIT = 5.0  # seconds a resize waits for a new session's terminal to appear
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[()][A-Za-z0-9]|\x1b[=>78c]|\r")


class StreamBuffer(BoundedOutput):
    """The latest ``limit`` bytes of a stream, their absolute offsets, and a wake-up per write."""

    __slots__ = ("_ring", "start", "_changed")

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self._ring = bytearray()
        self.start = 0  # absolute offset of _ring[0]
        self._changed = asyncio.Event()

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        self._ring += data
        extra = len(self._ring) - (self.limit or 0)
        if extra > 0:
            del self._ring[:extra]
            self.start += extra
        self._changed.set()

    def text(self, strip: bool = False) -> str:
        return self._ring.decode("utf-8", "replace")

    def read(self, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """The bytes from ``offset`` (or from the oldest kept, if later), and where they start."""
        begin = max(offset, self.start)
        chunk = bytes(self._ring[begin - self.start: begin - self.start + max_bytes])
        return chunk, begin

    async def changed(self, timeout: float) -> None:
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    def tail_lines(self, rows: int) -> str:
        text = _ANSI.sub("", self._ring[-65536:].decode("utf-8", "replace"))
        return "\n".join(text.split("\n")[-rows:])


@dataclass
class Session:
    id: str
    command: str
    pty: bool
    output: StreamBuffer
    stdin_w: int | None
    cols: int | None = None
    rows: int | None = None
    pid: int = 0
    task: asyncio.Task[ProcessResult] | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    started: float = field(default_factory=time.monotonic)

    def info(self) -> SessionInfo:
        result = self.task.result() if self.task is not None and self.task.done() and not self.task.cancelled() \
            and self.task.exception() is None else None
        running = self.task is not None and not self.task.done()
        exit_code = result.exit_code if result is not None else (None if running else -1)
        return SessionInfo(id=self.id, pid=self.pid, pty=self.pty, command=self.command, running=running,
                           exit_code=exit_code, timed_out=bool(result and result.timed_out),
                           output_bytes=self.output.total, cols=self.cols, rows=self.rows)

    def close_stdin(self) -> None:
        fd, self.stdin_w = self.stdin_w, None
        if fd is not None:
            os.close(fd)


# (argv, sinks, stdin read end, on_start) -> the process's result, once it ended
Run = Callable[[list[str], tuple[BoundedOutput, BoundedOutput], int, Callable[[int], None]],
               Awaitable[ProcessResult]]


class Sessions:
    def __init__(self) -> None:
        self._all: dict[str, Session] = {}
        self._ids = itertools.count(1)

    def get(self, sid: str) -> Session:
        try:
            return self._all[sid]
        except KeyError:
            raise NotFound(f"no session {sid!r} (ended by a reset or a terminate, or never started): "
                           "GET /api/sessions lists them") from None

    def list(self) -> list[SessionInfo]:
        return [s.info() for s in self._all.values()]

    async def start(self, command: str, *, pty: bool, cols: int, rows: int, max_output: int, run: Run) -> Session:
        live = sum(1 for s in self._all.values() if s.task is not None and not s.task.done())
        if live >= MAX_LIVE:
            raise ApiError.for_status(429, f"{MAX_LIVE} sessions are running: end one first (POST /api/sessions/end)")
        self._prune(room_for=max_output)
        kept = sum(s.output.limit or 0 for s in self._all.values())
        if kept + max_output > MAX_KEPT_BYTES:
            raise ApiError.for_status(429, f"the sessions kept may hold {MAX_KEPT_BYTES >> 20} MiB of output together "
                                           f"({kept >> 20} MiB now): end some, or ask for less max_output_bytes")
        # The terminal's size is set by the shell ``script`` starts, before the command runs: a
        # resize from outside races the command's first look at it (``stty size``, a TUI's layout).
        argv = (["script", "-qfec", f"stty rows {rows} cols {cols} 2>/dev/null\n{command}", "/dev/null"] if pty
                else ["bash", "-c", command])
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
        buffer = StreamBuffer(max_output)
        session = Session(f"s{next(self._ids)}", command, pty, buffer, stdin_w, cols if pty else None,
                          rows if pty else None)
        self._all[session.id] = session
        started: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def on_start(pid: int) -> None:
            session.pid = pid
            if not started.done():
                started.set_result(pid)

        def on_end(_: object) -> None:
            session.ended.set()
            session.close_stdin()
            buffer._changed.set()
            if not started.done():
                started.set_result(0)

        session.task = asyncio.ensure_future(run(argv, (buffer, buffer), stdin_r, on_start))
        session.task.add_done_callback(on_end)
        await started
        return session

    async def read(self, session: Session, offset: int, wait: float, max_bytes: int) -> tuple[bytes, int]:
        if wait > 0 and offset >= session.output.total and not session.ended.is_set():
            await session.output.changed(wait)
        return session.output.read(offset, max_bytes)

    async def write(self, session: Session, data: bytes) -> None:
        if session.stdin_w is None:
            raise ApiError.for_status(409, f"session {session.id} has ended: nothing reads what is written")
        loop = asyncio.get_running_loop()
        fd = session.stdin_w
        try:
            await asyncio.wait_for(loop.run_in_executor(None, _write_all, fd, data), 10.0)
        except TimeoutError:
            raise ApiError.for_status(409, f"session {session.id} does not read its input") from None
        except OSError as exc:
            raise ApiError.for_status(409, f"session {session.id} does not take input: {exc.strerror}") from None

    async def resize(self, session: Session, cols: int, rows: int) -> None:
        if not session.pty:
            raise ApiError.for_status(409, f"session {session.id} has no terminal to resize (start it with pty)")
        deadline = time.monotonic() + RESIZE_WAIT  # a session just started may not have its terminal yet
        while (tty := _terminal_of(session.pid)) is None and not session.ended.is_set():
            if time.monotonic() >= deadline:
                raise ApiError.for_status(409, f"session {session.id}'s terminal is not found "
                                               f"{RESIZE_WAIT:g} s after its start: read its output to see why")
            await asyncio.sleep(0.01)
        if tty is None:
            raise ApiError.for_status(409, f"session {session.id} has ended")
        fd = os.open(tty, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        finally:
            os.close(fd)
        session.cols, session.rows = cols, rows

    async def end(self, session: Session, grace: float) -> None:
        """SIGTERM to the session's process group and tree; SIGKILL (stopped first, so nothing
        forks away) to what is left after ``grace``."""
        if session.task is None or session.task.done() or not session.pid:
            return
        tree = {session.pid, *procfs.descendants(session.pid)}
        with contextlib.suppress(OSError):
            os.killpg(session.pid, signal.SIGTERM)
        for pid in tree:
            procfs.kill(pid, signal.SIGTERM)
        await asyncio.wait({session.task}, timeout=grace)
        if not session.task.done():
            for pid in freeze_trees({p for p in tree if procfs.alive(p)}, include_roots=True):
                procfs.kill(pid, signal.SIGKILL)
            await asyncio.wait({session.task}, timeout=5.0)

    def forget(self) -> None:
        """After every tool process was ended (reset, terminate): no session is left."""
        for session in self._all.values():
            session.close_stdin()
        self._all.clear()

    def _prune(self, room_for: int) -> None:
        """Forget the oldest ended sessions beyond ``MAX_KEPT``, and as many more as it takes to
        keep ``room_for`` bytes of output within ``MAX_KEPT_BYTES``."""
        ended = [s for s in self._all.values() if s.task is not None and s.task.done()]
        kept = sum(s.output.limit or 0 for s in self._all.values())
        for session in ended:
            if len(self._all) < MAX_KEPT and kept + room_for <= MAX_KEPT_BYTES:
                break
            del self._all[session.id]
            kept -= session.output.limit or 0


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _terminal_of(pid: int) -> str | None:
    """The pseudo-terminal a session's processes have as stdin (``script``'s child's)."""
    if not pid:
        return None
    for child in procfs.descendants(pid):
        try:
            target = os.readlink(f"/proc/{child}/fd/0")
        except OSError:
            continue
        if target.startswith("/dev/pts/"):
            return target
    return None
