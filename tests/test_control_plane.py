"""The control plane over real HTTP on the local backend: protocol, reuse, lifecycle, watcher."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import yaml

from sandbox_server.models import ErrorBody
from tests.cp_helpers import ControlPlaneProcess
from tests.helpers import SEEDS

SEED = yaml.safe_load((SEEDS / "control-plane-api.yaml").read_text())
BUILTIN = "idegym/builtin:latest"


def test_health_and_every_seed_path_is_served(cp: ControlPlaneProcess) -> None:
    assert cp.http.get("/health").json()["status"] == "healthy"
    ours = cp.http.get("/openapi.json").json()["paths"]
    for path, methods in SEED["paths"].items():
        if path.startswith("/api/forward"):
            continue
        assert path in ours, path
        for method in methods:
            assert method in ours[path], (method, path)
    # the forward route answers every method of ``specs/`` (404 here: unknown client, not 405)
    for method in ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
        resp = cp.http.request(method, "/api/forward/11111111-2222-3333-4444-555555555555/1/api/health")
        assert resp.status_code == 404, (method, resp.status_code)


def test_client_life_cycle(cp: ControlPlaneProcess) -> None:
    client_id = cp.register("life")
    beat = cp.http.post("/api/clients/heartbeat", json={"client_id": client_id, "availability": "ALIVE"}).json()
    assert beat["availability"] == "ALIVE" and beat["id"] == client_id
    assert cp.http.post("/api/clients/finish", json={"client_id": client_id}).json()["availability"] == "FINISHED"
    resp = cp.http.request("DELETE", "/api/clients", json={"client_id": client_id, "namespace": "idegym"})
    assert resp.status_code == 202
    op = cp.wait_op(resp.json()["operation_id"])
    assert op["status"] == "SUCCEEDED" and json.loads(op["result"])["availability"] == "STOPPED"
    unknown = cp.http.post("/api/clients/heartbeat", json={"client_id": "11111111-2222-3333-4444-555555555555"})
    assert unknown.status_code == 404


def test_start_forward_and_operation_record(cp: ControlPlaneProcess) -> None:
    client_id = cp.register()
    started = cp.start_server(client_id)
    assert started["server_id"] >= 1 and started["reused"] is False and started["need_to_reset"] is False
    sid = started["server_id"]
    # the published client's way: 202 + poll, the result body as JSON text
    resp = cp.forward(client_id, sid, "api/tools/bash", {"command": "echo polled"}, wait=None)
    assert resp.status_code == 202
    op = cp.wait_op(resp.json()["async_operation_id"])
    assert op["status"] == "SUCCEEDED" and op["request_type"] == "FORWARD_REQUEST"
    result = json.loads(op["result"])
    assert result["status_code"] == 200
    assert json.loads(result["body"])["stdout"] == "polled\n"
    for key in ("scheduled_at", "started_at", "finished_at"):
        assert isinstance(op[key], int)
    # our way: Prefer: wait answers in the same response, still recorded
    resp = cp.forward(client_id, sid, "api/tools/bash", {"command": "echo inline"})
    assert resp.status_code == 200 and resp.json()["stdout"] == "inline\n"
    op_id = int(resp.headers["X-IdeGym-Operation-Id"])
    assert cp.http.get(f"/api/operations/status/{op_id}").json()["status"] == "SUCCEEDED"
    assert cp.http.get("/api/operations/status/999999").status_code == 404


def test_forward_errors_keep_the_sandbox_status_and_query(cp: ControlPlaneProcess) -> None:
    client_id = cp.register()
    sid = cp.start_server(client_id)["server_id"]
    resp = cp.forward(client_id, sid, "api/tools/file/download", {"file_path": "missing.txt"}, wait=None)
    op = cp.wait_op(resp.json()["async_operation_id"])
    assert op["status"] == "FAILED"
    error = json.loads(op["result"])
    assert error["status_code"] == 404 and "missing.txt" in error["body"]
    inline = cp.forward(client_id, sid, "api/tools/file/download", {"file_path": "missing.txt"})
    assert inline.status_code == 404 and inline.headers["X-IdeGym-Forwarded"] == "sandbox"
    resp = cp.forward(client_id, sid, "api/health?probe=1&x=y", method="GET", wait=None)
    op = cp.wait_op(resp.json()["async_operation_id"])
    assert json.loads(op["request"])["path"] == "api/health?probe=1&x=y"


def test_bodies_of_several_megabytes(cp: ControlPlaneProcess) -> None:
    import base64

    client_id = cp.register()
    sid = cp.start_server(client_id)["server_id"]
    data = os.urandom(3 * 1024 * 1024)
    resp = cp.forward(client_id, sid, "api/tools/file/upload",
                      {"file_path": "big.bin", "content_base64": base64.b64encode(data).decode()}, wait=None)
    op = cp.wait_op(resp.json()["async_operation_id"])
    assert op["status"] == "SUCCEEDED"
    resp = cp.forward(client_id, sid, "api/tools/file/download", {"file_path": "big.bin", "length": len(data)},
                      wait=None)
    op = cp.wait_op(resp.json()["async_operation_id"])
    body = json.loads(json.loads(op["result"])["body"])
    assert base64.b64decode(body["content_base64"]) == data


def test_bash_env_values_are_not_stored(cp: ControlPlaneProcess) -> None:
    client_id = cp.register()
    sid = cp.start_server(client_id)["server_id"]
    resp = cp.forward(client_id, sid, "api/tools/bash", {"command": "true", "env": {"TOKEN": "hunter2-secret"}})
    op = cp.http.get(f"/api/operations/status/{resp.headers['X-IdeGym-Operation-Id']}").json()
    assert "hunter2-secret" not in op["request"] and "TOKEN" in op["request"]
    assert "hunter2-secret" not in cp.log_path.read_text()


def test_validation_errors_are_422_in_the_seed_shape(cp: ControlPlaneProcess) -> None:
    client_id = cp.register()
    for body in ({"client_id": client_id, "image_tag": "UPPER/case"},
                 {"client_id": client_id, "image_tag": BUILTIN, "labels": {"app": "x"}},
                 {"client_id": client_id, "image_tag": BUILTIN, "annotations": {"prometheus.io/scrape": "1"}},
                 {"client_id": client_id, "image_tag": BUILTIN, "pod_overrides": {"serviceAccountName": "x"}},
                 {"client_id": "not-a-uuid", "image_tag": BUILTIN}):
        resp = cp.http.post("/api/idegym-servers", json=body)
        assert resp.status_code == 422, (body, resp.text)
        assert all({"loc", "msg", "type"} <= set(item) for item in resp.json()["detail"])
    resp = cp.http.post("/api/idegym-servers", content=b"{nope", headers={"content-type": "application/json"})
    assert resp.status_code == 422


def test_unknown_image_fails_the_start_with_a_reason(cp: ControlPlaneProcess) -> None:
    client_id = cp.register()
    image = "no/such-image-does-not-exist:1"
    resp = cp.http.post("/api/idegym-servers", json={"client_id": client_id, "image_tag": image,
                                                     "server_start_wait_timeout_in_seconds": 30})
    op = cp.wait_op(resp.json()["operation_id"])
    assert op["status"] == "FAILED"
    error = json.loads(op["result"])
    assert error["status_code"] == 404 and image in error["body"]
    servers = cp.http.get("/api/idegym-servers", params={"client_id": client_id,
                                                         "include_terminal": "true"}).json()["servers"]
    assert servers[0]["availability"] == "FAILED_TO_START" and servers[0]["details"]


def test_every_error_is_one_shape_with_the_kind_of_its_status(cp: ControlPlaneProcess) -> None:
    """One renderer (``ErrorBody``): synchronous errors, aiohttp's own, an operation answered inline."""
    def body(resp, status: int, kind: str) -> ErrorBody:
        assert resp.status_code == status, resp.text
        error = ErrorBody.model_validate(resp.json())
        assert error.error == kind and error.message == error.detail and error.message, error
        return error

    body(cp.http.get("/api/no-such-route"), 404, "NotFound")
    body(cp.http.put("/health"), 405, "MethodNotAllowed")
    body(cp.http.post("/api/clients/heartbeat", json={"client_id": "11111111-2222-3333-4444-555555555555"}),
         404, "NotFound")
    client_id = cp.register()
    image = "no/such-image-does-not-exist:2"
    failed = body(cp.http.post("/api/idegym-servers", headers={"Prefer": "wait=60"}, json={
        "client_id": client_id, "image_tag": image, "server_start_wait_timeout_in_seconds": 30}), 404, "NotFound")
    assert image in failed.message
    sid = cp.start_server(client_id)["server_id"]
    cp.http.post("/api/idegym-servers/finish", json={"client_id": client_id, "server_id": sid})
    body(cp.forward(client_id, sid, "api/tools/bash", {"command": "true"}), 410, "Gone")


