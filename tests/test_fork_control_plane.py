"""``POST /api/idegym-servers/fork`` through a real control plane (local backend), and the client's
``Sandbox.fork`` (sync and async): children are ordinary servers; bad input gets the right 4xx;
a control-plane restart loses nothing and leaks nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_server.polling import wait_until
from tests import mount_leaks
from tests.cp_helpers import ControlPlaneProcess

CAN_ISOLATE = os.geteuid() == 0 and shutil.which("bwrap") is not None
pytestmark = pytest.mark.skipif(not CAN_ISOLATE, reason="needs root and bubblewrap")
FORK = "/api/idegym-servers/fork"
LEFT_WITHIN = 20.0  # seconds for the last lease monitors of a stopped control plane (as conftest allows)


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneProcess]:
    proc = ControlPlaneProcess(tmp_path_factory.mktemp("forkcp") / "state", ["--warm-pool", "2"])
    yield proc
    if proc.proc.poll() is None:
        proc.stop()


def _fork(cp: ControlPlaneProcess, client: str, server: int, count: int, **fields) -> list[dict]:
    resp = cp.http.post(FORK, json={"client_id": client, "server_id": server, "count": count, **fields},
                        headers={"Prefer": "wait=120"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["server_id"] == server and len(body["servers"]) == count, body
    return body["servers"]


def _op(cp: ControlPlaneProcess, path: str, body: dict, method: str = "POST") -> dict:
    resp = cp.http.request(method, path, json=body, headers={"Prefer": "wait=120"})
    assert resp.status_code == 200, resp.text
    return resp.json()


def _out(cp: ControlPlaneProcess, client: str, server: int, command: str) -> str:
    result = cp.bash(client, server, command)
    assert result["exit_code"] == 0, result
    return result["stdout"]


def test_children_are_ordinary_servers(cp: ControlPlaneProcess) -> None:
    client = cp.register("fork-owner")
    parent = cp.start_server(client, server_name="forked-task")["server_id"]
    _out(cp, client, parent, "echo parent > a.txt; echo home > ~/note; echo tmp > /tmp/t")
    children = _fork(cp, client, parent, 3)
    ids = [c["server_id"] for c in children]
    assert len(set(ids)) == 3 and parent not in ids
    assert len({c["generated_name"] for c in children}) == 3
    for child in ids:
        assert _out(cp, client, child, "cat a.txt ~/note /tmp/t") == "parent\nhome\ntmp\n"
        status = cp.status(client, child)
        assert status["availability"] == "ALIVE" and status["pod_ready"] is True
        assert status["server_name"] == "forked-task" and status["image_tag"] == "idegym/builtin:latest"
    listed = cp.http.get("/api/idegym-servers", params={"client_id": client}).json()["servers"]
    assert {s["server_id"] for s in listed} == {parent, *ids}

    first, second, third = ids
    # keepalive, snapshot and a restore from it, a fork of a child
    assert cp.http.post("/api/idegym-servers/keepalive", json={"client_id": client, "server_id": first,
                                                               "minutes": 5}).status_code == 200
    _out(cp, client, first, "echo first > first.txt")
    snap = _op(cp, "/api/idegym-servers/snapshot", {"client_id": client, "server_id": first})
    restored = cp.start_server(client, reuse_strategy="NONE", snapshot={"id": snap["snapshot_id"]})["server_id"]
    assert _out(cp, client, restored, "cat a.txt first.txt ~/note") == "parent\nfirst\nhome\n"
    (grandchild,) = [c["server_id"] for c in _fork(cp, client, first, 1, server_name="grandchild")]
    assert _out(cp, client, grandchild, "cat a.txt first.txt") == "parent\nfirst\n"
    assert cp.status(client, grandchild)["server_name"] == "grandchild"

    # the parent goes; its children stay
    _op(cp, "/api/idegym-servers", {"client_id": client, "server_id": parent}, method="DELETE")
    assert _out(cp, client, second, "cat a.txt; echo second > a.txt; cat a.txt") == "parent\nsecond\n"
    assert _out(cp, client, third, "cat a.txt") == "parent\n"

    # reuse: a FINISHED child is claimed by the next start of its kind; RESET gives the image's project
    assert cp.http.post("/api/idegym-servers/finish", json={"client_id": client,
                                                            "server_id": third}).status_code == 200
    reused = cp.start_server(client, server_name="forked-task")
    assert reused["server_id"] == third and reused["reused"] and reused["need_to_reset"]
    resp = cp.forward(client, third, "api/project/reset", {})
    assert resp.status_code == 200 and resp.json()["status"] == "success", resp.text
    assert _out(cp, client, third, "ls; cat ~/note") == "home\n"  # the project is the image's; the rest stays
    resp = cp.forward(client, third, "api/project/reset", {"to_fork_point": True})
    assert resp.status_code == 200 and resp.json()["status"] == "success", resp.text
    assert _out(cp, client, third, "cat a.txt") == "parent\n"  # the documented option: back to the fork

    # RESTART: a fresh sandbox of the image, same server id
    _op(cp, "/api/idegym-servers/restart", {"client_id": client, "server_id": second})
    assert _out(cp, client, second, "ls a.txt ~/note 2>&1 | grep -c 'No such'") == "2\n"

    # without Prefer: wait, an operation to poll
    resp = cp.http.post(FORK, json={"client_id": client, "server_id": grandchild, "count": 2})
    assert resp.status_code == 202, resp.text
    op = cp.wait_op(resp.json()["operation_id"])
    assert op["status"] == "SUCCEEDED" and op["request_type"] == "FORK_SERVER", op
    assert len(json.loads(op["result"])["servers"]) == 2
    _op(cp, "/api/clients", {"client_id": client}, method="DELETE")


def test_bad_fork_requests_get_the_right_error(cp: ControlPlaneProcess) -> None:
    owner, other = cp.register("fork-errors"), cp.register("someone-else")
    server = cp.start_server(owner)["server_id"]

    def refused(body: dict, status: int, *words: str) -> None:
        resp = cp.http.post(FORK, json=body, headers={"Prefer": "wait=60"})
        assert resp.status_code == status, resp.text
        message = resp.json()["message"]
        assert all(w in message for w in words), message

    base = {"client_id": owner, "server_id": server}
    refused({**base, "count": 0}, 422, "count")
    refused({**base, "count": 65}, 422, "count")
    refused(base, 422, "count")
    refused({**base, "count": 1, "server_name": "Not A Name"}, 422, "server_name")
    refused({**base, "server_id": 10 ** 6, "count": 1}, 404, "not found")
    refused({"client_id": other, "server_id": server, "count": 1}, 404, "not found")
    refused({**base, "count": 1, "namespace": "elsewhere"}, 404, "namespace")
    assert cp.http.post("/api/idegym-servers/finish", json=base).status_code == 200
    refused({**base, "count": 1}, 409, "FINISHED")
    _op(cp, "/api/idegym-servers", base, method="DELETE")
    refused({**base, "count": 1}, 410, "STOPPED")
    for client in (owner, other):
        _op(cp, "/api/clients", {"client_id": client}, method="DELETE")


def test_the_clients_fork_sync_and_async(cp: ControlPlaneProcess) -> None:
    from idegym_env.client import AsyncIdeGymClient, IdeGymClient

    with IdeGymClient(cp.url, name="fork-sync") as client:
        parent = client.start(server_name="sync-parent")
        parent.write_file("note.txt", "from the parent\n")
        children = parent.fork(2)
        assert [c.server_id for c in children] != [parent.server_id] * 2 and len(children) == 2
        for child in children:
            assert child.read_file("note.txt") == "from the parent\n"
            assert child.info.server_name == "sync-parent" and child.info.generated_name
        children[0].write_file("note.txt", "changed\n")
        assert children[1].read_file("note.txt") == parent.read_file("note.txt") == "from the parent\n"
        children[0].reset()
        assert children[0].bash("ls note.txt 2>&1").stdout.count("No such") == 1
        children[0].reset(to_fork_point=True)
        assert children[0].read_file("note.txt") == "from the parent\n"
        (grandchild,) = children[1].fork()
        assert grandchild.read_file("note.txt") == "from the parent\n"

    async def run() -> None:
        async with AsyncIdeGymClient(cp.url, name="fork-async") as client:
            parent = await client.start(server_name="async-parent")
            await parent.write_file("note.txt", "async\n")
            children = await parent.fork(3)
            assert len(children) == 3
            texts = await asyncio.gather(*(c.read_file("note.txt") for c in children))
            assert texts == ["async\n"] * 3

    asyncio.run(run())


def test_a_control_plane_restart_keeps_the_children_and_leaks_nothing(cp: ControlPlaneProcess) -> None:
    client = cp.register("fork-restart")
    parent = cp.start_server(client)["server_id"]
    _out(cp, client, parent, "echo kept > kept.txt")
    layers = cp.state_dir / "forks"
    before = set(_layers(layers))
    children = [c["server_id"] for c in _fork(cp, client, parent, 2)]
    ours = set(_layers(layers)) - before
    assert len(ours) == 1
    cp.kill()  # a crash: the sandboxes outlive it
    cp.start()
    for child in children:
        assert _out(cp, client, child, "cat kept.txt") == "kept\n"
    assert ours <= set(_layers(layers))
    _op(cp, "/api/clients", {"client_id": client}, method="DELETE")
    deadline = time.monotonic() + 30
    while ours & set(_layers(layers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not ours & set(_layers(layers))


def test_the_pool_refills_after_a_fork_only_once_its_children_had_their_moment(cp: ControlPlaneProcess) -> None:
    """The fork takes the warm pool's members; new ones start only after ``HOLD_OFF_AFTER_FORK``
    (the children's first calls come first), then the pool is full again. Can fail: a refill
    started with the fork's answer (as it did) makes new members at once."""
    from control_plane.pool import HOLD_OFF_AFTER_FORK

    client = cp.register("fork-refill")
    parent = cp.start_server(client, reuse_strategy="NONE")["server_id"]
    sandboxes = cp.state_dir / "sandboxes"

    def members() -> set[str]:
        return {p.name for p in sandboxes.glob("pool-*")}

    def ready() -> int:
        """Members the pool holds ready (a member's socket is there before: it answers a warm-up
        call first, readiness.warm_up)."""
        return int(sum(float(line.rsplit(" ", 1)[1]) for line in cp.http.get("/metrics").text.splitlines()
                       if line.startswith("idegym_warm_pool_ready{")))

    assert wait_until(lambda: ready() >= 2, 60), members()
    before = members()
    asked = time.time()  # the fork ends after this, and the hold-off starts where it ends
    children = _fork(cp, client, parent, 2)
    taken = {c.get("service_name") for c in children}
    assert len(taken) == 2 and taken <= before, (children, before)  # the children were the pool's members
    assert wait_until(lambda: len(members() - before) >= 2, 60), members()
    # When each new member was made (its directory's last change comes no earlier), against when
    # the fork was asked for: judged from the control plane's side, however late this test hears.
    made = {name: (sandboxes / name).stat().st_ctime - asked for name in members() - before}
    assert min(made.values()) >= HOLD_OFF_AFTER_FORK * 0.9, made
    assert len(children) == 2
    _op(cp, "/api/clients", {"client_id": client}, method="DELETE")  # its servers with it


def test_nothing_is_left_when_everything_stops(cp: ControlPlaneProcess) -> None:
    """Last: every client of this module is stopped; with the control plane gone (its warm pool
    too), no sandbox, fork layer, cgroup or mount of it is left. A delete that found a killed
    task still in its groups leaves the rest to the sandbox's lease monitor, which removes them and
    the space's bind a moment later (``lease.py``): looked at within the session check's 20 s.
    (A CI run on four workers found the bind of ``sandboxes/`` still there at once.)"""
    state = cp.state_dir
    cp.stop()
    assert wait_until(lambda: not any((state / "sandboxes").iterdir()), LEFT_WITHIN), \
        list((state / "sandboxes").iterdir())
    for layer in _layers(state / "forks"):  # only snapshots of forked servers hold layers now (they stay)
        holders = os.listdir(state / "forks" / layer / "holders")
        assert holders and all(h.startswith("p-") and (state / "snapshots" / h[2:]).is_dir() for h in holders), \
            (layer, holders)
    assert mount_leaks.left_after(state, [], LEFT_WITHIN) == []
    from control_plane.backends.local.layout import state_key

    key = state_key(state)

    def groups() -> list[Path]:
        return [p for p in Path("/sys/fs/cgroup").glob(f"*/idegym/{key}/*") if p.is_dir()]

    assert wait_until(lambda: not groups(), LEFT_WITHIN), groups()


def _layers(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("f-*")) if root.is_dir() else []
