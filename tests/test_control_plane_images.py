"""Image builds (build-push-images, job status) and snapshots (snapshot, restore, prepare, exists)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.cp_helpers import ControlPlaneProcess, wait_job


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
