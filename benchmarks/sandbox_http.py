"""The sandbox server's HTTP layer alone: ``web.py`` as it is (requests parsed by
``request_head.py``, answers written in one piece) against h11 as it served before, in one run.

Each is a server process on a Unix socket with the sandbox server's own ``web.App`` and one route
that answers what a ``bash true`` call answers; a client sends the control plane's forwarded bash
request (its bytes as the control plane writes them) on one kept-alive connection per server and
reads the answer, the two servers interleaved. Reported: the median round trip and each server's
CPU time per request (``/proc/<pid>/schedstat``, nanoseconds). This is why the server parses
HTTP itself rather than with h11 (which the rest of the project would use): the difference is
paid on every tool call, and on a loaded host (caches shared with the control plane, the caller
and the tool) it is about twice what an idle one shows (``tool_call.py``'s breakdown, "CPU of
the sandbox server").
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ._common import Result, Stats, interleaved, stats_table
from ._servers import _wait_ready

N = int(os.environ.get("BENCH_N", "2000"))
BODY = (b'{"timeout":600.0,"graceful_termination_timeout":2.0,"command":"true","cwd":null,"env":{},'
        b'"user":null,"max_output_bytes":1048576,"strip_output":false}')
REQUEST = (b"POST /api/tools/bash HTTP/1.1\r\nHost: sandbox\r\nContent-Length: %d\r\nAccept: application/json\r\n"
           b"User-Agent: idegym-client\r\nContent-Type: application/json\r\n\r\n" % len(BODY)) + BODY
KINDS = {"web.py (request_head.py)": "ours", "h11, as the server used it before": "h11"}


def _app() -> Any:
    from sandbox_server import web
    from sandbox_server.app import json_response, on_error
    from sandbox_server.http import parse_model
    from sandbox_server.models import BashCommandRequest, BashCommandResponse

    app = web.App(client_max_size=1 << 20, on_error=on_error)

    async def bash(request: web.Request) -> web.Response:
        parse_model(request.body, BashCommandRequest)
        return json_response(BashCommandResponse(stdout="", stderr="", exit_code=0, timed_out=False,
                                                 duration_seconds=0.0017, oom_killed=False))

    app.add_route("POST", "/api/tools/bash", bash)
    return app


class H11Connection:
    """The sandbox server's connection as it was on h11 (its events, state machine and writer),
    kept here only to be measured against."""

    def __init__(self, app: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import h11

        self.h11 = h11
        self.app, self.reader, self.writer = app, reader, writer
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 << 10)

    async def _next_event(self) -> Any:
        while True:
            event = self.conn.next_event()
            if event is not self.h11.NEED_DATA:
                return event
            self.conn.receive_data(await self.reader.read(1 << 20))

    async def serve(self) -> None:
        from sandbox_server import web

        h11 = self.h11
        try:
            while True:
                event = await self._next_event()
                if not isinstance(event, h11.Request):
                    return
                headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
                chunks = []
                while not isinstance(part := await self._next_event(), h11.EndOfMessage):
                    chunks.append(part.data)
                request = web.Request(event.method.decode("ascii"), event.target.decode("latin-1"), headers,
                                      b"".join(chunks), self.app)
                response = await self.app.dispatch(request)
                out = [(b"content-type", response.content_type.encode()),
                       (b"content-length", str(len(response.body)).encode()), (b"server", b"idegym-sandbox")]
                data = self.conn.send(h11.Response(status_code=response.status, headers=out))
                data += self.conn.send(h11.Data(data=response.body))
                data += self.conn.send(h11.EndOfMessage())
                self.writer.write(data)
                await self.writer.drain()
                self.conn.start_next_cycle()
        finally:
            self.writer.close()


async def _serve(kind: str, path: str, ready_fd: int) -> None:
    from sandbox_server import web

    app = _app()
    if kind == "ours":
        server = web.Server(app)
        await server.start(unix_socket=path)
    else:
        await asyncio.start_unix_server(lambda r, w: H11Connection(app, r, w).serve(), path=path, limit=1 << 20)
    os.write(ready_fd, b"ready\n")
    await asyncio.Event().wait()


def _start(kind: str, path: Path) -> subprocess.Popen:
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.sandbox_http", kind, str(path), str(write_fd)],
                            pass_fds=(write_fd,))
    os.close(write_fd)
    _wait_ready(read_fd, proc, f"the {kind} server", timeout=60)
    return proc


def _cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def _exchange(sock: socket.socket) -> None:
    sock.sendall(REQUEST)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200"), head


def run() -> Result:
    result = Result("sandbox_http", "The sandbox server's HTTP layer: web.py against h11, one forwarded bash call")
    result.notes.append(f"load average at the start: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        procs, socks = {}, {}
        try:
            for label, kind in KINDS.items():
                procs[label] = _start(kind, Path(tmp) / f"{kind}.sock")
                socks[label] = socket.socket(socket.AF_UNIX)
                socks[label].connect(str(Path(tmp) / f"{kind}.sock"))
            before = {label: _cpu_ns(proc.pid) for label, proc in procs.items()}
            counted = {label: 0 for label in KINDS}

            def call(label: str) -> None:
                _exchange(socks[label])
                counted[label] += 1

            samples = interleaved({label: (lambda x=label: call(x)) for label in KINDS}, N,
                                  label="forwarded bash request")
            cpu = {label: (_cpu_ns(proc.pid) - before[label]) / counted[label] / 1e3 for label, proc in procs.items()}
        finally:
            for sock in socks.values():
                sock.close()
            for proc in procs.values():
                proc.kill()
                proc.wait()
    stats = [Stats.of(label, values) for label, values in samples.items()]
    result.stats += stats
    ours, h11 = list(KINDS)
    print(stats_table(stats, baseline=h11))
    for label in KINDS:
        result.figures[f"{label}: server CPU per request us"] = round(cpu[label], 1)
        print(f"{label}: server CPU {cpu[label]:.1f} us a request")
    saved = cpu[h11] - cpu[ours]
    result.figures["server CPU saved per request us"] = round(saved, 1)
    result.figures["h11 / web.py, server CPU per request"] = round(cpu[h11] / cpu[ours], 2)
    result.notes.append(f"h11 costs the server {saved:.1f} us of CPU more a request ({cpu[h11] / cpu[ours]:.2f}x)")
    return result


if __name__ == "__main__":
    if len(sys.argv) == 4:
        from sandbox_server.http import run_loop

        run_loop(_serve(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    else:
        run().write()
