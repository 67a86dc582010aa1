"""Tenants: two trainers on one control plane (``--tenants FILE``) each see only their own work.

A real control plane on the local backend with two tenants, alice and bob. Alice does a bit of
everything (a client, servers, a call whose result holds a secret, a snapshot, a snapshot
preparation, an image build); bob then tries every route of both OpenAPI documents the control
plane serves (its own, read at run time, and the sandbox API behind the forward) with alice's
ids: each answers 404, exactly as for ids that do not exist, and nothing of alice's is in it.

Can fail: on main there were no tenants, and the red team's story (bob reads alice's operations
by counting, drives her sandbox, finds her snapshot by name and restores it) succeeded with one
shared credential; each step is asserted here.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from control_plane import tenants, tree_pack
from tests.cp_helpers import ControlPlaneProcess
from tests.helpers import REPO
from tests.side_venvs import CLIENT_VENV, side_venv

pytestmark = pytest.mark.security

BUILTIN = "idegym/builtin:latest"
CLIENT_PYTHON = CLIENT_VENV / "bin" / "python"


@dataclass
class Tenant:
    """One tenant's HTTP client and what it made."""

    http: httpx.Client
    made: dict[str, Any] = field(default_factory=dict)

    def register(self, name: str) -> str:
        resp = self.http.post("/api/clients", json={"name": name, "nodes_count": 0, "namespace": "idegym"})
        assert resp.status_code == 200, resp.text
        return resp.json()["id"]

    def wait_op(self, op_id: int, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            body = self.http.get(f"/api/operations/status/{op_id}").json()
            if body["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                return body
            time.sleep(0.05)
        raise AssertionError(f"operation {op_id} did not end in {timeout} s")

    def start(self, client_id: str, **fields: Any) -> dict[str, Any]:
        """The ended start operation (its result parsed)."""
        resp = self.http.post("/api/idegym-servers", json={"client_id": client_id, "image_tag": BUILTIN, **fields})
        assert resp.status_code == 202, resp.text
        op = self.wait_op(resp.json()["operation_id"])
        return {**op, "result": json.loads(op["result"])}

    def bash(self, client_id: str, server_id: int, command: str) -> httpx.Response:
        return self.http.post(f"/api/forward/{client_id}/{server_id}/api/tools/bash", json={"command": command},
                              headers={"Prefer": "wait=60"})

    def build(self, yaml_text: str) -> dict[str, Any]:
        resp = self.http.post("/api/build-push-images", json={"yaml_content": yaml_text})
        assert resp.status_code == 200, resp.text
        (name,) = resp.json()["job_names"]
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            job = self.http.get(f"/api/jobs/status/{name}").json()
            if job["status"] != "in_progress":
                return job
            time.sleep(0.1)
        raise AssertionError(f"build {name} did not end")


@dataclass
class World:
    cp: ControlPlaneProcess
    file: Path
    tokens: dict[str, str]
    alice: Tenant
    bob: Tenant


def _project(root: Path, content: str) -> Path:
    root.mkdir(parents=True)
    (root / "owner.txt").write_text(content)
    return root


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("tenants")
    file = tmp / "tenants"
    tokens = {}
    for name in ("alice", "bob"):  # through the command the operator uses
        made = subprocess.run([str(REPO / ".venv" / "bin" / "idegym"), "control-plane", "tenants", "add", name,
                               "--file", str(file)], capture_output=True, text=True)
        assert made.returncode == 0, made.stderr
        tokens[name] = made.stdout.strip()
    assert file.stat().st_mode & 0o777 == 0o600
    assert tokens["alice"] not in file.read_text()  # only its hash is kept
    cp = ControlPlaneProcess(tmp / "state", ["--warm-pool", "0", "--ephemeral", "--tenants", str(file)])
    assert not (tmp / "state" / "token").exists()  # no single-tenant token beside the tenants
    clients = {n: httpx.Client(base_url=cp.address, timeout=120, auth=(n, tokens[n])) for n in tokens}
    alice, bob = Tenant(clients["alice"]), Tenant(clients["bob"])
    try:
        _alice_does_everything(alice, tmp)
        bob.made["client"] = bob.register("trainer")
        yield World(cp, file, tokens, alice, bob)
    finally:
        for http in clients.values():
            http.close()
        cp.stop()


def _alice_does_everything(alice: Tenant, tmp: Path) -> None:
    made = alice.made
    made["secret"] = f"alice-secret-{uuid.uuid4().hex}"
    made["client"] = client = alice.register("trainer")
    started = alice.start(client, server_name="alice-task")
    assert started["status"] == "SUCCEEDED", started
    made["server"] = server = started["result"]["server_id"]
    made["generated_name"] = started["result"]["generated_name"]
    answer = alice.bash(client, server, f"echo {made['secret']} > secret.txt; cat secret.txt")
    assert answer.status_code == 200 and made["secret"] in answer.text, answer.text
    made["operation"] = int(answer.headers["X-IdeGym-Operation-Id"])
    assert made["secret"] in alice.http.get(f"/api/operations/status/{made['operation']}").text
    snap = alice.http.post("/api/idegym-servers/snapshot", json={"client_id": client, "server_id": server})
    result = json.loads(alice.wait_op(snap.json()["operation_id"])["result"])
    made["snapshot"] = result["snapshot_id"]
    prepared = alice.http.post("/api/snapshots/prepare", json={"requests": [
        {"client_id": client, "image_tag": BUILTIN, "server_name": "alice-prepared"}]})
    assert prepared.status_code == 202, prepared.text
    made["request"] = request_id = prepared.json()["request_id"]
    deadline = time.monotonic() + 120
    while (batch := alice.http.get(f"/api/snapshots/prepare/{request_id}").json())["status"] != "READY":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    made["prepared"] = batch["results"][0]["snapshot_name"]  # prepared-<16 hex>: distinctive
    assert made["prepared"].startswith("prepared-"), batch
    project = _project(tmp / "alice-project", made["secret"])
    job = alice.build(f"images:\n  - tag: alice-calc:1\n    project: {{path: {project}}}\n")
    assert job["status"] == "success", job
    made["job"] = job["job_name"]
    from_image = alice.start(client, image_tag="alice-calc:1", server_name="alice-image")
    assert from_image["status"] == "SUCCEEDED", from_image
    made["image_server"] = from_image["result"]["server_id"]
    made["stored_tag"] = "alice-calc:1--tenant-alice"
    packed = io.BytesIO()
    made["upload"] = digest = tree_pack.pack(project, packed).digest
    put = alice.http.put(f"/api/uploads/{digest}", content=packed.getvalue(), params={"client_id": client})
    assert put.status_code == 201, put.text


# -- the walk over both documents ------------------------------------------------------------------

ID_FIELDS = ("client_id", "server_id")
# Routes that take no id of anyone's: nothing to answer 404 to; bob's answers still hold nothing of
# alice's (and a GET answers the same for alice's names as for names nobody used).
NO_IDS = {"GET /health", "POST /api/clients", "GET /api/snapshots/exists",
          "POST /execute", "GET /execute/languages", "POST /api/uploads/missing"}


def _ids(world: World, whose: str) -> dict[str, Any]:
    """Every identifier a route may take: alice's, or ones nobody has."""
    if whose == "alice":
        a = world.alice.made
        return {"client_id": a["client"], "server_id": a["server"], "operation_id": a["operation"],
                "job_name": a["job"], "request_id": a["request"], "job_id": f"{a['request']}-0",
                "server_name": "alice-task", "image_tag": "alice-calc:1", "digest": a["upload"],
                "digests": [a["upload"]]}
    return {"client_id": str(uuid.uuid4()), "server_id": 987654321, "operation_id": 987654321012,
            "job_name": "build-0badf00d", "request_id": "prep-0badf00d0bad", "job_id": "prep-0badf00d0bad-0",
            "server_name": "nobody-task", "image_tag": "nobody-calc:1", "digest": "sha256:" + "0" * 64,
            "digests": ["sha256:" + "0" * 64]}


def _sample(schema: dict[str, Any], doc: dict[str, Any], ids: dict[str, Any], required: bool = True) -> Any:
    """A valid value of ``schema`` with ``ids`` wherever a field is named like one."""
    if "$ref" in schema:
        return _sample(doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]], doc, ids, required)
    if "anyOf" in schema:
        return _sample(next(s for s in schema["anyOf"] if s.get("type") != "null"), doc, ids, required)
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        out = {}
        for name, sub in schema.get("properties", {}).items():
            if name in ids:
                out[name] = ids[name]
            elif name in schema.get("required", ()):
                out[name] = _sample(sub, doc, ids)
        return out
    if kind == "array":
        return [_sample(schema["items"], doc, ids)] if required else []
    return {"string": "x", "integer": 1, "number": 1, "boolean": False}.get(kind, "x")


