"""OpenAPI 3.1 documents generated from the route table and the pydantic wire models."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from .models import HTTPValidationError
from .routes import Endpoint

REF = "#/components/schemas/{model}"


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Callable[..., Awaitable[Any]]  # (request) -> response, of either server's framework
    summary: str
    operation_id: str
    request: type[BaseModel] | None
    response: type[BaseModel] | None
    async_operation: bool = False  # control plane: answers 202 with an operation id
    query: type[BaseModel] | None = None  # the query string's parameters, one per field

    @classmethod
    def of(cls, endpoint: Endpoint[Any, Any], handler: Callable[..., Awaitable[Any]], summary: str,
           operation_id: str) -> Route:
        """The route that serves ``endpoint`` (its method, path and models) with ``handler``."""
        return cls(endpoint.method, endpoint.path, handler, summary, operation_id, endpoint.request,
                   endpoint.response)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def build_openapi(routes: Sequence[Route], title: str, version: str, description: str = "") -> dict[str, Any]:
    models: list[type[BaseModel]] = [HTTPValidationError]
    for route in routes:
        for model in (route.request, route.response, route.query):
            if model is not None and model not in models:
                models.append(model)
    _, schema = models_json_schema(
        [(m, "validation" if m is not HTTPValidationError else "serialization") for m in models],
        ref_template=REF,
    )
    components = schema.get("$defs", {})
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        op: dict[str, Any] = {"summary": route.summary, "operationId": route.operation_id}
        params = [p.strip("{}") for p in route.path.split("/") if p.startswith("{")]
        parameters = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in params]
        if route.query is not None:
            query = components[route.query.__name__]
            parameters += [{"name": name, "in": "query", "required": name in query.get("required", ()),
                            "schema": schema} for name, schema in query["properties"].items()]
        if parameters:
            op["parameters"] = parameters
        if route.request is not None:
            op["requestBody"] = {
                "content": {"application/json": {"schema": _ref(route.request)}},
                "required": True,
            }
        ok = "202" if route.async_operation else "200"
        op["responses"] = {
            ok: {
                "description": "Successful Response",
                "content": {"application/json": {"schema": _ref(route.response) if route.response else {}}},
            },
            "422": {
                "description": "Validation Error",
                "content": {"application/json": {"schema": _ref(HTTPValidationError)}},
            },
        }
        paths.setdefault(route.path, {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version, "description": description},
        "paths": paths,
        "components": {"schemas": components},
    }
