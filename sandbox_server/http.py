"""HTTP plumbing shared by the handlers: JSON bodies in and out, errors as JSON, request logs."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from .errors import SandboxServerError, Unprocessable

log = logging.getLogger("sandbox_server.http")
M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


# Fields whose values are secrets: never echoed back in a validation error (nor logged).
SECRET_FIELDS = {"env"}


def validation_items(exc: ValidationError, prefix: str = "body") -> list[dict[str, Any]]:
    items = []
    for err in exc.errors(include_url=False):
        item = {"loc": [prefix, *err["loc"]], "msg": err["msg"], "type": err["type"]}
        if "input" in err and not (err["loc"] and err["loc"][0] in SECRET_FIELDS):
            item["input"] = _jsonable(err["input"])
        if err.get("ctx"):
            item["ctx"] = {k: _jsonable(v) for k, v in err["ctx"].items()}
        items.append(item)
    return items


def summarize(items: list[dict[str, Any]]) -> str:
    parts = [f"{'.'.join(str(p) for p in item['loc'][1:]) or 'body'}: {item['msg']}" for item in items[:5]]
    more = f" (+{len(items) - 5} more)" if len(items) > 5 else ""
    return "invalid request: " + "; ".join(parts) + more


def parse_model(raw: bytes, model: type[M]) -> M:
    """Validate a JSON body; an empty body counts as ``{}``. Raises ``Unprocessable`` (422)."""
    if raw.strip():
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            item = {"loc": ["body"], "msg": f"JSON decode error: {exc}", "type": "json_invalid"}
            raise Unprocessable("request body is not valid JSON: " + str(exc), [item]) from exc
    else:
        data = {}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        items = validation_items(exc)
        raise Unprocessable(summarize(items), items) from exc


async def read_model(request: web.Request, model: type[M]) -> M:
    return parse_model(await request.read(), model)


def json_response(model: BaseModel, status: int = 200) -> web.Response:
    return web.Response(
        body=model.model_dump_json(by_alias=True).encode(), status=status, content_type="application/json"
    )


def error_response(status: int, kind: str, message: str, details: dict[str, Any] | None = None) -> web.Response:
    body: dict[str, Any] = {
        "error": kind,
        "message": message,
        "detail": message,  # where FastAPI-style clients look
        "timestamp": datetime.now(timezone.utc).isoformat(),
    }
    if details:
        body["details"] = details
    return web.json_response(body, status=status)


def validation_response(exc: Unprocessable) -> web.Response:
    return web.json_response({"detail": exc.errors, "message": exc.message}, status=422)


_HTTP_HINTS = {
    404: "no such endpoint; GET /openapi.json lists them",
    405: "method not allowed on this endpoint; GET /openapi.json lists them",
    413: "request body too large",
}


def error_middleware(service: str, errors: tuple[type[Exception], ...] = (SandboxServerError,)) -> Callable:
    """Turn every failure into a JSON error; log one line per request (never bodies).

    ``errors`` are the service's own error classes: each has ``status``, ``kind``, ``message`` and
    ``details`` and becomes a JSON body with that status.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except Unprocessable as exc:
            status = 422
            return validation_response(exc)
        except errors as exc:
            status = exc.status  # type: ignore[attr-defined]
            return error_response(status, exc.kind, exc.message, exc.details)  # type: ignore[attr-defined]
        except web.HTTPException as exc:
            status = exc.status
            if exc.status < 400:
                raise
            hint = _HTTP_HINTS.get(exc.status, exc.reason)
            message = f"{request.method} {request.path}: {hint}"
            if exc.status == 413:
                message = f"{request.method} {request.path}: {exc.text or hint}; send smaller chunks"
            return error_response(exc.status, exc.reason.replace(" ", ""), message)
        except Exception as exc:  # a bug: say so, keep the server up
            log.exception("unhandled error in %s %s", request.method, request.path)
            return error_response(
                500, "InternalError",
                f"{service} hit an unexpected {type(exc).__name__}: {exc}. This is a bug; please report it.",
            )
        finally:
            if log.isEnabledFor(logging.INFO):
                log.info(
                    "request",
                    extra={
                        "method": request.method,
                        "path": request.path,
                        "status": status,
                        "ms": round((time.perf_counter() - started) * 1000, 2),
                    },
                )

    return middleware


class JsonFormatter(logging.Formatter):
    """One JSON object per line; request fields come from ``extra``."""

    FIELDS = ("method", "path", "status", "ms", "server_id", "client_id", "operation_id")

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in self.FIELDS:
            if hasattr(record, key):
                entry[key] = getattr(record, key)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        if hasattr(record, "path"):
            base += f" {record.method} {record.path} {record.status} {record.ms}ms"  # type: ignore[attr-defined]
        return base


def setup_logging(json_lines: bool, level: str = "WARNING") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def run_loop(coro: Any) -> None:
    """Run a server coroutine on uvloop when it is installed (a faster event loop), else asyncio."""
    try:
        import uvloop
    except ImportError:
        import asyncio

        asyncio.run(coro)
        return
    uvloop.run(coro)
