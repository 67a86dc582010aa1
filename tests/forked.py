"""How tests start our servers: forked by the tests' template process (``tests/sandbox_template.py``;
the template, one per test process, and a forked process as much of ``subprocess.Popen`` as tests
use of one), or afresh (``popen``) when a test gives one an environment of its own or a wrapper.

Measured (medians of 8, alternated, load 16-20): start, one call and stop of a control plane took
1.02 s of CPU afresh and 0.19 forked, of a sandbox server 0.42 and 0.15; 54 tests of
test_control_plane_hardening, test_sandbox_bash and test_control_plane_lifecycle took 54-59 s of
CPU (their whole process tree), 31-36 forked."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, ClassVar

REPO = Path(__file__).resolve().parent.parent


class Template:
    """A template process, one of each kind for every user in this test process (starting one
    costs ~0.3 s of CPU); it ends, and ends what it forked, when this process does. ``SANDBOX``
    has served sandbox server calls (the in-process backend's servers come from it), ``BARE`` has
    only imported what it forks: a server's start takes CAP_SYS_ADMIN out of its bounding set
    after it started its isolated runs' zygote, which a control plane and such a server need."""

    SANDBOX: ClassVar[tuple[str, ...]] = ()
    BARE: ClassVar[tuple[str, ...]] = ("--bare",)
    _lock: ClassVar[threading.Lock] = threading.Lock()
    _shared: ClassVar[dict[tuple[str, ...], Template]] = {}

    @classmethod
    def shared(cls, kind: tuple[str, ...] = SANDBOX) -> Template:
        with cls._lock:
            template = cls._shared.get(kind)
            if template is None or template.proc.poll() is not None:
                template = cls._shared[kind] = cls(kind)
            return template

    def __init__(self, kind: tuple[str, ...]) -> None:
        # In the repository, as `python -m control_plane` runs: its packages come first on the path.
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.sandbox_template", *kind], cwd=REPO,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._writing = threading.Lock()
        self._routes: dict[str, Callable[[dict[str, Any]], None]] = {}
        threading.Thread(target=self._read, name="sandbox-template", daemon=True).start()

    def fork(self, request: dict[str, Any], route: Callable[[dict[str, Any]], None]) -> None:
        """Fork a child for ``request``; what the template says of it goes to ``route``."""
        assert self.proc.stdin is not None
        self._routes[request["name"]] = route
        with self._writing:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            route = self._routes.get(message["name"])
            if "exited" in message:
                self._routes.pop(message["name"], None)
            if route is not None:
                route(message)


class ForkedProcess:
    """``main(argv)`` of module ``main`` in a child of the template, in this process's directory,
    with ``env`` (default: this process's current environment): ``pid``, ``poll``, ``wait``,
    ``send_signal``, ``kill`` and ``returncode`` as ``subprocess.Popen`` has them, and what it
    said on its ready descriptor."""

    def __init__(self, main: str, argv: Sequence[str], log: Path, preload: Sequence[str] = (),
                 kind: tuple[str, ...] = Template.SANDBOX, env: dict[str, str] | None = None) -> None:
        self.returncode: int | None = None
        self._forked, self._said, self._exited = threading.Event(), threading.Event(), threading.Event()
        self.said = ""
        Template.shared(kind).fork({"name": f"{main}-{uuid.uuid4().hex}", "main": main, "argv": list(argv),
                                    "log": str(log), "preload": list(preload),
                                    "env": dict(os.environ) if env is None else env, "cwd": os.getcwd()},
                                   self._heard)
        if not self._forked.wait(60):
            raise RuntimeError(f"the template did not fork {main}")

    def _heard(self, message: dict[str, Any]) -> None:  # on the template's reader thread
        if "pid" in message:
            self.pid: int = message["pid"]
            self._forked.set()
        elif "ready" in message:
            self.said = message["said"]
            self._said.set()
        elif "exited" in message:
            self.returncode = os.waitstatus_to_exitcode(message["exited"])
            self._said.set()  # (nothing more to say)
            self._exited.set()

    def ready_line(self, timeout: float) -> str:
        """What it wrote on its ready descriptor ("" if it ended first, or said nothing in time)."""
        self._said.wait(timeout)
        return self.said

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"forked {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # ended, not yet said
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def popen(argv: list[str], log: IO[bytes], env: dict[str, str] | None, timeout: float,
          wrap: Callable[[list[str]], tuple[list[str], dict[str, str]]] | None = None,
          ) -> tuple[subprocess.Popen, str]:
    """``argv`` (plus ``--ready-fd``, then ``wrap``ped) started afresh in a session of its own, its
    output to ``log``; and what it said on its ready descriptor within ``timeout`` ("": nothing)."""
    read_fd, write_fd = os.pipe()
    argv = [*argv, "--ready-fd", str(write_fd)]
    if wrap is not None:
        argv, env = wrap(argv)
    proc = subprocess.Popen(argv, pass_fds=(write_fd,), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)
    os.close(write_fd)
    ready, _, _ = select.select([read_fd], [], [], timeout)
    line = os.read(read_fd, 64).decode() if ready else ""
    os.close(read_fd)
    return proc, line


def forkable(env: dict[str, str] | None) -> bool:
    """Whether a server of environment ``env`` (None: this process's) may be forked: unless it
    differs from this process's in more than IdeGym's variables, read when a server reads its
    settings (others are read at the interpreter's start or at import, e.g. a CA bundle's)."""
    if env is None:
        return True
    changed = {key for key in env.keys() | os.environ.keys() if env.get(key) != os.environ.get(key)}
    return all(key.startswith("IDEGYM_") for key in changed)
