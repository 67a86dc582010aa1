"""API surface: OpenAPI against ``specs/``, health, capabilities, error shapes."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from sandbox_server import routes
from sandbox_server.errors import ApiError
from sandbox_server.models import ErrorBody
from tests.helpers import SEEDS, SandboxProcess

SEED = yaml.safe_load((SEEDS / "sandbox-server-api.yaml").read_text())
IGNORED_KEYS = {"title", "description", "examples"}
# Request fields we add beyond ``specs/``; each is optional, so clients of those specs are unaffected.
EXTENSIONS = {"TestRequest": {"report_glob"}, "SetupRequest": {"keep_processes"},
              "CompilationRequest": {"keep_processes"}}


def _resolve(schema: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _normalize(schema: Any, doc: dict[str, Any]) -> Any:
    if isinstance(schema, dict):
        schema = _resolve(schema, doc)
        # ``"default": null`` and an absent default mean the same for an optional field
        return {k: _normalize(v, doc) for k, v in schema.items()
                if k not in IGNORED_KEYS and not (k == "default" and v is None)}
    if isinstance(schema, list):
        return [_normalize(v, doc) for v in schema]
    if isinstance(schema, float) and schema.is_integer():
        return int(schema)
    return schema


def test_openapi_paths_and_request_schemas_match_the_seed(server: SandboxProcess) -> None:
    ours = server.client.get("/openapi.json").json()
    for path, methods in SEED["paths"].items():
        assert path in ours["paths"], f"missing {path}"
        for method, op in methods.items():
            mine = ours["paths"][path][method]
            assert mine["operationId"] == op["operationId"]
            want = _normalize(op["requestBody"]["content"]["application/json"]["schema"], SEED)
            have = _normalize(mine["requestBody"]["content"]["application/json"]["schema"], ours)
            name = op["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
            extra = EXTENSIONS.get(name, set())
            assert set(have["properties"]) - extra == set(want["properties"]), name
            for prop, spec in want["properties"].items():
                assert have["properties"][prop] == spec, (name, prop)
            assert set(have.get("required", [])) == set(want.get("required", [])), name
    for extra_path in ("/api/health", "/api/capabilities", "/api/project/reset", "/execute"):
        assert extra_path in ours["paths"]


def test_health_and_capabilities(any_server: SandboxProcess) -> None:
    assert any_server.client.get("/api/health").status_code == 200
    plugins = any_server.client.get("/api/capabilities").json()["plugins"]
    assert {"tools", "rewards"} <= set(plugins)


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/api/nope", 404),
    ("GET", "/api/tools/bash", 405),
    ("POST", "/api/tools/file/download", 404),  # valid body, missing file
])
def test_errors_are_json_with_a_message(server: SandboxProcess, method: str, path: str, status: int) -> None:
    body = {"file_path": "missing.txt"} if path.endswith("download") else None
    resp = server.client.request(method, path, json=body)
    assert resp.status_code == status
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json()["message"]
    body = ErrorBody.model_validate(resp.json())  # the one renderer's shape
    assert body.error == ApiError.for_status(status, "").kind and body.detail == body.message


def test_oversized_body_is_413(project, tmp_path) -> None:
    proc = SandboxProcess(project, "tcp", tmp_path, extra=["--max-body-bytes", "100000"])
    try:
        resp = proc.post("/api/tools/file/create", {"file_path": "x", "content": "a" * 200_000})
        assert resp.status_code == 413 and "smaller" in resp.json()["message"]
    finally:
        proc.stop()


def test_validation_errors_use_the_seed_shape(server: SandboxProcess) -> None:
    resp = server.post("/api/tools/file/edit", {"file_path": "a", "start_line": "x"})
    assert resp.status_code == 422
    detail = resp.json()["detail"]
    assert {tuple(d["loc"]) for d in detail} >= {("body", "start_line"), ("body", "end_line"),
                                                  ("body", "new_content")}
    assert all({"loc", "msg", "type"} <= set(d) for d in detail)


def test_the_route_table_serves_exactly_the_routes_module(server: SandboxProcess) -> None:
    """Paths and body models are defined once (``sandbox_server.routes``): the server serves each
    with its models and nothing else, so the client cannot call a path the server does not have."""
    ours = server.client.get("/openapi.json").json()
    served = {(method.upper(), path) for path, ops in ours["paths"].items() for method in ops}
    assert served == {(e.method, e.path) for e in routes.ENDPOINTS}
    for e in routes.ENDPOINTS:
        op = ours["paths"][e.path][e.method.lower()]
        if e.request is not None:
            ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/" + e.request.__name__), e.path
        assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/" + e.response.__name__), e.path
        assert routes.endpoint_for(e.request.model_construct()) is e if e.request else True
