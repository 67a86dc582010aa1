"""The control plane over time: crashes, the watcher, restarts of the control plane itself."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from tests.cp_helpers import ControlPlaneProcess
from tests.helpers import process_alive, wait_until


def _handle(cp: ControlPlaneProcess, server_id: int) -> dict:
    db = sqlite3.connect(cp.state_dir / "control-plane.db")
    try:
        (raw,) = db.execute("SELECT handle FROM servers WHERE id=?", (server_id,)).fetchone()
    finally:
        db.close()
    return json.loads(raw)


def _kill_sandbox(cp: ControlPlaneProcess, server_id: int, request: pytest.FixtureRequest) -> None:
    """SIGKILL the sandbox's server process from outside, as the OOM killer or an operator would."""
    handle = _handle(cp, server_id)
    if cp.backend == "local":
        os.kill(handle["data"]["server"][0], signal.SIGKILL)
        return
    sim = request.getfixturevalue("k8s_sim")
    pods = [p for name, p in sim.state()["pods"].items() if handle["name"] in name and p["pid"]]
    assert pods, sim.state()
    os.kill(pods[0]["pid"], signal.SIGKILL)


def test_sandbox_killed_from_outside_is_crashed_and_answers_410(cp: ControlPlaneProcess,
                                                                request: pytest.FixtureRequest) -> None:
    client = cp.register()
    sid = cp.start_server(client)["server_id"]
    assert cp.bash(client, sid, "echo alive")["stdout"] == "alive\n"
    _kill_sandbox(cp, sid, request)
    assert wait_until(lambda: cp.status(client, sid)["availability"] == "CRASHED", 30)
    status = cp.status(client, sid)
    assert "crashed" in status["details"] and "max_restarts 0" in status["details"]
    resp = cp.forward(client, sid, "api/tools/bash", {"command": "true"})
    assert resp.status_code == 410


def test_max_restarts_lets_a_sandbox_crash_and_come_back(cp: ControlPlaneProcess,
                                                         request: pytest.FixtureRequest) -> None:
    client = cp.register()
    sid = cp.start_server(client, max_restarts=1)["server_id"]
    _kill_sandbox(cp, sid, request)
    assert wait_until(lambda: cp.status(client, sid)["restarts"] == 1, 30)
    assert wait_until(lambda: cp.forward(client, sid, "api/tools/bash", {"command": "echo back"}).status_code == 200,
                      30)
    assert cp.status(client, sid)["availability"] == "ALIVE"
    _kill_sandbox(cp, sid, request)
    assert wait_until(lambda: cp.status(client, sid)["availability"] == "CRASHED", 30)
    assert "max_restarts 1" in cp.status(client, sid)["details"]


def test_forward_to_a_dead_sandbox_is_410_at_once(cp_local: ControlPlaneProcess) -> None:
    cp = cp_local
    client = cp.register()
    sid = cp.start_server(client)["server_id"]
    os.kill(_handle(cp, sid)["data"]["server"][0], signal.SIGKILL)
    resp = cp.forward(client, sid, "api/tools/bash", {"command": "true"}, wait=None)
    op = cp.wait_op(resp.json()["async_operation_id"]) if resp.status_code == 202 else None
    if op is not None:  # the call raced the crash check: the operation carries the marker
        assert op["status"] == "FAILED" and json.loads(op["result"])["status_code"] == 410
    else:
        assert resp.status_code == 410


def test_reaper_kills_idle_servers_unless_kept_alive(tmp_path: Path) -> None:
    cp = ControlPlaneProcess(tmp_path / "state", ["--warm-pool", "0", "--inactive-timeout", "1.5",
                                                  "--finished-timeout", "1.5", "--ephemeral"])
    try:
        client = cp.register()
        idle = cp.start_server(client, reuse_strategy="NONE")["server_id"]
        kept = cp.start_server(client, reuse_strategy="NONE")["server_id"]
        finished = cp.start_server(client, reuse_strategy="NONE")["server_id"]
        keep = cp.http.post("/api/idegym-servers/keepalive", json={"client_id": client, "server_id": kept,
                                                                   "minutes": 1})
        assert keep.status_code == 200
        cp.http.post("/api/idegym-servers/finish", json={"client_id": client, "server_id": finished})
        assert wait_until(lambda: cp.status(client, idle)["availability"] == "KILLED", 15)
        assert "idle" in cp.status(client, idle)["details"]
        assert wait_until(lambda: cp.status(client, finished)["availability"] == "KILLED", 15)
        time.sleep(2.0)  # well past the inactivity timeout: the keepalive window must hold
        assert cp.status(client, kept)["availability"] == "ALIVE"
        assert cp.bash(client, kept, "echo kept")["stdout"] == "kept\n"
    finally:
        cp.stop()


