"""The template process: sandbox servers forked from one interpreter that has imported them.

Started fresh, a sandbox server holds ~24 MiB of its own (PSS): the modules it imports (aiohttp,
pydantic, its own) are private heap in every process. Forked from here, they are pages shared
with every other sandbox until written, and a start skips the imports.

The control plane (``control_plane/backends/local/zygote.py``) runs this as root in the host's
user namespace, in a mount namespace that holds the sandbox runtime at the paths a sandbox has
it (what is imported here is where the server expects it), and sends requests on a
``SOCK_SEQPACKET`` socket: JSON (the server's ``argv`` and environment, the target number of each
descriptor) with descriptors: the sandbox's namespaces, its server cgroups' ``tasks``
and the descriptors the server is to have. Per request this process joins the sandbox's pid
namespace for its children only (``setns`` of a pid namespace moves nobody), forks the server
there and returns to its own. The server joins the other namespaces — the user namespace first,
which leaves it root in the sandbox and nothing outside; the mount namespace, which makes its
root the sandbox's — says so, joins its cgroups, starts a session of its own, takes its
descriptors and environment and calls ``main(argv)``: what bubblewrap would have executed,
minus the interpreter's start. One fork of this process per server: a child in between, which
joined the namespaces and forked the server, cost a second fork and exit of this ~40 MiB
process and a hop through the scheduler on every start.

This process is single-threaded (``setns`` into a user namespace refuses threaded callers) and
is the subreaper of every server it made. It ends when the control plane closes the socket.
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import json
import os
import signal
import socket
import sys
import threading
import traceback
from typing import Any

from . import routes

# setns(2) namespace types, in the order they are named: the pid namespace (it applies to children
# only) is joined by the zygote for the fork, the others by the server, the user namespace first
# (it grants the rights the others need).
NAMESPACES = {"user": 0x10000000, "mnt": 0x00020000, "ipc": 0x08000000, "uts": 0x04000000,
              "net": 0x40000000, "cgroup": 0x02000000, "pid": 0x20000000}
PR_SET_CHILD_SUBREAPER = 36
PR_CAPBSET_READ, PR_CAPBSET_DROP = 23, 24
LINUX_CAPABILITY_VERSION_3 = 0x20080522
MAX_FDS = 32
MAX_REQUEST = 1 << 20
WARM_UP_CALLS = 20

_libc = ctypes.CDLL(None, use_errno=True)
_capabilities: set[int] = set()  # the zygote's bounding set: what a server may hold in its sandbox
_own_pid_ns = -1  # this process's pid namespace, which its children are born in again after a server's


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def bounding_set() -> set[int]:
    """This process's capability bounding set."""
    caps = set()
    for cap in range(64):
        held = _libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0)
        if held < 0:  # past the last capability this kernel knows
            break
        if held == 1:
            caps.add(cap)
    return caps


