"""The env's direct line to its sandbox's agent endpoint: the model calls without the control
plane's round trip (~1 ms on a 2-core host), when the sandbox runs on the env's host.

The env listens on a Unix socket in ``<harness root>/.gw/`` (a directory every local sandbox sees,
read-only, at ``/opt/idegym/harness/.gw``: connecting to a socket needs no write access to its
mount), named by 128 random bits in a directory nobody but root can list, and only root may
connect to it (0600). ``POST /api/agent/start`` (through the control plane) names it with a
secret; the sandbox server connects, says the secret, and serves ``POST /api/agent/exchange``
(and nothing else) on the connection. A connection that does not say the secret is dropped; the
socket's name is unlinked once the right one is accepted. Anything wrong: the env goes through the
control plane as before. The exchanges go over the client's own HTTP connection (``client/_http.py``):
a request in one write, which wakes the server once (``http.client`` wrote head and body apart).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from pathlib import Path

from control_plane.backends.local.harness_layers import HARNESS_INSIDE, harness_root
from sandbox_server import routes
from sandbox_server.models import AgentExchangeRequest, AgentExchangeResponse

from ..client._exceptions import error_for
from ..client._http import ClientConnection

GATEWAYS = ".gw"
SLACK = 30.0
ACCEPT_FOR = 2.0
JSON = {"Content-Type": "application/json"}


STALE = 3600.0  # a socket this old was left by an env killed while it started an agent


def _sweep(gw: Path) -> None:
    now = time.time()
    for entry in gw.iterdir():
        try:
            if now - entry.lstat().st_mtime > STALE:
                entry.unlink()
        except OSError:
            pass


class DirectChannel:
    """One episode's socket; ``accept()`` after the start, then ``exchange()`` per call."""

    def __init__(self, root: Path | None = None) -> None:
        gw = (harness_root() if root is None else root) / GATEWAYS
        gw.mkdir(parents=True, exist_ok=True)
        os.chmod(gw, 0o711)  # enter, not list: a socket is found only by its name
        _sweep(gw)
        token = secrets.token_hex(16)
        self.path = gw / f"{token}.sock"
        self.inside = f"{HARNESS_INSIDE}/{GATEWAYS}/{token}.sock"
        self.secret = secrets.token_urlsafe(32)
        self._listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self._listener.listen(8)
        self._conn: ClientConnection | None = None

    def accept(self) -> bool:
        """Take the sandbox server's connection (it connected during the start); False without it."""
        assert self._listener is not None
        deadline = time.monotonic() + ACCEPT_FOR
        try:
            while (left := deadline - time.monotonic()) > 0:
                self._listener.settimeout(left)
                try:
                    sock, _ = self._listener.accept()
                except (TimeoutError, OSError):
                    return False
                if self._said_secret(sock, deadline):
                    self._conn = ClientConnection(lambda: sock, "localhost")  # noqa: B023 - called at once
                    self._conn.connect()
                    return True
                sock.close()
            return False
        finally:
            self._stop_listening()

    def _said_secret(self, sock: socket.socket, deadline: float) -> bool:
        want, got = self.secret.encode() + b"\n", b""
        try:
            while len(got) < len(want) and not got.endswith(b"\n"):
                sock.settimeout(max(deadline - time.monotonic(), 0.01))
                chunk = sock.recv(len(want) - len(got))
                if not chunk:
                    return False
                got += chunk
        except OSError:
            return False
        return secrets.compare_digest(got, want)

    def exchange(self, request: AgentExchangeRequest) -> AgentExchangeResponse:
        """One exchange; the client's typed errors for an error answer, ``OSError`` or
        ``http.client.HTTPException`` when the connection is gone."""
        assert self._conn is not None
        if self._conn.sock is None:
            raise ConnectionError("the sandbox server's exchange connection is closed")
        self._conn.sock.settimeout(request.wait + SLACK)
        status, _, body, _ = self._conn.exchange("POST", routes.AGENT_EXCHANGE.path, JSON,
                                                 request.model_dump_json().encode())
        if status != 200:
            raise error_for(status, body.decode("utf-8", "replace"), "sandbox")
        return AgentExchangeResponse.model_validate_json(body)

    def _stop_listening(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            try:
                self.path.unlink()
            except OSError:
                pass

    def close(self) -> None:
        self._stop_listening()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