def _takes_ids(schema: Any, doc: dict[str, Any], seen: frozenset = frozenset()) -> bool:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if ref is not None:
            return ref not in seen and _takes_ids(doc["components"]["schemas"][ref.rsplit("/", 1)[1]], doc,
                                                  seen | {ref})
        if schema.get("name") in ID_FIELDS or any(name in ID_FIELDS for name in schema.get("properties", {})):
            return True  # a parameter, or a body's field
        return any(_takes_ids(v, doc, seen) for v in schema.values())
    if isinstance(schema, list):
        return any(_takes_ids(v, doc, seen) for v in schema)
    return False


def _request(doc: dict[str, Any], path: str, op: dict[str, Any], ids: dict[str, Any]) -> dict[str, Any]:
    """``path`` and keyword arguments of httpx for one operation of ``doc``, with ``ids``."""
    params = {}
    for p in op.get("parameters", []):
        if p["in"] == "path":
            path = path.replace("{" + p["name"] + "}", str(ids.get(p["name"], "x")))
        elif p["name"] in ids or p.get("required"):
            params[p["name"]] = ids.get(p["name"], _sample(p["schema"], doc, ids))
    kwargs: dict[str, Any] = {"params": params}
    body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if body is not None:
        kwargs["json"] = _sample(body, doc, ids)
    return {"url": path, **kwargs}


