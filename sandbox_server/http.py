"""HTTP plumbing shared by both servers, free of any web framework: request validation into the
422 shape of ``specs/``, structured logs, the event loop (error bodies: ``errors.render``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .errors import Unprocessable

M = TypeVar("M", bound=BaseModel)


@dataclass
class Reply:
    """An HTTP answer as read off the wire: by the client, and by the control plane from a sandbox.
    Header names are lower case (``headers.get("content-type")``)."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.body) if self.body else {}


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
        item: dict[str, Any] = {"loc": [prefix, *err["loc"]], "msg": err["msg"], "type": err["type"]}
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


MAX_JSON_DEPTH = 100  # arrays and objects in a request body nest at most this deep


def json_depth_exceeds(data: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether parsed JSON nests arrays/objects deeper than ``limit`` (walked without recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def too_deep() -> Unprocessable:
    message = f"request body nests arrays/objects deeper than the limit of {MAX_JSON_DEPTH} levels"
    return Unprocessable(message, [{"loc": ["body"], "msg": message, "type": "json_too_deep"}])


def parse_model(raw: bytes, model: type[M]) -> M:
    """Validate a JSON body; an empty body counts as ``{}``. Raises ``Unprocessable`` (422), also
    for a body nested deeper than ``MAX_JSON_DEPTH`` (validators recurse: it would be a 500)."""
    # A body with no more brackets than the limit cannot nest deeper (most bodies: no walk).
    shallow = raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH
    if shallow:
        # Parsed and validated in one go by pydantic; what it refuses (invalid JSON, a lone
        # surrogate, a field's error) is parsed again below, for the same 422 as ever.
        try:
            return model.model_validate_json(raw or b"{}")
        except ValidationError:
            pass
    if raw.strip():
        try:
            data = json.loads(raw)
        except RecursionError:
            raise too_deep() from None
        except (ValueError, UnicodeDecodeError) as exc:
            item = {"loc": ["body"], "msg": f"JSON decode error: {exc}", "type": "json_invalid"}
            raise Unprocessable("request body is not valid JSON: " + str(exc), [item]) from exc
        if not shallow and json_depth_exceeds(data):
            raise too_deep()
    else:
        data = {}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        items = validation_items(exc)
        raise Unprocessable(summarize(items), items) from exc


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
    text = TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(JsonFormatter() if json_lines else text)
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
