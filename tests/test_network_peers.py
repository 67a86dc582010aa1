"""``network_of``: a sandbox that joins another's network namespace (a task's services reach each
other on 127.0.0.1), and nothing else does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cp_helpers import ControlPlaneProcess

LISTEN = ("python3 -c \"import socket,os; s=socket.socket(); s.bind(('0.0.0.0', 80)); s.listen(4); "
          "print('listening', flush=True); os.fork() or [c.sendall(b'hello-from-the-peer') or c.close() "
          "for c in iter(lambda: s.accept()[0], None)]\" > /tmp/listen.out 2>&1 & "
          "for i in $(seq 100); do grep -q listening /tmp/listen.out && break; sleep 0.05; done; cat /tmp/listen.out")
CONNECT = ("python3 -c \"import socket; s=socket.create_connection(('127.0.0.1', 80), timeout=5); "
           "print(s.recv(100).decode())\" 2>&1 | tail -1")


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneProcess]:
    proc = ControlPlaneProcess(tmp_path_factory.mktemp("peers") / "state", ["--warm-pool", "1", "--ephemeral"])
    yield proc
    proc.stop()


@pytest.mark.security
def test_a_sandbox_joins_its_peers_network_and_no_other_sandbox_does(cp: ControlPlaneProcess, tmp_path: Path) -> None:
    """Can fail: without network_of every sandbox has a network namespace of its own."""
    client = cp.register()
    owner = cp.start_server(client, server_name="main", run_as_root=True)["server_id"]
    listening = cp.bash(client, owner, LISTEN)
    assert "listening" in listening["stdout"], listening  # port 80: below 1024, as root of its own sandbox
    joined = cp.start_server(client, server_name="sidecar", network_of=owner)["server_id"]
    assert cp.bash(client, joined, CONNECT)["stdout"].strip() == "hello-from-the-peer"
    # the joiner (appuser) may listen below 1024 too: a service's usual port
    port = cp.bash(client, joined, LISTEN.replace("80)", "81)"))
    assert "listening" in port["stdout"], port
    alone = cp.start_server(client, server_name="elsewhere")["server_id"]
    out = cp.bash(client, alone, CONNECT)["stdout"]
    assert "hello-from-the-peer" not in out and "Connection refused" in out, out
    # another client cannot join this client's sandbox; a stopped peer cannot be joined
    other = cp.register("other")
    resp = cp.http.post("/api/idegym-servers", json={"client_id": other, "image_tag": "idegym/builtin:latest",
                                                     "network_of": owner})
    op = cp.wait_op(resp.json()["operation_id"]) if resp.status_code == 202 else resp.json()
    assert "no server" in str(op), op
    stop = cp.http.request("DELETE", "/api/idegym-servers", json={"client_id": client, "server_id": alone})
    assert stop.status_code == 202 and cp.wait_op(stop.json()["operation_id"])["status"] == "SUCCEEDED", stop.text
    resp = cp.http.post("/api/idegym-servers", json={"client_id": client, "image_tag": "idegym/builtin:latest",
                                                     "network_of": alone})
    op = cp.wait_op(resp.json()["operation_id"]) if resp.status_code == 202 else resp.json()
    assert "not running" in str(op), op