def test_clients_cannot_reach_each_others_servers(cp: ControlPlaneProcess) -> None:
    owner, intruder = cp.register("owner"), cp.register("intruder")
    sid = cp.start_server(owner)["server_id"]
    assert cp.forward(intruder, sid, "api/tools/bash", {"command": "id"}).status_code == 404
    assert cp.http.get(f"/api/idegym-servers/{sid}/status", params={"client_id": intruder}).status_code == 404
    assert cp.http.request("DELETE", "/api/idegym-servers",
                           json={"client_id": intruder, "server_id": sid}).status_code == 404
    assert cp.http.get("/api/idegym-servers", params={"client_id": intruder}).json()["servers"] == []
    assert cp.bash(owner, sid, "echo mine")["stdout"] == "mine\n"


def test_finish_then_forward_is_410_and_stop_is_idempotent(cp: ControlPlaneProcess) -> None:
    client_id = cp.register()
    sid = cp.start_server(client_id)["server_id"]
    finished = cp.http.post("/api/idegym-servers/finish", json={"client_id": client_id, "server_id": sid})
    assert finished.status_code == 200
    assert cp.forward(client_id, sid, "api/tools/bash", {"command": "true"}).status_code == 410
    for _ in range(2):
        resp = cp.http.request("DELETE", "/api/idegym-servers", json={"client_id": client_id, "server_id": sid})
        assert resp.status_code == 202
        assert cp.wait_op(resp.json()["operation_id"])["status"] == "SUCCEEDED"
    assert cp.status(client_id, sid)["availability"] == "STOPPED"


