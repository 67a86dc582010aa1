"""How answers become the client's errors (the classes and their tree are ``idegym_env/errors.py``'s):
by the server's error kind, else by status, with the server's own message.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError as PydanticValidationError

import control_plane.errors as cp
import sandbox_server.errors as server
from sandbox_server.http import summarize, validation_items

from ..errors import (
    APIError,
    BadRequest,
    Busy,
    Cancelled,
    Conflict,
    NotFound,
    SandboxGone,
    ServerError,
    TransportError,
    Unauthorized,
    ValidationError,
)

# The servers' error kinds (``sandbox_server.errors``, ``control_plane.errors``) → ours.
_BY_KIND: dict[str, type[APIError]] = {
    server.BadRequest.kind: BadRequest,
    server.PayloadTooLarge.kind: BadRequest,
    server.Unprocessable.kind: ValidationError,
    cp.Unauthorized.kind: Unauthorized,
    server.Forbidden.kind: Unauthorized,
    server.NotFound.kind: NotFound,
    server.Conflict.kind: Conflict,
    cp.Gone.kind: SandboxGone,
    "TooManyRequests": Busy,
    cp.Unavailable.kind: Busy,
    server.ApiError.kind: ServerError,
}


_BY_STATUS: dict[int, type[APIError]] = {422: ValidationError, 401: Unauthorized, 403: Unauthorized, 404: NotFound,
                                         409: Conflict, 410: SandboxGone, 429: Busy, 503: Busy, 499: Cancelled}


def _by_status(status: int) -> type[APIError]:
    """For an answer without a kind we know: a proxy's, an older server's, the 422 of ``specs/``."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return ServerError if status >= 500 else BadRequest


def error_for(status: int, body: str, origin: str) -> APIError:
    """The typed error for an HTTP error answer (by the server's error kind, else by status), with
    the server's own message."""
    message, detail, kind, details = body.strip() or f"HTTP {status}", None, None, None
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        detail = data.get("detail")
        message = str(data.get("message") or (detail if isinstance(detail, str) else "") or message)
        kind = data.get("error") if isinstance(data.get("error"), str) else None
        details = data.get("details") if isinstance(data.get("details"), dict) else None
    cls = _BY_KIND.get(kind or "") or _by_status(status)
    return cls(status, message, body, origin, detail, kind, details)


def invalid_request(exc: PydanticValidationError) -> ValidationError:
    """A request that failed its wire model on the client, as the 422 the server would answer."""
    items = validation_items(exc)
    message = summarize(items)
    return ValidationError(422, message, json.dumps({"detail": items, "message": message}), "client", items,
                           server.Unprocessable.kind)


def shown_url(url: str) -> str:
    """``url`` without credentials (the embedded control plane's URL carries its token)."""
    parts = urlsplit(str(url))
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", "")) or str(url)


START_ONE = ("start one with `idegym control-plane serve` and pass its URL, or leave control_plane_url=None "
             "(no url) for the embedded control plane, which starts by itself")


def place(url: str, unix_socket: str | None = None) -> str:
    """Where a client connects, to name in a message."""
    return f"the Unix socket {unix_socket}" if unix_socket else shown_url(url)


def unreachable(where: str, exc: TransportError) -> TransportError:
    """The first call to a control plane got no answer: say where, and what to do."""
    return type(exc)(f"no control plane answers at {where} ({exc}): {START_ONE}")


def not_a_control_plane(where: str, exc: APIError) -> APIError:
    """The first call got an HTTP error that is not an IdeGym error answer: another service."""
    body = " ".join(exc.body.split())[:120]
    return type(exc)(exc.status, f"{where} is not an IdeGym control plane (POST /api/clients answered "
                                 f"HTTP {exc.status}{': ' + body if body else ''}); check the URL and port, or "
                                 f"{START_ONE}", exc.body, exc.origin, exc.detail, exc.kind, exc.details)