def _normal(response: httpx.Response, *variants: dict[str, Any]) -> tuple[int, str]:
    """The answer with every identifier of ``variants`` replaced by its name, and no timestamp."""
    try:
        data = response.json()
        if isinstance(data, dict):
            data.pop("timestamp", None)
        text = json.dumps(data, sort_keys=True)
    except ValueError:
        text = response.text
    for ids in variants:
        for name, value in sorted(ids.items(), key=lambda kv: -len(str(kv[1]))):
            text = re.sub(rf"(?<![\w.-]){re.escape(str(value))}(?![\w.-])", f"<{name}>", text)
    return response.status_code, text


def _leaks(world: World, text: str) -> list[str]:
    """What of alice's, which bob never sent, is in ``text``."""
    a = world.alice.made
    return [v for v in (a["secret"], a["generated_name"], a["stored_tag"], a["prepared"], world.tokens["alice"])
            if v in text]


def test_every_route_of_both_documents_answers_404_to_another_tenant(world: World) -> None:
    """Bob with alice's ids on every route of the control plane's document and, through the
    forward, of the sandbox's: 404, the same answer as for ids nobody has, nothing of hers."""
    bob, alice = world.bob.http, world.alice.http
    mine, nobody = _ids(world, "alice"), _ids(world, "nobody")
    doc = bob.get("/openapi.json").json()
    walked, without_ids = 0, set()
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            label = f"{method.upper()} {path}"
            takes_ids = "{" in path or _takes_ids(op.get("parameters", []), doc) or \
                _takes_ids(op.get("requestBody", {}), doc)
            hers = bob.request(method.upper(), **_request(doc, path, op, mine))
            theirs = bob.request(method.upper(), **_request(doc, path, op, nobody))
            assert not _leaks(world, hers.text), (label, hers.text[:300])
            if path != "/health":  # and nobody gets anywhere without a tenant's credentials
                anonymous = httpx.request(method.upper(), world.cp.address + path.replace("{", "").replace("}", ""))
                assert anonymous.status_code == 401, (label, anonymous.text[:200])
            if takes_ids:
                assert hers.status_code == 404, (label, hers.status_code, hers.text[:300])
                assert _normal(hers, mine, nobody) == _normal(theirs, mine, nobody), label
            else:
                without_ids.add(label)
                if method == "get":
                    assert _normal(hers, mine, nobody) == _normal(theirs, mine, nobody), label
            walked += 1
    assert without_ids == NO_IDS, without_ids ^ NO_IDS
    assert walked == sum(len(m) for m in doc["paths"].values()) >= 24
    # Alice's upload is missing for bob like one nobody sent: asking confirms nothing of hers.
    for ids in (mine, nobody):
        asked = bob.post("/api/uploads/missing", json={"digests": ids["digests"]})
        assert asked.status_code == 200 and asked.json()["missing"] == ids["digests"]

    # The sandbox's own document, read through alice's forward, walked through bob's.
    a = world.alice.made
    sandbox_doc = alice.get(f"/api/forward/{a['client']}/{a['server']}/openapi.json",
                            headers={"Prefer": "wait=30"}).json()
    b = world.bob.made["client"]
    pairs = [((a["client"], a["server"]), (nobody["client_id"], nobody["server_id"])),  # her client and server
             ((b, a["server"]), (b, nobody["server_id"]))]  # his client, her server
    forwarded = 0
    for path, methods in sandbox_doc["paths"].items():
        relative = re.sub(r"\{[^}]+\}", "x", path).lstrip("/")
        for method in methods:
            for prefer in ({}, {"Prefer": "wait=10"}):
                for (cid, sid), (other_cid, other_sid) in pairs:
                    hers = bob.request(method.upper(), f"/api/forward/{cid}/{sid}/{relative}", json={},
                                       headers=prefer)
                    theirs = bob.request(method.upper(), f"/api/forward/{other_cid}/{other_sid}/{relative}",
                                         json={}, headers=prefer)
                    assert hers.status_code == 404, (method, path, hers.status_code, hers.text[:300])
                    assert _normal(hers, mine, nobody) == _normal(theirs, mine, nobody), (method, path)
                    assert not _leaks(world, hers.text)
            forwarded += 1
    from sandbox_server.app import ROUTES as SANDBOX_ROUTES

    assert forwarded == sum(len(m) for m in sandbox_doc["paths"].values()) == len(SANDBOX_ROUTES)

    # Beside the documents: the WebSocket relay, and what /metrics names.
    for cid, sid in ((a["client"], a["server"]), (b, a["server"])):
        relay = bob.get(f"/api/ws-forward/{cid}/{sid}/ws")
        assert relay.status_code == 404, relay.text
    theirs_metrics, hers_metrics = bob.get("/metrics").text, alice.get("/metrics").text
    assert "idegym_servers{" in hers_metrics and "idegym_servers{" not in theirs_metrics
    assert not _leaks(world, theirs_metrics) and a["client"] not in theirs_metrics
    # alice still sees all of hers
    assert alice.get(f"/api/idegym-servers/{a['server']}/status", params={"client_id": a["client"]}).status_code == 200