def test_silent_clients_are_reaped_with_their_servers(tmp_path: Path) -> None:
    """A client that beats every 0.25 s is never taken for silent. With a timeout of 1.5 s and a
    beat every 0.3 s it once was, at load 24: a stall of ~1.2 s of the test or the control plane
    on a loaded host is enough."""
    cp = ControlPlaneProcess(tmp_path / "state", ["--warm-pool", "0", "--heartbeat-timeout", "3", "--ephemeral"])
    try:
        silent, talking = cp.register("silent"), cp.register("talking")
        sid = cp.start_server(silent)["server_id"]
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(0.25):
                cp.http.post("/api/clients/heartbeat", json={"client_id": talking})

        thread = threading.Thread(target=beat)
        thread.start()
        try:
            assert wait_until(lambda: cp.status(silent, sid)["availability"] == "KILLED", 15)
            beat_answer = cp.http.post("/api/clients/heartbeat", json={"client_id": silent}).json()
            assert beat_answer["availability"] == "KILLED"  # terminal stays terminal
        finally:
            stop.set()
            thread.join()
        assert cp.http.post("/api/clients/heartbeat", json={"client_id": talking}).json()["availability"] == "ALIVE"
    finally:
        cp.stop()


def test_a_client_waiting_for_its_own_start_is_not_silent(tmp_path: Path) -> None:
    """A start that waits longer than the heartbeat timeout (its turn under ``--start-rate``, a
    long build, a loaded host) does not get its client reaped meanwhile: the start succeeds, and
    the client is reaped once it stays silent after it.

    Can fail: the watcher reaped a client by its heartbeats alone, and its start failed with
    'server ... was stopped while it was starting' (a CI run on a loaded host)."""
    cp = ControlPlaneProcess(tmp_path / "state", ["--warm-pool", "0", "--heartbeat-timeout", "1.5",
                                                  "--start-rate", "0.25", "--start-burst", "1", "--ephemeral"])
    try:
        client = cp.register("waiting")
        # Both asked at once: one takes the one token, the other waits 4 s for the next, however
        # long the first start takes (measured from after it, a slow first start left too little).
        asked = time.monotonic()
        operations = []
        for name in ("first", "second"):
            resp = cp.http.post("/api/idegym-servers", json={"client_id": client, "image_tag": "idegym/builtin:latest",
                                                             "server_name": name})
            assert resp.status_code == 202, resp.text
            operations.append(resp.json()["operation_id"])
        ops = [cp.wait_op(operation) for operation in operations]
        assert time.monotonic() - asked > 1.5 * 2  # one did wait past the heartbeat timeout
        assert all(op["status"] == "SUCCEEDED" for op in ops), ops
        servers = [json.loads(op["result"])["server_id"] for op in ops]
        assert wait_until(lambda: all(cp.status(client, s)["availability"] == "KILLED" for s in servers), 15)
    finally:
        cp.stop()


def _sandbox_processes(state_dir: Path) -> set[int]:
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes()
            env = Path(f"/proc/{entry.name}/environ").read_bytes()
        except OSError:
            continue
        if str(state_dir).encode() in cmd or str(state_dir).encode() in env or b"sandbox_server" in cmd:
            found.add(int(entry.name))
    return found


def _mounts_under(path: Path) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(path) in line]