def _reuse(cp: ControlPlaneProcess, strategy: str) -> tuple[int, int, dict]:
    """A client finishes a server it used, then starts one again (reuse stays within a client)."""
    client = cp.register("reuser")
    sid = cp.start_server(client, reuse_strategy="NONE")["server_id"]
    cp.bash(client, sid, f"echo tmpnote > /tmp/note-{sid}; echo changed > file.txt; "
                         f"(sleep 300 & echo $! > /tmp/sleeper-{sid})")
    cp.http.post("/api/idegym-servers/finish", json={"client_id": client, "server_id": sid})
    started = cp.start_server(client, reuse_strategy=strategy)
    return sid, started["server_id"], started | {"client": client}


def test_reuse_reset_keeps_the_server_and_asks_for_a_reset(cp: ControlPlaneProcess) -> None:
    sid, reused_id, started = _reuse(cp, "RESET")
    assert reused_id == sid and started["reused"] is True and started["need_to_reset"] is True
    client = started["client"]
    assert cp.status(client, sid)["availability"] == "REUSED"
    reset = cp.forward(client, sid, "api/project/reset", {})
    assert reset.status_code == 200 and reset.json()["status"] == "success"
    out = cp.bash(client, sid, f"cat /tmp/note-{sid}; ls file.txt 2>&1; "
                               f"kill -0 $(cat /tmp/sleeper-{sid}) 2>/dev/null && echo alive || echo dead")["stdout"]
    lines = out.splitlines()
    assert lines[0] == "tmpnote"  # RESET keeps the rest of the filesystem
    assert "No such file" in lines[1]  # ... but the project is the image's again
    assert lines[2] == "dead"  # and no tool process survived
    assert cp.status(client, sid)["availability"] == "ALIVE"