def test_the_red_team_story_fails_at_every_step(world: World) -> None:
    """Bob counts operation ids, drives alice's sandbox, looks her snapshot up by name and
    restores it, starts her image: nothing of hers, and her sandbox never ran his command."""
    alice, bob = world.alice, world.bob
    a, b = alice.made, bob.made["client"]
    nobody = _ids(world, "nobody")

    # 1. sequential operation ids: every one of alice's is 404, as is one nobody has
    unknown = _normal(bob.http.get(f"/api/operations/status/{nobody['operation_id']}"), nobody)
    counted = 0
    last = max(a["operation"], alice.start(a["client"], server_name="alice-last")["id"])
    for op_id in range(1, last + 20):
        if alice.http.get(f"/api/operations/status/{op_id}").status_code != 200:
            continue  # not hers (nobody's, or bob's own)
        answer = bob.http.get(f"/api/operations/status/{op_id}")
        assert _normal(answer, {"operation_id": op_id}) == unknown, (op_id, answer.text[:300])
        counted += 1
    assert counted >= 5  # her starts, call and snapshot at least
    # 2. her sandbox through the forward, with her client id or his own
    for cid in (a["client"], b):
        for prefer in ({}, {"Prefer": "wait=10"}):
            driven = bob.http.post(f"/api/forward/{cid}/{a['server']}/api/tools/bash",
                                   json={"command": "cat secret.txt; touch /tmp/bob-was-here"}, headers=prefer)
            assert driven.status_code == 404 and not _leaks(world, driven.text), driven.text
    seen = alice.bash(a["client"], a["server"], "cat secret.txt; ls /tmp/bob-was-here 2>&1")
    assert a["secret"] in seen.text and "No such file" in seen.text, seen.text
    # 3. her snapshot, found by name and restored into his own server
    exists = bob.http.get("/api/snapshots/exists", params={"image_tag": BUILTIN, "server_name": "alice-task"})
    assert exists.json() == {"exists": False, "snapshot_name": None, "snapshot_tag": None}
    assert alice.http.get("/api/snapshots/exists", params={"image_tag": BUILTIN,
                                                           "server_name": "alice-task"}).json()["exists"]
    never = bob.start(b, snapshot={"id": "no-such-group"})
    for group in (a["snapshot"], a["prepared"]):  # hers, and the one she prepared
        restored = bob.start(b, snapshot={"id": group})
        assert restored["status"] == "FAILED" and restored["result"]["status_code"] == 404, restored
        assert restored["result"]["body"].replace(group, "<id>") == \
            never["result"]["body"].replace("no-such-group", "<id>")
    # 4. her image, by her tag and by where it is stored
    for tag in ("alice-calc:1", a["stored_tag"]):
        hers = bob.start(b, image_tag=tag)
        none = bob.start(b, image_tag="nobody-calc:1")
        assert hers["status"] == "FAILED" and hers["result"]["status_code"] == 404, hers
        assert hers["result"]["body"].replace(tag, "<tag>") == none["result"]["body"].replace("nobody-calc:1", "<tag>")
    # 5. his operations are his: alice gets the same 404 for them
    his = bob.start(b)
    assert his["status"] == "SUCCEEDED"
    assert alice.http.get(f"/api/operations/status/{his['id']}").status_code == 404
    assert bob.http.get(f"/api/operations/status/{his['id']}").status_code == 200


