"""HTTP plumbing shared by both servers, free of any web framework: request validation into the
seed's 422 shape, error bodies, structured logs, the event loop."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .errors import Unprocessable

M = TypeVar("M", bound=BaseModel)


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


def error_body(kind: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of every non-422 error, on both servers."""
    body: dict[str, Any] = {
        "error": kind,
        "message": message,
        "detail": message,  # where FastAPI-style clients look
        "timestamp": datetime.now(UTC).isoformat(),
    }
    if details:
        body["details"] = details
    return body


class JsonFormatter(logging.Formatter):
    """One JSON object per line; request fields come from ``extra``."""

    FIELDS = ("method", "path", "status", "ms", "server_id", "client_id", "operation_id")

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
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
