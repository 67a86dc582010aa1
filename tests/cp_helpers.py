"""A real control plane process for tests, and raw-HTTP helpers for the wire protocol."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.forked import ForkedProcess, Template, forkable, popen

REPO = Path(__file__).resolve().parent.parent
FAST_WATCHER = ["--watch-interval", "0.3"]
# What a control plane of each backend imports once it runs: the template imports them once, its
# children share them.
_SERVING = ("control_plane.cli", "control_plane.app", "control_plane.forward_protocol")
CONTROL_PLANE_MODULES = {"local": (*_SERVING, "control_plane.backends.local"),
                         "kubernetes": (*_SERVING, "control_plane.backends.kubernetes")}


class ControlPlaneProcess:
    """``python -m control_plane`` on a free port with its own state directory: forked from the
    tests' template (``tests/forked.py``) unless wrapped or given an environment of its own beyond
    IdeGym's variables."""

    def __init__(self, state_dir: Path, extra: Sequence[str] = (), env: dict[str, str] | None = None,
                 backend: str = "local", build_roots: Sequence[Path] | None = None,
                 wrap: Callable[[list[str]], tuple[list[str], dict[str, str]]] | None = None) -> None:
        self.backend = backend
        self.wrap = wrap  # argv -> (the argv that runs it, its environment): e.g. a namespace of its own
        self.state_dir = state_dir
        # Tests build from the repository (bundled tasks) and their temporary directories.
        roots = [REPO, Path(tempfile.gettempdir())] if build_roots is None else build_roots
        self.extra = [*(f"--build-root={root}" for root in roots), *extra]
        self.env = env
        self.log_path = state_dir.parent / f"{state_dir.name}.log"
        self.port: int | None = None
        self.start()

    def start(self) -> None:
        port_args = ["--port", str(self.port)] if self.port else ["--port", "0"]
        args = ["--state-dir", str(self.state_dir), *port_args, *FAST_WATCHER, *self.extra]
        self._log = open(self.log_path, "ab")
        if self.wrap is None and forkable(self.env):  # the template's child: its imports
            preload = CONTROL_PLANE_MODULES[self.backend]
            self.proc: subprocess.Popen | ForkedProcess = ForkedProcess("control_plane.cli", args, self.log_path,
                                                                        preload, Template.BARE, self.env)
            line = self.proc.ready_line(60)
        else:
            self.proc, line = popen([sys.executable, "-m", "control_plane", *args], self._log, self.env, 60, self.wrap)
        if not line.startswith("ready"):
            self.kill()
            raise RuntimeError(f"control plane did not start:\n{self.log_path.read_text()[-3000:]}")
        self.port = int(line.split()[1])
        self.address = f"http://127.0.0.1:{self.port}"
        # The state directory's token (absent with --auth USER:PASSWORD or none); `url` carries it.
        token = self.state_dir / "token"
        self.auth = ("idegym", token.read_text().strip()) if token.exists() else None
        self.url = f"http://{self.auth[0]}:{self.auth[1]}@127.0.0.1:{self.port}" if self.auth else self.address
        # No bound on connections, kept alive ones or their idle time: httpcore (1.0.9) may close
        # a connection it has just handed to a waiting request (as a surplus idle one, or one idle
        # too long) while that request is under way, and the request then waits its whole read
        # timeout for an answer its socket will not deliver. Tests sharing this client between
        # many threads (test_faults: 120 calls at once) never reach those closes this way.
        self.http = httpx.Client(base_url=self.address, timeout=120, auth=self.auth,
                                 limits=httpx.Limits(max_connections=None, max_keepalive_connections=None,
                                                     keepalive_expiry=None))

    def kill(self) -> None:
        """SIGKILL: what a crash looks like."""
        if getattr(self, "http", None) is not None:
            self.http.close()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._log.close()

    def stop(self) -> None:
        if getattr(self, "http", None) is not None:
            self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()

    # -- raw wire helpers -------------------------------------------------------------------

    def register(self, name: str = "tester") -> str:
        resp = self.http.post("/api/clients", json={"name": name, "nodes_count": 0, "namespace": "idegym"})
        assert resp.status_code == 200, resp.text
        return resp.json()["id"]

    def wait_op(self, op_id: int, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            body = self.http.get(f"/api/operations/status/{op_id}").json()
            if body["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                return body
            time.sleep(0.02)
        raise AssertionError(f"operation {op_id} did not end in {timeout} s")

    def start_server(self, client_id: str, **fields: Any) -> dict[str, Any]:
        body = {"client_id": client_id, "image_tag": "idegym/builtin:latest", **fields}
        resp = self.http.post("/api/idegym-servers", json=body)
        assert resp.status_code == 202, resp.text
        op = self.wait_op(resp.json()["operation_id"])
        assert op["status"] == "SUCCEEDED", op
        import json

        return json.loads(op["result"])

    def forward(self, client_id: str, server_id: int, path: str, body: Any = None, method: str = "POST",
                wait: float | None = 120) -> httpx.Response:
        headers = {"Prefer": f"wait={wait}"} if wait is not None else {}
        return self.http.request(method, f"/api/forward/{client_id}/{server_id}/{path}", json=body, headers=headers)

    def bash(self, client_id: str, server_id: int, command: str, **fields: Any) -> dict[str, Any]:
        resp = self.forward(client_id, server_id, "api/tools/bash", {"command": command, **fields})
        assert resp.status_code == 200, resp.text
        return resp.json()

    def status(self, client_id: str, server_id: int) -> dict[str, Any]:
        resp = self.http.get(f"/api/idegym-servers/{server_id}/status", params={"client_id": client_id})
        assert resp.status_code == 200, resp.text
        return resp.json()


def wait_job(cp: ControlPlaneProcess, name: str, timeout: float, interval: float) -> dict:
    """The status of build job ``name`` once it is no longer in progress."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = cp.http.get(f"/api/jobs/status/{name}").json()
        if job["status"] != "in_progress":
            return job
        time.sleep(interval)
    raise AssertionError(f"job {name} still in progress after {timeout} s")
