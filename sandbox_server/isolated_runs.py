"""The server's side of isolated runs: ``Jails`` starts the zygote, hands it runs and learns on
the event loop how each ended (what a run sees, and how the zygote makes it: ``jail.py``).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from . import jail, procfs, run_template
from .jail import RunSpec
from .output import read_available
from .run_template import RunReport


class JailError(Exception):
    """The zygote is not there (any more): isolated runs are unavailable."""


@dataclass(frozen=True)
class RunTemplate:
    """The runs' template interpreter (``run_template.py``): the ``python`` runs start, with the
    environment they all share; ``per_run`` names the variables each run sets for itself."""

    python: str
    env: dict[str, str]
    per_run: tuple[str, ...]


class Jails:
    """The server's handle on its zygote: ``spawn`` a run, learn how it ended."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.reason = "not started"
        self.cgroups: list[str] = []
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # (pid, exit status) of each request not answered yet: answers come in request order
        self._spawned: list[tuple[asyncio.Future[int], asyncio.Future[int | None]]] = []

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self, cgroups: Mapping[str, str] | None = None, pids_max: int | None = None,
              memory_max: int | None = None, spares: int = 1, template: RunTemplate | None = None) -> bool:
        """Start the zygote (synchronously: while this process still holds CAP_SYS_ADMIN), in the
        ``cgroups`` directories (the tools' groups, by controller) if any, each run then in groups
        of its own below them, held to ``pids_max`` processes and ``memory_max`` bytes (``jail.py``),
        with ``spares`` inits kept ready (as many as runs may go on at once), cloned by the runs'
        ``template`` interpreter when there is one (``run_template.py``).
        False, with ``reason`` set, when this process cannot make namespaces (not root in its user
        namespace, or a kernel that refuses)."""
        problem = jail.probe()
        if problem:
            self.reason = problem
            return False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", os.path.abspath(jail.__file__), str(theirs.fileno()),
                 json.dumps({"cgroups": dict(cgroups or {}), "pids_max": pids_max, "memory_max": memory_max,
                             "spares": spares, "template": vars(template) if template is not None else None})],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, close_fds=True)
        except OSError as exc:
            ours.close()
            self.reason = f"cannot start the zygote: {exc}"
            return False
        finally:
            theirs.close()
        self._sock = ours
        self.reason = ""
        self.cgroups = list((cgroups or {}).values())
        return True

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the zygote's answers on ``loop`` (once it runs)."""
        assert self._sock is not None
        self._loop = loop
        self._sock.setblocking(False)
        loop.add_reader(self._sock.fileno(), self._on_message)

    def spawn(self, spec: RunSpec, stdin: int, stdout: int, stderr: int,
              on_report: Callable[[RunReport], object] | None = None,
              ) -> tuple[asyncio.Future[int], asyncio.Future[int | None]]:
        """Start ``spec``: futures of its init's pid (a ``JailError`` when the zygote refused or is
        gone) and of the program's wait status (a SIGKILL's when the init was killed first). The
        run goes on while the pid is on its way; the fds stay the caller's. ``on_report`` hears the
        init's ``RunReport`` (when it spawned the program, the CPU each took) with the status."""
        if self._sock is None or self._loop is None:
            raise JailError(f"isolated runs are unavailable: {self.reason}")
        loop = self._loop
        data = json.dumps(vars(spec)).encode()  # its fields are JSON already: no deep copy (asdict's)
        # The init writes the program's wait status here just before it exits: no hop through the zygote.
        status_r, status_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        exit_status: asyncio.Future[int | None] = loop.create_future()  # the wait status (as a spawner's are)
        answer: asyncio.Future[int] = loop.create_future()
        try:
            self._sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                         array.array("i", [stdin, stdout, stderr, status_w]))])
        except OSError as exc:  # the zygote is gone (a full socket: it never reads that slowly)
            os.close(status_r)
            self._fail(f"the zygote is gone: {exc}")
            raise JailError(f"isolated runs are unavailable: {self.reason}") from exc
        finally:
            os.close(status_w)
        self._spawned.append((answer, exit_status))
        loop.add_reader(status_r, _read_status, loop, status_r, exit_status, on_report)
        return answer, exit_status

    def _on_message(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(4096)
            except BlockingIOError:
                return
            except OSError as exc:
                data, problem = b"", str(exc)
            else:
                problem = "it exited"
            if not data:
                self._fail(f"the zygote is gone: {problem}")
                return
            message = json.loads(data)
            if self._spawned:
                answer, exit_status = self._spawned.pop(0)
                if "error" in message:  # a request it could not act on (it never cloned for it)
                    _refused(answer, exit_status, message["error"])
                else:
                    answer.set_result(message["pid"])

    def _fail(self, reason: str) -> None:
        self.reason = reason
        if self._sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        for answer, exit_status in self._spawned:
            _refused(answer, exit_status, f"isolated runs are unavailable: {reason}")
        self._spawned.clear()

    def stop(self, timeout: float = 2.0) -> None:
        """End the zygote; the inits of runs still going die with it (parent-death signal), and
        their groups are removed once empty."""
        self._fail("stopped")
        deadline = time.monotonic() + timeout
        if self.process is not None:
            # Its children (the template, spares, runs' inits) die with it (parent-death signal):
            # waited for, so that nothing of it is left once this returns.
            pidfds = []
            for pid in procfs.children(self.process.pid):
                with contextlib.suppress(OSError):
                    pidfds.append(os.pidfd_open(pid))
            self.process.kill()
            self.process.wait()
            self.process = None
            for pidfd in pidfds:
                select.select([pidfd], [], [], max(deadline - time.monotonic(), 0))
                os.close(pidfd)
        left = [g for g in self.cgroups if os.path.isdir(g)]
        while left:
            children = [e.path for g in left for e in os.scandir(g)
                        if e.is_dir() and e.name.startswith(jail.RUN_GROUP_PREFIX)]
            for child in children:
                with contextlib.suppress(OSError):  # busy while its last processes exit
                    os.rmdir(child)
            if not any(os.path.isdir(c) for c in children) or time.monotonic() > deadline:
                break
            time.sleep(0.01)


def _read_status(loop: asyncio.AbstractEventLoop, fd: int, exit_status: asyncio.Future[int | None],
                 on_report: Callable[[RunReport], object] | None) -> None:
    """The reader of a run's status pipe (``run_template.RunReport``); nothing written: the init was
    killed (SIGKILL) before its program ended."""
    data = read_available(fd, run_template.STATUS.size)
    if data is None:
        return
    loop.remove_reader(fd)
    os.close(fd)
    report = RunReport.unpack(data) if len(data) == run_template.STATUS.size else None
    if report is not None and on_report is not None:
        on_report(report)
    if not exit_status.done():
        exit_status.set_result(report.status if report is not None else signal.SIGKILL)


def _refused(answer: asyncio.Future[int], exit_status: asyncio.Future[int | None], reason: str) -> None:
    if not answer.done():
        answer.set_exception(JailError(reason))
    if not exit_status.done():
        exit_status.set_result(run_template.FAILED_TO_ISOLATE << 8)