def test_reuse_restart_is_fresh_with_the_same_id(cp: ControlPlaneProcess) -> None:
    sid, reused_id, started = _reuse(cp, "RESTART")
    assert reused_id == sid and started["reused"] is True and started["need_to_reset"] is False
    out = cp.bash(started["client"], sid, "ls file.txt 2>&1")["stdout"]
    assert "No such file" in out


def test_restart_reuse_is_as_fresh_as_a_new_sandbox(cp_local: ControlPlaneProcess) -> None:
    """Only real isolation can show this: /tmp and processes are the sandbox's own."""
    cp = cp_local
    sid, reused_id, started = _reuse(cp, "RESTART")
    out = cp.bash(started["client"], sid, f"cat /tmp/note-{sid} 2>&1; pgrep -c sleep || true")["stdout"]
    assert "No such file" in out.splitlines()[0] and out.splitlines()[1] == "0"


def test_reuse_none_always_creates(cp: ControlPlaneProcess) -> None:
    sid, new_id, started = _reuse(cp, "NONE")
    assert new_id != sid and started["reused"] is False


def test_reuse_matches_on_all_fields(cp: ControlPlaneProcess) -> None:
    first = cp.register("matcher")
    sid = cp.start_server(first, reuse_strategy="NONE", server_name="alpha")["server_id"]
    cp.http.post("/api/idegym-servers/finish", json={"client_id": first, "server_id": sid})
    namesake = cp.register("matcher")
    assert cp.start_server(namesake, server_name="alpha")["server_id"] != sid  # another client, of the same name
    assert cp.start_server(first, server_name="beta")["server_id"] != sid  # server name differs
    assert cp.start_server(first, server_name="alpha", run_as_root=True)["server_id"] != sid  # root differs
    assert cp.start_server(first, server_name="alpha")["server_id"] == sid
    # Limits are part of the sandbox: a server started with others is not the one asked for.
    limited = {"limits": {"memory": "128Mi"}}
    small = cp.start_server(first, reuse_strategy="NONE", server_name="gamma", resources=limited)["server_id"]
    cp.http.post("/api/idegym-servers/finish", json={"client_id": first, "server_id": small})
    assert cp.start_server(first, server_name="gamma")["server_id"] != small  # unlimited asked
    assert cp.start_server(first, server_name="gamma",
                           resources={"limits": {"memory": "256Mi"}})["server_id"] != small
    assert cp.start_server(first, server_name="gamma", resources=limited)["server_id"] == small


def test_four_starts_racing_for_one_finished_server(cp: ControlPlaneProcess) -> None:
    client = cp.register("racer")
    sid = cp.start_server(client, reuse_strategy="NONE")["server_id"]
    cp.http.post("/api/idegym-servers/finish", json={"client_id": client, "server_id": sid})
    results: list[dict] = []

    def go() -> None:
        results.append(cp.start_server(client, reuse_strategy="RESET"))

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [r["server_id"] for r in results]
    assert ids.count(sid) == 1, ids  # exactly one took the FINISHED server
    assert len(set(ids)) == len(ids) == 4
    assert sum(r["reused"] for r in results) == 1


def test_keepalive_extends_and_never_shortens(cp: ControlPlaneProcess) -> None:
    client_id = cp.register()
    sid = cp.start_server(client_id)["server_id"]
    long = cp.http.post("/api/idegym-servers/keepalive", json={"client_id": client_id, "server_id": sid,
                                                              "minutes": 60}).json()
    short = cp.http.post("/api/idegym-servers/keepalive", json={"client_id": client_id, "server_id": sid,
                                                               "minutes": 1}).json()
    assert short["keepalive_until"] == long["keepalive_until"]
    assert 58 < short["minutes"] <= 60
    bad = cp.http.post("/api/idegym-servers/keepalive", json={"client_id": client_id, "server_id": sid,
                                                             "minutes": 0})
    assert bad.status_code == 422


def test_status_reads_are_not_activity(cp: ControlPlaneProcess) -> None:
    client_id = cp.register()
    sid = cp.start_server(client_id)["server_id"]
    before = cp.status(client_id, sid)["last_activity_at"]
    time.sleep(0.05)
    for _ in range(3):
        status = cp.status(client_id, sid)
    assert status["last_activity_at"] == before and status["idle_seconds"] > 0
    assert status["pod_ready"] is True
    cp.bash(client_id, sid, "true")
    assert cp.status(client_id, sid)["last_activity_at"] > before