def test_two_tenants_building_one_tag_get_an_image_each(world: World, tmp_path: Path) -> None:
    """Bob builds the tag alice built, from his own files: his servers get his image, hers keep
    hers, and his build neither replaced nor took hers. A Dockerfile build (its steps run as the
    host's root) is refused to a tenant."""
    alice, bob = world.alice, world.bob
    a, b = alice.made, bob.made["client"]
    project = _project(tmp_path / "bob-project", "bob's own")
    job = bob.build(f"images:\n  - tag: alice-calc:1\n    project: {{path: {project}}}\n")
    assert job["status"] == "success" and job["tag"] == "alice-calc:1", job
    again = bob.build(f"images:\n  - tag: alice-calc:1\n    project: {{path: {project}}}\n")
    assert "already built" in again["details"]  # his own, found again
    his = bob.start(b, image_tag="alice-calc:1", server_name="bob-image")
    assert his["status"] == "SUCCEEDED", his
    assert bob.bash(b, his["result"]["server_id"], "cat owner.txt").json()["stdout"] == "bob's own"
    hers = alice.start(a["client"], image_tag="alice-calc:1", server_name="alice-image-2")
    assert alice.bash(a["client"], hers["result"]["server_id"], "cat owner.txt").json()["stdout"] == a["secret"]
    refused = bob.http.post("/api/build-push-images", json={"yaml_content": (
        "images:\n  - tag: bob-docker:1\n    dockerfile: |\n      FROM debian:bookworm-slim\n      RUN true\n")})
    assert refused.status_code == 403 and "host's root" in refused.json()["message"], refused.text


