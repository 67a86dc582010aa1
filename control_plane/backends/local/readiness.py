"""From a started process to a usable sandbox: its processes in their cgroups, the server's
``ready`` line, and its socket published where the sandbox cannot reach."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

from sandbox_server import procfs, routes
from sandbox_server.output import read_available
from sandbox_server.polling import wait_until

from ..base import BackendError
from .cgroups import SERVER, Cgroups, sub
from .handle_data import LocalHandleData, required
from .layout import SOCKET_NAME

INIT_CHILD_TIMEOUT = 30.0


async def wait_ready(fd: int, remaining: float, timeout: float) -> None:
    """Until the server writes ``ready`` on ``fd`` (closed here); 504 after ``remaining`` seconds."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bytes] = loop.create_future()
    buf = bytearray()

    def readable() -> None:
        chunk = read_available(fd, 64)
        if chunk is None:
            return
        buf.extend(chunk)
        if (not chunk or b"\n" in buf) and not done.done():
            done.set_result(bytes(buf))

    os.set_blocking(fd, False)
    loop.add_reader(fd, readable)
    try:
        line = await asyncio.wait_for(done, remaining)
    except TimeoutError:
        raise BackendError(f"the sandbox server did not become ready within {timeout:g} s", 504) from None
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    if line.strip() != b"ready":
        raise BackendError("the sandbox server exited before it was ready")


def attach(data: LocalHandleData) -> None:
    """Record the server's pid and put the sandbox's processes into its cgroups.

    In a bwrap sandbox the server is the only child of the namespace's init (a forked server
    is nobody's there: zygote.py); until it is ready
    it starts nothing, so every later process inherits the groups. Bubblewrap was born in the
    server's groups (``cgroups.born_in``), and so were its init and a server it started: this
    finds them there and moves nothing. A move is left for a process that was not (a plain
    server; a controller the launching thread could not join), made while the server imports:
    a move by pid waits for an RCU grace period (cgroups.py). A forked server joined its groups
    itself (zygote.py).
    """
    if data.forked:
        if data.cgroups:
            Cgroups.attach(sub(data.cgroups, SERVER), required(data.init, "init")[0], single_threaded=True)
        return
    if data.isolation == "bwrap":
        init = required(data.init, "init")
        kids: list[int] = []

        def started() -> bool:
            nonlocal kids
            kids = procfs.children(init[0])
            return bool(kids) or not procfs.recorded_alive(init)

        wait_until(started, INIT_CHILD_TIMEOUT, first=0.0005, cap=0.0005)
        if not kids:
            raise BackendError("the sandbox's init process exited before starting the server")
        data.server = procfs.record(kids[0])
        pids = [init[0], kids[0]]
    else:
        pids = [required(data.server, "server")[0]]
    if data.cgroups:
        for pid in pids:
            Cgroups.attach(sub(data.cgroups, SERVER), pid)


async def warm_up(data: LocalHandleData, timeout: float) -> None:
    """One tool call (``true``, as the zygote warms up with) to a sandbox made ahead of demand,
    before it is handed out: what the server's HTTP and tool paths touch (pages shared with the
    zygote, copied at the first write; the spawner's first start) is then its own, which the first
    call of its claim or fork child would otherwise pay for (~1.5 ms of CPU and ~220 page faults
    of its server). ``BackendError`` when it does not answer."""
    body = b'{"command": "true"}'

    async def ask() -> bytes:
        reader, writer = await asyncio.open_unix_connection(data.socket)
        try:
            writer.write(f"POST {routes.BASH.path} HTTP/1.1\r\nHost: sandbox\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
            return await reader.read()
        finally:
            writer.close()

    try:
        reply = await asyncio.wait_for(ask(), timeout)
    except (OSError, TimeoutError) as exc:
        raise BackendError(f"the sandbox server did not answer its first request: {exc}", 504) from exc
    if not reply.startswith(b"HTTP/1.1 200"):
        raise BackendError(f"the sandbox server answered its first request with {reply[:200]!r}")


def publish_socket(data: LocalHandleData) -> None:
    """Hard-link the server's socket to a path outside the sandbox's reach.

    The run directory is writable inside (the server creates its socket there), so root in the
    sandbox could later swap ``server.sock`` for a symlink to another sandbox's socket. The link
    made here, while only the server has run, keeps pointing at the genuine one.
    """
    src = Path(data.run_dir) / SOCKET_NAME
    if not stat.S_ISSOCK(os.lstat(src).st_mode):
        raise BackendError(f"the sandbox server did not create its socket {src}")
    dst = Path(data.run_dir + ".sock")
    if os.path.lexists(dst):
        dst.unlink()
    os.link(src, dst, follow_symlinks=False)
    data.socket = str(dst)