def test_restart_endpoint_gives_a_fresh_sandbox(cp: ControlPlaneProcess) -> None:
    client_id = cp.register()
    sid = cp.start_server(client_id)["server_id"]
    cp.bash(client_id, sid, "echo y > work.txt")
    resp = cp.http.post("/api/idegym-servers/restart", json={"client_id": client_id, "server_id": sid},
                        headers={"Prefer": "wait=60"})
    assert resp.status_code == 200, resp.text
    assert "No such file" in cp.bash(client_id, sid, "ls work.txt 2>&1")["stdout"]
    if cp.backend == "local":  # /tmp is the sandbox's own only with real isolation
        cp.bash(client_id, sid, "echo x > /tmp/mark")
        cp.http.post("/api/idegym-servers/restart", json={"client_id": client_id, "server_id": sid},
                     headers={"Prefer": "wait=60"})
        assert "No such file" in cp.bash(client_id, sid, "ls /tmp/mark 2>&1")["stdout"]


def test_capabilities_and_list(cp: ControlPlaneProcess) -> None:
    client_id = cp.register()
    sid = cp.start_server(client_id)["server_id"]
    caps = cp.http.get(f"/api/idegym-servers/{sid}/capabilities?client_id={client_id}").json()
    assert {"tools", "rewards"} <= set(caps["plugins"])
    listed = cp.http.get("/api/idegym-servers", params={"client_id": client_id}).json()
    assert listed["client_id"] == client_id and listed["servers"][0]["server_id"] == sid
    assert listed["servers"][0]["usable"] is True


def test_code_runner_requests_are_isolated(cp_local: ControlPlaneProcess) -> None:
    cp = cp_local
    first = cp.http.post("/execute", json={"language": "bash", "code": "echo secret > /tmp/left; "
                                                                       "sleep 60 & echo $HOSTNAME"}).json()
    assert first["exitCode"] == 0
    second = cp.http.post("/execute", json={"language": "bash",
                                            "code": "cat /tmp/left 2>&1; pgrep -c sleep || true"}).json()
    assert "No such file" in second["stdout"] and second["stdout"].splitlines()[-1] == "0"
    assert cp.http.post("/execute", json={"language": "cobol", "code": "x"}).status_code == 422


def test_metrics(cp: ControlPlaneProcess) -> None:
    cp.register()
    text = cp.http.get("/metrics").text
    assert "idegym_http_requests_total" in text and "idegym_servers" in text


def test_auth_is_required_everywhere_but_health(tmp_path: Path) -> None:
    proc = ControlPlaneProcess(tmp_path / "state", ["--auth", "alice:s3cret", "--warm-pool", "0", "--ephemeral"])
    try:
        assert proc.http.get("/health").status_code == 200
        for method, path in (("POST", "/api/clients"), ("GET", "/metrics"), ("GET", "/api/operations/status/1"),
                             ("GET", "/openapi.json")):
            resp = proc.http.request(method, path, json={"name": "x"})
            assert resp.status_code == 401, path
        ok = proc.http.post("/api/clients", json={"name": "x"}, auth=("alice", "s3cret"))
        assert ok.status_code == 200
        assert proc.http.post("/api/clients", json={"name": "x"}, auth=("alice", "wrong")).status_code == 401
    finally:
        proc.stop()


def test_without_bubblewrap_it_still_works_and_says_so(tmp_path: Path) -> None:
    proc = ControlPlaneProcess(tmp_path / "state", ["--isolation", "none", "--warm-pool", "0", "--ephemeral"])
    try:
        client = proc.register()
        sid = proc.start_server(client)["server_id"]
        out = proc.bash(client, sid, "echo plain > f.txt && cat f.txt")
        assert out["stdout"] == "plain\n"
        reset = proc.forward(client, sid, "api/project/reset", {})
        assert reset.json()["status"] == "success"
        assert "No such file" in proc.bash(client, sid, "cat f.txt 2>&1")["stdout"]
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    assert log.count("SANDBOXES ARE NOT ISOLATED") == 1, log[-2000:]
