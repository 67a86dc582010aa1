"""Bash round trip through the sandbox server against the same command run directly.

Baseline: ``subprocess.run(["bash", "-c", cmd])`` in this process. Measured: ``POST /api/tools/bash``
to a sandbox server over a kept-alive connection, on TCP and on a Unix socket. Target: the
server's median overhead is at most 1 ms over the direct call.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from ._common import Result, Stats, check_target, interleaved, stats_table

N = int(os.environ.get("BENCH_N", "400"))


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("sandbox")
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def start_server(tmp: Path, where: list[str]) -> subprocess.Popen:
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandbox_server", "serve", "--project", str(tmp / "project"),
         "--state-dir", str(tmp / "state"), "--ready-fd", str(write_fd), *where],
        pass_fds=(write_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    os.close(write_fd)
    select.select([read_fd], [], [], 30)
    assert os.read(read_fd, 16) == b"ready\n", "sandbox server did not start"
    os.close(read_fd)
    return proc


def post(conn: http.client.HTTPConnection, body: bytes) -> dict:
    conn.request("POST", "/api/tools/bash", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = json.loads(resp.read())
    assert resp.status == 200 and data["exit_code"] == 0, data
    return data


def run() -> Result:
    result = Result("bash_roundtrip", "Bash tool round trip: sandbox server vs direct subprocess")
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        (tmp / "project").mkdir()
        port_sock = socket.socket()
        port_sock.bind(("127.0.0.1", 0))
        port = port_sock.getsockname()[1]
        port_sock.close()
        tcp = start_server(tmp / "tcp", ["--port", str(port)]) if (tmp / "tcp").mkdir() is None else None
        (tmp / "unix").mkdir()
        sock_path = str(tmp / "unix" / "s.sock")
        unix = start_server(tmp / "unix", ["--unix-socket", sock_path])
        try:
            tcp_conn = http.client.HTTPConnection("127.0.0.1", port)
            unix_conn = UnixHTTPConnection(sock_path)
            for command in ("true", "echo hello"):
                body = json.dumps({"command": command}).encode()
                samples = interleaved({
                    "direct subprocess": lambda c=command: subprocess.run(
                        ["bash", "-c", c], capture_output=True, check=True, cwd=tmp / "project"),
                    "server (TCP)": lambda b=body: post(tcp_conn, b),
                    "server (Unix socket)": lambda b=body: post(unix_conn, b),
                }, N, label=f"bash {command!r}")
                stats = [Stats.of(f"{name}: {command}", s) for name, s in samples.items()]
                result.stats += stats
                print(f"\n{command!r}:")
                print(stats_table(stats, baseline=f"direct subprocess: {command}"))
                direct = stats[0].median_ms
                for s in stats[1:]:
                    key = f"overhead {s.label}"
                    result.figures[key + " ms"] = round(s.median_ms - direct, 4)
                    result.figures[key + " ratio"] = round(s.median_ms / direct, 3)
            worst = max(v for k, v in result.figures.items() if k.endswith(" ms"))
            _user_switches(result, tmp)
            target = check_target("median server overhead over direct call (worst case)", worst, 1.0)
            result.targets["server_overhead"] = target
            print("\n" + target["text"])
        finally:
            for proc in (tcp, unix):
                if proc is not None:
                    proc.terminate()
                    proc.wait(10)
    return result


def _user_switches(result: Result, tmp: Path) -> None:
    """What a root server pays to run a tool as the tool user: the same bash, started as is,
    through setpriv, and through our static helper (``sandbox_server/native/as_user.c``)."""
    import shutil

    from sandbox_server.process import AS_USER

    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None or not os.access(AS_USER, os.X_OK):
        result.notes.append("user switch not measured: needs root, setpriv and the built helper (make)")
        return
    bash = shutil.which("bash")
    run = {
        "bash as root": [bash, "-c", "true"],
        "setpriv, then bash as nobody": [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--", bash,
                                         "-c", "true"],
        "as-user helper, then bash as nobody": [AS_USER, "65534", "65534", "-", bash, "-c", "true"],
    }
    samples = interleaved({k: lambda a=a: subprocess.run(a, capture_output=True, check=True, cwd=tmp)
                           for k, a in run.items()}, N, label="switching to the tool user")
    stats = [Stats.of(name, s) for name, s in samples.items()]
    result.stats += stats
    print("\nswitching to the tool user:")
    print(stats_table(stats, baseline="bash as root"))
    for s in stats[1:]:
        result.figures[f"user switch {s.label} ms"] = round(s.median_ms - stats[0].median_ms, 4)


if __name__ == "__main__":
    run().write()