def test_stop_client_leaves_no_process_or_mount(cp_local: ControlPlaneProcess) -> None:
    cp = cp_local
    before = _sandbox_processes(cp.state_dir)
    client = cp.register()
    ids = [cp.start_server(client, reuse_strategy="NONE")["server_id"] for _ in range(3)]
    pids = [_handle(cp, sid)["data"]["server"][0] for sid in ids]
    for sid in ids:
        cp.bash(client, sid, "nohup sleep 600 >/dev/null 2>&1 & setsid sleep 600 >/dev/null 2>&1 &")
    resp = cp.http.request("DELETE", "/api/clients", json={"client_id": client})
    assert cp.wait_op(resp.json()["operation_id"])["status"] == "SUCCEEDED"
    assert all(not process_alive(pid) for pid in pids)
    servers = cp.http.get("/api/idegym-servers", params={"client_id": client, "include_terminal": "true"}).json()
    assert {s["availability"] for s in servers["servers"]} == {"STOPPED"}
    sandboxes = cp.state_dir / "sandboxes"
    names = {json.loads(json.dumps(_handle(cp, sid)))["name"] for sid in ids}
    assert wait_until(lambda: not any((sandboxes / n).exists() for n in names), 10)
    assert not [m for m in _mounts_under(cp.state_dir) if any(n in m for n in names)]
    leftover = _sandbox_processes(cp.state_dir) - before
    pool = {p for p in leftover if _is_pool_member(p)}
    assert not leftover - pool, {pid: _cmdline(pid) for pid in leftover - pool}


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()[:300]
    except OSError:
        return b"(gone)"


def _is_pool_member(pid: int) -> bool:
    """Warm-pool sandboxes are expected to stay: they belong to no client."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    # (a pool sandbox's lease monitor names the pool sandbox's directory)
    return b"sandbox_server" in cmd or b"bwrap" in cmd or (b"idegym-lease" in cmd and b"/sandboxes/pool-" in cmd)


def test_orphaned_sandboxes_are_swept(cp_local: ControlPlaneProcess) -> None:
    import asyncio

    from control_plane.backends.base import Limits, SandboxSpec
    from control_plane.backends.local import LocalBackend
    from control_plane.models import ServerKind

    async def leak() -> str:
        backend = LocalBackend(cp_local.state_dir)
        await backend.start()
        spec = SandboxSpec(0, "leaked-sandbox", "idegym", "idegym/builtin:latest", ServerKind.IDEGYM, False, None,
                           8000, 80, Limits())
        handle = await backend.create(spec, 60)
        await backend.close()
        return handle.data["server"][0]

    pid = asyncio.run(leak())
    assert process_alive(pid)
    assert wait_until(lambda: not process_alive(pid), 60), "the orphan sweep did not remove the leaked sandbox"


def test_control_plane_killed_under_load_loses_nothing(tmp_path: Path) -> None:
    # --ephemeral cleans up at the final, graceful stop; a SIGKILL never runs it
    cp = ControlPlaneProcess(tmp_path / "state", ["--warm-pool", "1", "--ephemeral"])
    try:
        client = cp.register("survivor")
        ids = [cp.start_server(client, reuse_strategy="NONE")["server_id"] for _ in range(3)]
        for sid in ids:
            cp.bash(client, sid, f"echo {sid} > marker.txt")
        cut_off: list[int] = []
        errors: list[str] = []

        def load(sid: int) -> None:
            for _ in range(200):
                try:
                    resp = cp.forward(client, sid, "api/tools/bash", {"command": "sleep 30"}, wait=None)
                except Exception as exc:  # noqa: BLE001 - the control plane dies under our feet
                    errors.append(str(exc))
                    return
                if resp.status_code == 202:
                    cut_off.append(resp.json()["async_operation_id"])

        threads = [threading.Thread(target=load, args=(sid,)) for sid in ids]
        for t in threads:
            t.start()
        assert wait_until(lambda: len(cut_off) >= 3, 10)
        cp.kill()  # SIGKILL in the middle of work
        for t in threads:
            t.join()
        cp.start()  # same state directory, same port
        status = cp.http.get(f"/api/operations/status/{cut_off[0]}").json()
        assert status["status"] == "FAILED"
        assert "restarted" in json.loads(status["result"])["body"]
        servers = cp.http.get("/api/idegym-servers", params={"client_id": client}).json()["servers"]
        assert sorted(s["server_id"] for s in servers) == sorted(ids)
        for sid in ids:  # adopted again: the same sandboxes, files and all
            assert cp.bash(client, sid, "cat marker.txt")["stdout"] == f"{sid}\n"
        beat = cp.http.post("/api/clients/heartbeat", json={"client_id": client})
        assert beat.status_code == 200 and beat.json()["name"] == "survivor"
    finally:
        cp.stop()
