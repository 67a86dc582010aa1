"""API abuse: both OpenAPI documents fuzzed with schemathesis, raw garbage, oversized bodies, auth.

Targets are real: the sandbox server runs in a bubblewrap sandbox (fuzzed commands run there,
never on the host) and the control plane is a real process on the local backend, with HTTP
basic auth configured. The claim: no input makes either answer 5xx or hit its "unexpected
error" handler; bodies over the limit get 413; every control-plane route but /health needs the
credentials.

The examples are derandomized (the same in every run) so that ``make test`` is repeatable; set
``IDEGYM_FUZZ_RANDOM=1`` (and ``IDEGYM_FUZZ_EXAMPLES=200``) for an exploratory run.

Can fail: they did. The sandbox server answered 500 to a bash command holding a NUL byte
("embedded null byte" from exec); the control plane answered 500 to a server id beyond 64 bits
(SQLite's OverflowError) and hung on a body declared larger than the limit instead of saying
413. Each fails again with its fix reverted in a scratch copy.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from control_plane.backends.local import LocalBackend
from control_plane.models import MAX_FORK_COUNT
from tests.cp_helpers import ControlPlaneProcess
from tests.local_helpers import LoopThread, client, spec

pytestmark = pytest.mark.security

CAN_ISOLATE = os.geteuid() == 0 and shutil.which("bwrap") is not None
if not CAN_ISOLATE:  # pragma: no cover - fuzzed commands must run in a real sandbox
    pytest.skip("fuzzing the sandbox server needs bubblewrap isolation (it runs random commands)",
                allow_module_level=True)

RANDOM = bool(os.environ.get("IDEGYM_FUZZ_RANDOM"))
EXAMPLES = int(os.environ.get("IDEGYM_FUZZ_EXAMPLES", "12"))
AUTH = ("fuzz", "not-a-real-secret")
# Random commands must end quickly: time limits in fuzzed bodies are clamped to these.
CLAMP = {"timeout": 3.0, "graceful_termination_timeout": 0.5, "server_start_wait_timeout_in_seconds": 5,
         "minutes": 1}
# Valid fork counts (1 to 64) become 2: at up to 64 children a call, the real-ids pass started
# hundreds of sandboxes on 2 cores, slowed the whole suite for a minute and overran the
# control plane's shutdown. Invalid counts (0, 65, ...) are left for the validation to refuse.
VALID_CLAMP = {"count": (2, MAX_FORK_COUNT)}


def _settings(examples: int = EXAMPLES) -> settings:
    return settings(max_examples=examples, deadline=None, database=None, derandomize=not RANDOM,
                    suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])


def _clamp(case: Any) -> None:
    body = case.body
    if isinstance(body, dict):
        for key, limit in CLAMP.items():
            value = body.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > limit:
                body[key] = limit
        for key, (limit, valid_max) in VALID_CLAMP.items():
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and limit < value <= valid_max:
                body[key] = limit


def fuzz(schema: Any, send, skip: tuple[str, ...] = (), fewer: dict[str, int] | None = None,
         mutate=None, examples: int = EXAMPLES) -> list[str]:
    """Positive and negative examples of every operation; returns the labels covered."""
    covered = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.label in skip:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            count = (fewer or {}).get(operation.label, examples)

            @_settings(count)
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case: Any) -> None:
                _clamp(case)
                if mutate is not None:
                    mutate(case)
                response = send(case)
                case.validate_response(response, checks=[not_a_server_error])
                assert response.headers.get("content-type", "").startswith("application/json") \
                    or response.status_code in (204, 304) or case.method == "HEAD", response.text[:200]

            try:
                run()
            except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
                assert mode is GenerationMode.NEGATIVE, operation.label
        covered.append(operation.label)
    return covered


def _transport(case: Any, base_url: str) -> dict[str, Any]:
    kwargs = case.as_transport_kwargs(base_url=base_url)
    kwargs.pop("cookies", None)
    if "data" in kwargs:  # raw (invalid) bodies
        data = kwargs.pop("data")
        kwargs["content"] = data.encode() if isinstance(data, str) else data
    return kwargs


# -- the sandbox server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    loop = LoopThread()
    backend = LocalBackend(tmp_path_factory.mktemp("fuzz"), isolation="bwrap")
    loop.run(backend.start())
    handle = loop.run(backend.create(spec("fuzz-target"), 60))
    try:
        yield handle
    finally:
        loop.run(backend.delete(handle))
        loop.run(backend.close())
        loop.close()


def test_sandbox_server_openapi_fuzz(sandbox: Any) -> None:
    """Every sandbox-server operation, valid and invalid bodies: never 5xx, always JSON."""
    with client(sandbox, timeout=60) as http:
        doc = http.get("/openapi.json").json()
        schema = schemathesis.openapi.from_dict(doc)

        def send(case: Any) -> httpx.Response:
            return http.request(**_transport(case, "http://sandbox"))

        covered = fuzz(schema, send, fewer={"POST /execute": max(EXAMPLES // 2, 3)})
        assert len(covered) == sum(len(methods) for methods in doc["paths"].values())
        assert http.get("/api/health").status_code == 200


def test_sandbox_server_survives_raw_garbage(sandbox: Any) -> None:
    """Bodies that are not JSON, JSON of the wrong shape, odd methods, odd paths and headers."""
    with client(sandbox, timeout=60) as http:

        @_settings(EXAMPLES * 4)
        @given(path=st.sampled_from(["/api/tools/bash", "/api/tools/file/upload", "/api/rewards/test", "/execute",
                                     "/api/project/reset", "/api/tools/file/download"]),
               method=st.sampled_from(["POST", "PUT", "GET", "DELETE", "PATCH"]),
               body=st.one_of(st.binary(max_size=512), st.text(max_size=200).map(str.encode),
                              st.recursive(st.none() | st.booleans() | st.integers()
                                           | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
                                           lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
                                           max_leaves=10).map(lambda v: httpx.Request("POST", "/", json=v).content)))
        def run(path: str, method: str, body: bytes) -> None:
            response = http.request(method, path, content=body, headers={"content-type": "application/json"})
            assert response.status_code < 500, (method, path, body, response.text)
            assert response.headers["content-type"].startswith("application/json")

        run()
        for path in ("/%00", "/api/tools/bash/../../etc/passwd", "/" + "a" * 10000, "/api//tools//bash"):
            assert http.post(path, json={}).status_code in (404, 405, 400, 414, 422), path
        assert http.get("/api/health").status_code == 200


def test_sandbox_server_refuses_oversized_bodies(sandbox: Any) -> None:
    """Over the body limit (256 MiB): 413 whether the size is declared or only streamed."""
    limit = 256 << 20
    sock_path = sandbox.endpoint.unix_socket
    oversized = (f"POST /api/tools/file/upload HTTP/1.1\r\nHost: x\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {limit + 1}\r\n\r\n")
    assert _raw_status(sock_path, None, oversized.encode()) == 413

    def chunks() -> Iterator[bytes]:
        chunk = b"x" * (1 << 20)
        for _ in range((limit >> 20) + 2):
            yield chunk

    with client(sandbox, timeout=120) as http:
        try:
            status = http.post("/api/tools/file/upload", content=chunks(),
                               headers={"content-type": "application/json"}).status_code
        except httpx.TransportError:  # the server may close once it has answered
            status = 413
        assert status == 413
        assert http.get("/api/health").status_code == 200


def _raw_status(unix_socket: str | None, address: tuple[str, int] | None, request: bytes) -> int:
    sock = socket.socket(socket.AF_UNIX) if unix_socket else socket.socket()
    sock.settimeout(30)
    try:
        sock.connect(unix_socket or address)
        sock.sendall(request)
        head = sock.recv(4096).decode("latin-1")
    finally:
        sock.close()
    return int(head.split()[1])


# -- the control plane ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneProcess]:
    proc = ControlPlaneProcess(tmp_path_factory.mktemp("fuzzcp") / "state",
                               ["--warm-pool", "0", "--ephemeral", "--auth", ":".join(AUTH)])
    proc.http.auth = AUTH
    yield proc
    proc.stop()


def test_control_plane_openapi_fuzz(cp: ControlPlaneProcess) -> None:
    """Every control-plane operation with random and with real ids: never 5xx, always JSON."""
    doc = cp.http.get("/openapi.json").json()
    schema = schemathesis.openapi.from_dict(doc)
    client_id = cp.register("fuzz")
    server_id = cp.start_server(client_id)["server_id"]

    def send(case: Any) -> httpx.Response:
        return cp.http.request(**_transport(case, cp.url))

    fewer = {"POST /execute": 3, "POST /api/build-push-images": 6, "POST /api/snapshots/prepare": 6,
             "POST /api/idegym-servers": 6}
    covered = fuzz(schema, send, fewer=fewer)
    assert len(covered) == sum(len(methods) for methods in doc["paths"].values())

    def real_ids(case: Any) -> None:  # the same again, owned: deeper into the handlers
        for part in (case.body if isinstance(case.body, dict) else None, case.query):
            if isinstance(part, dict):
                if "client_id" in part:
                    part["client_id"] = client_id
                if "server_id" in part:
                    part["server_id"] = server_id
        if case.path_parameters and "server_id" in case.path_parameters:
            case.path_parameters["server_id"] = server_id

    harmless = ("DELETE /api/clients", "POST /api/clients/finish", "DELETE /api/idegym-servers",
                "POST /api/idegym-servers/finish", "POST /execute")
    fuzz(schema, send, skip=harmless, fewer=fewer, mutate=real_ids, examples=max(EXAMPLES // 2, 4))
    assert cp.http.get("/health").status_code == 200


def test_control_plane_forward_fuzz(cp: ControlPlaneProcess) -> None:
    """The forward route (not in the OpenAPI document): random ids, paths, methods, bodies and
    ``Prefer`` headers, to a live sandbox and to none."""
    client_id = cp.register("fuzz-forward")
    server_id = cp.start_server(client_id)["server_id"]

    @_settings(EXAMPLES * 4)
    @given(cid=st.sampled_from([client_id, str(uuid.uuid4()), "not-a-uuid", "%00"]),
           sid=st.sampled_from([str(server_id), "0", "-1", "99999999999999999999", "x"]),
           path=st.sampled_from(["api/tools/bash", "api/health", "nope", "api/tools/file/download?x=%00",
                                 "../../health", "api/rewards/test", "execute"]),
           method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
           prefer=st.sampled_from([None, "wait=1", "wait=0", "wait=1e400", "wait=-1", "wait=abc", "wait=99999",
                                   "respond-async"]),
           body=st.one_of(st.binary(max_size=256),
                          st.fixed_dictionaries({"command": st.sampled_from(["true", "exit 3", "echo x"])},
                                                optional={"timeout": st.floats(0, 3)}).map(
                              lambda v: httpx.Request("POST", "/", json=v).content)))
    def run(cid: str, sid: str, path: str, method: str, prefer: str | None, body: bytes) -> None:
        headers = {"content-type": "application/json"}
        if prefer is not None:
            headers["Prefer"] = prefer
        response = cp.http.request(method, f"/api/forward/{cid}/{sid}/{path}", content=body, headers=headers)
        assert response.status_code < 500 or response.status_code == 503, (cid, sid, path, method, prefer,
                                                                            response.text[:300])

    run()
    assert cp.bash(client_id, server_id, "echo still")["stdout"] == "still\n"


def test_control_plane_refuses_oversized_bodies(cp: ControlPlaneProcess) -> None:
    """Over the body limit (256 MiB), declared or streamed, on a route and on a forward: 413."""
    limit = 256 << 20
    credentials = "Basic " + base64.b64encode(":".join(AUTH).encode()).decode()
    for path in ("/api/clients", f"/api/forward/{uuid.uuid4()}/1/api/tools/bash"):
        request = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {credentials}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {limit + 1}\r\n\r\n").encode()
        assert _raw_status(None, ("127.0.0.1", cp.port), request) == 413, path

    def chunks() -> Iterator[bytes]:
        chunk = b" " * (1 << 20)
        for _ in range((limit >> 20) + 2):
            yield chunk

    try:
        status = cp.http.post("/api/clients", content=chunks(), headers={"content-type": "application/json"},
                              timeout=120).status_code
    except httpx.TransportError:
        status = 413
    assert status == 413
    assert cp.http.get("/health").status_code == 200


def test_auth_is_required_on_every_route_but_health(cp: ControlPlaneProcess) -> None:
    """With credentials configured, every route answers 401 without them (or with wrong ones),
    including the forward, the WebSocket relay, /metrics and /openapi.json; /health does not.

    Can fail: with the auth middleware letting /api/forward through (a scratch copy), the
    forward answered 404 (its handler ran) instead of 401.
    """
    doc = cp.http.get("/openapi.json").json()
    anonymous = httpx.Client(base_url=cp.url, timeout=30)
    wrong = httpx.Client(base_url=cp.url, timeout=30, auth=(AUTH[0], "wrong"))
    sid, cid = "1", str(uuid.uuid4())
    routes = [(method.upper(), path.replace("{server_id}", sid).replace("{operation_id}", "1")
               .replace("{job_name}", "j").replace("{request_id}", "r").replace("{job_id}", "j"))
              for path, methods in doc["paths"].items() for method in methods]
    routes += [("GET", "/openapi.json"), ("GET", "/metrics"), ("POST", f"/api/forward/{cid}/{sid}/api/tools/bash"),
               ("GET", f"/api/forward/{cid}/{sid}/api/health"), ("GET", f"/api/ws-forward/{cid}/{sid}/ws")]
    try:
        assert len(routes) > 25
        for method, path in routes:
            if path == "/health":
                continue
            for who in (anonymous, wrong):
                response = who.request(method, path, json={})
                assert response.status_code == 401, (method, path, response.status_code, response.text[:200])
                assert "credentials" in response.json()["message"]
        assert anonymous.get("/health").status_code == 200
        assert cp.http.get("/metrics").status_code == 200  # with the credentials it works
    finally:
        anonymous.close()
        wrong.close()


def test_served_documents_are_the_ones_fuzzed(sandbox: Any, cp: ControlPlaneProcess) -> None:
    """The fuzzed documents are what the servers publish, built from the same route tables."""
    from control_plane.app import ROUTES as CP_ROUTES
    from sandbox_server.app import ROUTES as SB_ROUTES

    with client(sandbox) as http:
        sandbox_doc = http.get("/openapi.json").json()
    cp_doc = cp.http.get("/openapi.json").json()
    assert {(r.method.lower(), r.path) for r in SB_ROUTES} == \
        {(m, p) for p, ms in sandbox_doc["paths"].items() for m in ms}
    assert {(r.method.lower(), r.path) for r in CP_ROUTES} == {(m, p) for p, ms in cp_doc["paths"].items() for m in ms}
    assert Path(__file__).exists()
