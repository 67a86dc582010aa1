"""Image builds (build-push-images, job status) and snapshots (snapshot, restore, prepare, exists)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.cp_helpers import ControlPlaneProcess, wait_job
from tests.helpers import wait_until


def _wait_job(cp: ControlPlaneProcess, name: str, timeout: float = 180) -> dict:
    return wait_job(cp, name, timeout, 0.1)


def test_build_an_image_from_yaml_and_start_it(cp_local: ControlPlaneProcess, tmp_path: Path) -> None:
    cp = cp_local
    project = tmp_path / "calc"
    project.mkdir()
    (project / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    yaml_text = f"""
images:
  - name: calc-env
    project: {{path: {project}}}
    commands:
      - echo built-by-yaml > /opt/marker
      - chown -R appuser /home/appuser/work
    env: {{CALC_MODE: fast}}
  - name: broken-env
    commands: ["echo about to fail >&2; exit 3"]
"""
    resp = cp.http.post("/api/build-push-images", json={"namespace": "idegym", "yaml_content": yaml_text})
    assert resp.status_code == 200, resp.text
    good, bad = resp.json()["job_names"]
    built = _wait_job(cp, good)
    assert built["status"] == "success" and built["tag"].startswith("calc-env:"), built
    failed = _wait_job(cp, bad)
    assert failed["status"] == "failure" and "exit" in failed["details"].lower(), failed
    client = cp.register()
    sid = cp.start_server(client, image_tag=built["tag"])["server_id"]
    out = cp.bash(client, sid, "cat /opt/marker; cat calc.py | head -1; echo $CALC_MODE")["stdout"]
    assert out.splitlines() == ["built-by-yaml", "def add(a, b):", "fast"]
    # the same YAML again: content-addressed tags are not rebuilt
    again = cp.http.post("/api/build-push-images", json={"yaml_content": yaml_text}).json()["job_names"][0]
    rebuilt = _wait_job(cp, again)
    assert rebuilt["tag"] == built["tag"] and "already built" in rebuilt["details"]


def test_bad_build_requests(cp_local: ControlPlaneProcess) -> None:
    cp = cp_local
    for body in ({"yaml_content": "images: [unclosed"}, {"yaml_content": "nothing: here"},
                 {"yaml_content": "images:\n  - tag: UPPER/Case:1\n"}):
        resp = cp.http.post("/api/build-push-images", json=body)
        assert resp.status_code == 400 and resp.json()["message"], body
    assert cp.http.post("/api/build-push-images", json={}).status_code == 422
    assert cp.http.get("/api/jobs/status/no-such-job").status_code == 404


def test_snapshot_and_restore(cp: ControlPlaneProcess) -> None:
    client = cp.register()
    sid = cp.start_server(client)["server_id"]
    cp.bash(client, sid, "echo snapshotted > state.txt")
    resp = cp.http.post("/api/idegym-servers/snapshot", json={"client_id": client, "server_id": sid})
    if cp.backend == "kubernetes":  # the simulator's cluster has pod snapshots switched off by default
        assert resp.status_code == 400 and "snapshot" in resp.json()["message"].lower()
        return
    assert resp.status_code == 202
    op = cp.wait_op(resp.json()["operation_id"])
    assert op["status"] == "SUCCEEDED", op
    snap = json.loads(op["result"])
    assert snap["snapshot_id"] == str(sid) and snap["snapshot_tag"]
    cp.bash(client, sid, "echo later > state.txt")
    for ref in ({"id": snap["snapshot_id"]}, {"id": snap["snapshot_id"], "tag": snap["snapshot_tag"]}):
        restored = cp.start_server(client, reuse_strategy="NONE", snapshot=ref)["server_id"]
        assert restored != sid
        assert cp.bash(client, restored, "cat state.txt")["stdout"] == "snapshotted\n"
    resp = cp.http.post("/api/idegym-servers", json={"client_id": client, "image_tag": "idegym/builtin:latest",
                                                     "snapshot": {"id": "9999"}})
    op = cp.wait_op(resp.json()["operation_id"])
    assert op["status"] == "FAILED" and json.loads(op["result"])["status_code"] == 404


def test_prepare_snapshots_and_exists(cp_local: ControlPlaneProcess) -> None:
    cp = cp_local
    client = cp.register()
    query = {"image_tag": "idegym/builtin:latest", "server_name": "prepared-one", "run_as_root": "false",
             "server_kind": "idegym", "namespace": "idegym"}
    assert cp.http.get("/api/snapshots/exists", params=query).json() == {
        "exists": False, "snapshot_name": None, "snapshot_tag": None}
    requests = [{"client_id": client, "image_tag": "idegym/builtin:latest", "server_name": "prepared-one"},
                {"client_id": client, "image_tag": "no/such-image:1", "server_name": "prepared-two"}]
    resp = cp.http.post("/api/snapshots/prepare", json={"requests": requests})
    assert resp.status_code == 202
    request_id = resp.json()["request_id"]
    deadline = time.monotonic() + 120
    while True:
        status = cp.http.get(f"/api/snapshots/prepare/{request_id}").json()
        if status["status"] == "READY" or time.monotonic() > deadline:
            break
        assert status["results"] is None
        time.sleep(0.1)
    assert status["status"] == "READY" and status["total_requested"] == 2
    assert status["succeeded"] == 1 and status["failed"] == 1
    ok = next(r for r in status["results"] if r["status"] == "success")
    assert len(ok["request_hash"]) == 64 and ok["snapshot_name"] and ok["snapshot_tag"]
    exists = cp.http.get("/api/snapshots/exists", params=query).json()
    assert exists == {"exists": True, "snapshot_name": ok["snapshot_name"], "snapshot_tag": ok["snapshot_tag"]}
    job = cp.http.get(f"/api/snapshots/jobs/{request_id}-0").json()
    assert job["status"] in ("success", "failure")
    assert cp.http.get("/api/snapshots/prepare/nope").status_code == 404
    restored = cp.start_server(client, snapshot={"id": ok["snapshot_name"]}, server_name="prepared-one")
    assert restored["server_id"]


def _limited(tmp_path: Path, *flags: str) -> ControlPlaneProcess:
    tmp_path.mkdir(exist_ok=True)
    return ControlPlaneProcess(tmp_path / "state", ["--warm-pool", "0", "--ephemeral", *flags])


def _refused(resp, flag: str) -> None:
    """A 429 whose message names ``flag``."""
    assert resp.status_code == 429 and flag in resp.json()["message"], resp.text


def test_every_route_that_makes_a_sandbox_counts_against_max_servers(tmp_path: Path) -> None:
    """``--max-servers`` bounds the sandboxes of every route: a snapshot preparation's (a sandbox
    per request) and the code runner's wait their turn in the creation queue like starts and
    forks, and past ``--queue-timeout`` answer 429 naming the limit.

    Can fail: it did on main, where only servers counted: with ``--max-servers 1`` a preparation
    of six ran six sandboxes at once, beside a live server.
    """
    # The three preparations take turns: the last waits for the other two. With a 3 s --queue-timeout
    # 2 of 3 succeeded once under the suite's load (likely that wait), so they get a queue of their own.
    cp = _limited(tmp_path / "queued", "--max-servers", "1", "--queue-timeout", "120")
    sandboxes = cp.state_dir / "sandboxes"
    try:
        client = cp.register()
        three = [{"client_id": client, "image_tag": "idegym/builtin:latest", "server_name": f"p{i}"} for i in range(3)]
        request_id = cp.http.post("/api/snapshots/prepare", json={"requests": three}).json()["request_id"]
        most = 0
        while (status := cp.http.get(f"/api/snapshots/prepare/{request_id}").json())["status"] != "READY":
            most = max(most, len([p for p in sandboxes.iterdir() if p.name.startswith("prep-")]))
            time.sleep(0.02)
        assert status["succeeded"] == 3, status["results"]
        assert most == 1, f"{most} preparation sandboxes at once under --max-servers 1"
    finally:
        cp.stop()
    cp = _limited(tmp_path / "refused", "--max-servers", "1", "--queue-timeout", "3")
    sandboxes = cp.state_dir / "sandboxes"
    try:
        client = cp.register()
        sid = cp.start_server(client)["server_id"]
        one = [{"client_id": client, "image_tag": "idegym/builtin:latest", "server_name": "p"}]
        request_id = cp.http.post("/api/snapshots/prepare", json={"requests": one}).json()["request_id"]
        assert wait_until(lambda: cp.http.get(f"/api/snapshots/prepare/{request_id}").json()["status"] == "READY",
                          30)
        (failed,) = cp.http.get(f"/api/snapshots/prepare/{request_id}").json()["results"]
        assert failed["status"] == "failure" and "--max-servers" in failed["details"], failed
        refused = cp.http.post("/execute", json={"language": "bash", "code": "echo hi"})
        assert refused.status_code == 429 and "--max-servers" in refused.json()["message"], refused.text
        assert len(list(sandboxes.iterdir())) == 1
        stopped = cp.http.request("DELETE", "/api/idegym-servers", json={"client_id": client, "server_id": sid})
        assert cp.wait_op(stopped.json()["operation_id"])["status"] == "SUCCEEDED"
        # the code runner's sandbox holds the one place while it lives
        assert cp.http.post("/execute", json={"language": "bash", "code": "echo hi"}).json()["stdout"] == "hi\n"
        start = {"client_id": client, "image_tag": "idegym/builtin:latest"}
        op = cp.wait_op(cp.http.post("/api/idegym-servers", json=start).json()["operation_id"])
        assert op["status"] == "FAILED" and json.loads(op["result"])["status_code"] == 429, op
        assert "--max-servers" in json.loads(op["result"])["body"], op
    finally:
        cp.stop()


def test_snapshots_have_caps_of_their_own(tmp_path: Path) -> None:
    """``--max-snapshots`` bounds how many snapshots there are, ``--max-snapshot-bytes`` what they
    take on disk: a snapshot past either is a 429 that names the flag, and one whose own size
    passes the byte cap is deleted at once.

    Can fail: it did on main, which had no cap: every snapshot and preparation was kept.
    """
    cp = _limited(tmp_path / "count", "--max-snapshots", "1")
    try:
        client = cp.register()
        sid = cp.start_server(client)["server_id"]
        snap = {"client_id": client, "server_id": sid}
        assert cp.wait_op(cp.http.post("/api/idegym-servers/snapshot", json=snap).json()["operation_id"])[
            "status"] == "SUCCEEDED"
        op = cp.wait_op(cp.http.post("/api/idegym-servers/snapshot", json=snap).json()["operation_id"])
        assert op["status"] == "FAILED" and json.loads(op["result"])["status_code"] == 429, op
        assert "--max-snapshots" in json.loads(op["result"])["body"], op
        one = [{"client_id": client, "image_tag": "idegym/builtin:latest", "server_name": "p"}]
        _refused(cp.http.post("/api/snapshots/prepare", json={"requests": one}), "--max-snapshots")
        assert len(list((cp.state_dir / "snapshots").iterdir())) == 1
    finally:
        cp.stop()
    cp = _limited(tmp_path / "bytes", "--max-snapshot-bytes", "1Ki")
    try:
        client = cp.register()
        sid = cp.start_server(client)["server_id"]
        cp.bash(client, sid, "head -c 4096 /dev/urandom > data.bin")
        op = cp.wait_op(cp.http.post("/api/idegym-servers/snapshot", json={"client_id": client, "server_id": sid})
                        .json()["operation_id"])
        assert op["status"] == "FAILED" and json.loads(op["result"])["status_code"] == 429, op
        assert "--max-snapshot-bytes" in json.loads(op["result"])["body"], op
        assert [p for p in (cp.state_dir / "snapshots").iterdir() if not p.name.startswith(".")] == []
    finally:
        cp.stop()
