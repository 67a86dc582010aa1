"""The tests' template process: it imports and warms the sandbox server once (as
``sandbox_server.zygote`` does for the local backend) and forks a server for each sandbox of the
in-process backend (and each ``SandboxProcess``), so that a sandbox is a process of its own (its
processes, its crash, its shutdown are its own) and still starts in a few milliseconds. It forks
the tests' control planes (``ControlPlaneProcess``) too, having imported the control plane once:
one started afresh took 0.77 s of CPU and 0.70 s to ready, one forked here 0.09 s and 0.10 s.

Run as ``python -m tests.sandbox_template`` in the repository; ``--bare``: without the sandbox
server's warm-up, which leaves CAP_SYS_ADMIN out of the bounding set, as a sandbox server does
(the control planes' template). One JSON object a line each way.
In: ``{"name", "argv", "log"}`` forks ``sandbox_server`` with ``argv`` (plus ``--ready-fd``), its
output to ``log``; ``"main"`` names another module whose ``main(argv)`` runs (``preload``: the
modules it imports after the fork, imported here first, once), ``"env"`` and ``"cwd"`` are the
child's environment and directory (default: the template's). Out: ``{"name", "pid"}`` once
forked, ``{"name", "ready": bool, "said": line}`` when it says it is ready (false: it ended
first), ``{"name", "exited": status}`` when it ends (however). A child ends as an interpreter
does (its threads joined, its ``atexit`` run, its exit code). The template is the subreaper of
what its children leave, and it ends them all when its input closes (the test process gone).
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import selectors
import signal
import sys
import tempfile

from sandbox_server import zygote

PR_SET_CHILD_SUBREAPER = 36


def _fork_server(request: dict, keep: set[int]) -> tuple[int, int]:
    """The child's pid and the read end of its ready pipe."""
    main = importlib.import_module(request.get("main", "sandbox_server.cli")).main
    for module in request.get("preload", ()):
        if module not in sys.modules:
            importlib.import_module(module)
            gc.freeze()  # what the children share is never touched by their collections
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(ready_w)
        return pid, ready_r
    try:  # the child: a session of its own, nothing of the template's but its imports
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
        for fd in (0, 1, 2):  # a dup2 onto itself keeps os.open's close-on-exec: children would lack it
            os.set_inheritable(fd, True)
        for fd in {null, log} - {0, 1, 2}:
            os.close(fd)
        if "env" in request:
            os.environ.clear()
            os.environ.update(request["env"])
            tempfile.tempdir = None  # as a fresh process finds it, from the environment
        if "cwd" in request:
            os.chdir(request["cwd"])
        main([*request["argv"], "--ready-fd", str(ready_w)])
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - a forked child never returns into the template
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    raise SystemExit(0)  # up through the template's frames: the interpreter's own exit


def serve(warm: bool) -> None:
    if warm:  # as the local backend's template does: imports, the parser, the OpenAPI document, calls
        zygote.preload()
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
                said = os.read(key.fd, 64)
                selector.unregister(key.fd)
                os.close(key.fd)
                say({"name": name, "ready": said.startswith(b"ready"), "said": said.decode()})


if __name__ == "__main__":
    serve(warm="--bare" not in sys.argv[1:])
