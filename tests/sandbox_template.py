"""The in-process backend's template process: it imports and warms the sandbox server once (as
``sandbox_server.zygote`` does for the local backend) and forks a server for each sandbox, so
that a sandbox is a process of its own (its processes, its crash, its shutdown are its own) and
still starts in a few milliseconds.

Run as ``python tests/sandbox_template.py``; one JSON object a line each way. In:
``{"name", "argv", "log"}`` forks ``sandbox_server`` with ``argv`` (plus ``--ready-fd``), its
output to ``log``. Out: ``{"name", "pid"}`` once forked, ``{"name", "ready": bool}`` when it says
it is ready (false: it ended first), ``{"name", "exited": status}`` when it ends (however). It is
the subreaper of what its servers leave, and it ends them all when its input closes (the test
process gone).
"""

from __future__ import annotations

import ctypes
import json
import os
import selectors
import signal
import sys

from sandbox_server import zygote
from sandbox_server.cli import main

PR_SET_CHILD_SUBREAPER = 36


def _fork_server(request: dict, keep: set[int]) -> tuple[int, int]:
    """The server's pid and the read end of its ready pipe."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(ready_w)
        return pid, ready_r
    try:  # the server: a session of its own, nothing of the template's but its imports
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in keep | {ready_r}:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        main([*request["argv"], "--ready-fd", str(ready_w)])
        os._exit(0)
    except BaseException:  # noqa: BLE001 - a forked child never returns into the template
        os._exit(1)


def serve() -> None:
    zygote.preload()  # as the local backend's template does: imports, the parser, the OpenAPI document
    zygote.warm_up()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    selector = selectors.DefaultSelector()
    selector.register(stdin, selectors.EVENT_READ, "request")
    selector.register(wake_r, selectors.EVENT_READ, "signal")
    names: dict[int, str] = {}  # server pid -> sandbox name
    pending = b""

    def say(message: dict) -> None:
        os.write(stdout, (json.dumps(message) + "\n").encode())

    while True:
        for key, _ in selector.select():
            if key.data == "request":
                chunk = os.read(stdin, 1 << 16)
                if not chunk:  # the test process closed us: nothing outlives it
                    for pid in names:
                        try:
                            os.killpg(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    return
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    request = json.loads(line)
                    keep = {stdin, stdout, wake_r, wake_w, selector.fileno(),
                            *(k.fd for k in selector.get_map().values())}
                    pid, ready_r = _fork_server(request, keep)
                    names[pid] = request["name"]
                    selector.register(ready_r, selectors.EVENT_READ, ("ready", request["name"]))
                    say({"name": request["name"], "pid": pid})
            elif key.data == "signal":
                os.read(wake_r, 1 << 10)
                while True:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    if pid in names:  # else an orphan a server left: reaped, nothing to say
                        say({"name": names.pop(pid), "exited": status})
            else:
                _, name = key.data
                said = os.read(key.fd, 16)
                selector.unregister(key.fd)
                os.close(key.fd)
                say({"name": name, "ready": said == b"ready\n"})


if __name__ == "__main__":
    serve()