def _limit_capabilities(allowed: set[int]) -> None:
    """Joining a user namespace grants every capability in it; keep only ``allowed`` (the
    zygote's, which bubblewrap leaves a sandbox's root too), in the bounding, permitted and
    effective sets alike."""
    extra = bounding_set() - allowed
    for cap in extra:
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"dropping capability {cap} from the bounding set")
    if not extra:
        return
    header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for cap in extra:
        mask = ~(1 << (cap % 32)) & 0xFFFFFFFF
        data[cap // 32].effective &= mask
        data[cap // 32].permitted &= mask
        data[cap // 32].inheritable &= mask
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def preload() -> None:
    """Import what every server imports, and build what every server builds the same way."""
    import concurrent.futures.thread  # noqa: F401 - the server's executor threads
    import queue  # noqa: F401

    import pydantic._internal._dataclasses  # noqa: F401
    import pydantic.type_adapter  # noqa: F401

    from . import app, cli, http, web  # noqa: F401
    from .app import openapi_document

    openapi_document()
    cli.parser()


def warm_up(calls: int = WARM_UP_CALLS) -> None:
    """Serve ``calls`` bash calls here, once, on a throwaway project: what a server makes lazily
    (compiled patterns, caches, the interpreter's specialised bytecode) is then shared as well.
    Measured: 7.1 -> 5.9 MiB of private memory per forked server after 21 calls."""
    import asyncio
    import tempfile
    from pathlib import Path

    from . import cli
    from .app import create_app
    from .http import run_loop
    from .web import Server

    async def post(sock: str, path: str, body: bytes) -> bytes:
        reader, writer = await asyncio.open_unix_connection(sock)
        writer.write(f"POST {path} HTTP/1.1\r\nHost: sandbox\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()
        reply = await reader.read()
        writer.close()
        return reply

    with tempfile.TemporaryDirectory(prefix="idegym-zygote-") as tmp:
        project, sock = Path(tmp, "project"), f"{tmp}/server.sock"
        project.mkdir()
        config = cli.config_from_args(cli.parser().parse_args(
            ["serve", "--project", str(project), "--unix-socket", sock, "--no-inherit-env"]))

        async def serve_calls() -> None:
            server = Server(create_app(config), header_timeout=config.header_timeout)
            await server.start(unix_socket=sock)
            try:
                for _ in range(calls):
                    reply = await post(sock, routes.BASH.path, b'{"command": "true"}')
                    if not reply.startswith(b"HTTP/1.1 200"):
                        raise RuntimeError(f"a warm-up call failed: {reply[:300]!r}")
            finally:
                await server.close()

        run_loop(serve_calls())
    if threading.active_count() != 1:  # forking with a thread alive could copy a held lock
        raise RuntimeError(f"threads still run after the warm-up: {threading.enumerate()}")


def _reap(signum: int, frame: Any) -> None:
    """Collect every child that ended: the servers (this is their subreaper) and the children
    that forked them (``handle`` waits for those itself, and may find them collected here)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _setns(fd: int, kind: str) -> None:
    if _libc.setns(fd, NAMESPACES[kind]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"joining the sandbox's {kind} namespace: {os.strerror(err)}")


def _place_fds(targets: list[int], fds: list[int], cloexec: set[int]) -> None:
    """Descriptor ``fds[i]`` at number ``targets[i]`` (inherited by what the server executes unless
    in ``cloexec``); every other descriptor closed."""
    above = max(targets, default=2) + 1  # copies no dup2 below can overwrite
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, above) for fd in fds]
    for target, fd in zip(targets, moved, strict=True):
        os.dup2(fd, target, inheritable=target not in cloexec)
    start = 0
    for fd in sorted(set(targets)):
        if fd > start:
            os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, 1 << 20)


def _become_server(request: dict[str, Any], ns_fds: dict[str, int], cgroup_fds: list[int], fds: list[int],
                   report: int) -> None:
    """In the server, born in the sandbox's pid namespace: join its other namespaces ``ns_fds``
    (in order), say so (or why not) on ``report``, become the server. Never returns."""
    code = 1
    try:
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        try:
            for kind, fd in ns_fds.items():
                _setns(fd, kind)
                os.close(fd)
                if kind == "user":
                    _limit_capabilities(_capabilities)
        except BaseException as exc:
            os.write(report, json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
            raise
        os.write(report, b"{}")
        os.close(report)
        # "0" written to ``tasks`` moves the writing thread, this process's only one (the zygote has
        # no other): the whole server, without the lock a move of a process (``cgroup.procs``) takes
        # on cgroup v1, which waits for an RCU grace period (6-11 ms of every start, measured).
        for fd in cgroup_fds:
            os.write(fd, b"0")
        # After the move: a low-priority task holding a cgroup lock would hold up others' moves
        # (a server made ahead of demand runs at a low priority until claimed).
        if nice := int(request.get("nice", 0)):
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        os.setsid()
        _place_fds(request["targets"], fds, set(request.get("cloexec", ())))
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir("/")
        module = __import__(request["module"], fromlist=["main"])
        sys.argv = [request["module"], *request["argv"]]
        module.main(request["argv"])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported on the sandbox's log, then the process ends
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def handle(request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    """One server for ``request``; its descriptors ``fds`` are closed here."""
    n_ns, n_cg = len(request["namespaces"]), request["cgroups"]
    ns_fds, cgroup_fds, passed = fds[:n_ns], fds[n_ns:n_ns + n_cg], fds[n_ns + n_cg:]
    if (unknown := set(request["namespaces"]) - set(NAMESPACES)) or len(passed) != len(request["targets"]):
        for fd in fds:
            os.close(fd)
        return {"error": f"malformed request (namespaces {sorted(unknown)}, {len(passed)} descriptors for "
                         f"{len(request['targets'])} targets)"}
    if request["namespaces"] != [name for name in NAMESPACES if name in request["namespaces"]]:
        for fd in fds:
            os.close(fd)
        return {"error": f"namespaces {request['namespaces']} out of order: join them as {list(NAMESPACES)}"}
    joins = dict(zip(request["namespaces"], ns_fds, strict=True))
    pid_ns = joins.pop("pid", None)
    read, write = os.pipe()
    try:
        if pid_ns is not None:  # for this process's children only: the server is born there
            _setns(pid_ns, "pid")
        try:
            pid = os.fork()
            if pid == 0:
                os.close(read)
                _become_server(request, joins, cgroup_fds, passed, write)
        finally:
            if pid_ns is not None:
                _setns(_own_pid_ns, "pid")
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)
        for fd in fds:
            os.close(fd)
    try:
        raw = b""
        while chunk := os.read(read, 4096):
            raw += chunk
    finally:
        os.close(read)
    try:
        said = json.loads(raw) if raw else {"error": "the server ended before it joined the sandbox"}
    except ValueError:
        said = {"error": f"the server said {raw[:200]!r}"}
    return said if "error" in said else {"pid": pid}


def serve(sock: socket.socket) -> None:
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, MAX_FDS)
        except InterruptedError:  # pragma: no cover - retried by Python itself (PEP 475)
            continue
        if not message:
            for fd in fds:
                os.close(fd)
            return
        try:
            request = json.loads(message)
            reply = {"pong": os.getpid()} if request.get("ping") else handle(request, fds)
        except Exception as exc:  # noqa: BLE001 - one bad request never ends the zygote
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sock.send(json.dumps(reply).encode())


def main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="sandbox_server.zygote", description=__doc__.split("\n")[0])
    parser.add_argument("--socket-fd", type=int, required=True, help="the control plane's SOCK_SEQPACKET socket")
    args = parser.parse_args(argv)
    if _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("zygote: cannot become a child subreaper (servers would be nobody's children)")
    global _capabilities, _own_pid_ns
    _capabilities = bounding_set()  # before the warm-up's server drops some from it
    _own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    preload()
    try:
        warm_up()
    except Exception as exc:  # noqa: BLE001 - servers then share less, and work the same
        print(f"zygote: the warm-up failed ({type(exc).__name__}: {exc}); servers will share less memory",
              file=sys.stderr, flush=True)
        if threading.active_count() != 1:
            raise SystemExit("zygote: threads still run after a failed warm-up: not forking from here") from exc
    signal.signal(signal.SIGCHLD, _reap)  # after the warm-up, whose server reaps its own children
    # What is imported now is shared with every server: the collector never walks it (walking
    # it would write every object's header, and so copy every page, in each server).
    gc.collect()
    gc.freeze()
    sock = socket.socket(fileno=args.socket_fd)
    os.write(2, b"zygote: ready\n")
    serve(sock)


if __name__ == "__main__":
    main(sys.argv[1:])