def test_the_tenants_file_is_read_again_when_it_changes_and_on_sighup(world: World) -> None:
    """A tenant added to the file works at its next request, one removed is refused at its next,
    a file others could change is not taken (the tenants before stay), and SIGHUP re-reads a file
    whose change the stat check cannot see."""
    cp, file = world.cp, world.file

    def status(user: str, token: str) -> int:
        return httpx.get(f"{cp.address}/api/snapshots/exists", params={"image_tag": BUILTIN},
                         auth=(user, token), timeout=30).status_code

    carol = tenants.add(file, "carol")
    assert status("carol", carol) == 200
    assert status("carol", world.tokens["alice"]) == 401  # one tenant's token is not another's
    assert tenants.remove(file, "carol") == 1
    assert status("carol", carol) == 401
    # others may write it: refused, the tenants read before stay in force
    before = file.read_text()
    dave = tenants.hash_token("dave-token")
    file.write_text(before + f"dave {dave}\n")
    os.chmod(file, 0o662)
    assert status("dave", "dave-token") == 401 and status("alice", world.tokens["alice"]) == 200
    os.chmod(file, 0o600)
    assert status("dave", "dave-token") == 200
    # SIGHUP: a change that leaves size, mtime and inode as they were
    st = file.stat()
    erin = "erin-token"
    replaced = file.read_text().replace(f"dave {dave}", f"erin {tenants.hash_token(erin)}")
    assert len(replaced) == len(file.read_text())
    with open(file, "r+") as fh:
        fh.write(replaced)
    os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert status("erin", erin) == 401  # not seen yet
    os.kill(cp.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while status("erin", erin) != 200:  # the signal is handled by the control plane's loop
        assert time.monotonic() < deadline, "SIGHUP did not re-read the tenants file"
        time.sleep(0.05)
    assert status("dave", "dave-token") == 401
    file.write_text(before)


def test_a_bad_tenants_file_refuses_to_start(tmp_path: Path) -> None:
    """A tenants file that others may write, that names no tenant, that stores a token in the
    clear, or that comes with --auth USER:PASSWORD: the control plane does not start, and says why."""
    file = tmp_path / "tenants"
    cases = [("alice sha256:" + "0" * 64 + "\n", 0o664, [], "can be changed by others"),
             ("# nobody\n", 0o600, [], "names no tenant"),
             ("alice hunter2\n", 0o600, [], "must be stored as 'sha256:'"),
             ("Alice sha256:" + "0" * 64 + "\n", 0o600, [], "is not a tenant name"),
             ("alice sha256:" + "0" * 64 + "\n", 0o600, ["--auth", "u:p"], "choose one")]
    for text, mode, extra, expected in cases:
        file.write_text(text)
        os.chmod(file, mode)
        proc = subprocess.run([sys.executable, "-m", "control_plane", "--state-dir", str(tmp_path / "state"),
                               "--port", "0", "--tenants", str(file), *extra], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode != 0 and expected in proc.stderr, (text, proc.stderr[-500:])


def test_the_published_client_works_as_a_tenant(world: World) -> None:
    """idegym-client 0.13.1, unchanged, with a tenant's name and token as its credentials."""
    side_venv(CLIENT_VENV)
    credentials = {"IDEGYM_AUTH_USERNAME": "bob", "IDEGYM_AUTH_PASSWORD": world.tokens["bob"]}
    proc = subprocess.run([str(CLIENT_PYTHON), str(Path(__file__).with_name("published_client_lifecycle.py")),
                           world.cp.address], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **credentials})
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    steps = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert steps[-1] == {"done": True, "b64": "b2s="}
    client_id = next(s["client_id"] for s in steps if s.get("step") == "register")
    assert world.alice.http.get("/api/idegym-servers", params={"client_id": client_id}).status_code == 404
