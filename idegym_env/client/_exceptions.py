"""Every error the IdeGym client raises, in one hierarchy::

    IdeGymError
    ├── TransportError            no HTTP answer: connection refused, reset, DNS…
    │   └── TimeoutError          no answer in time (also a builtin ``TimeoutError``)
    └── APIError                  an HTTP error answer; ``status``, ``message``, ``body``, ``origin``
        ├── BadRequest            400, 422 (``ValidationError``: ``detail`` lists the fields)
        │   └── ValidationError
        ├── Unauthorized          401, 403
        ├── NotFound              404 (unknown client/server/file…)
        ├── Conflict              409 (e.g. a patch whose hunks did not apply)
        ├── SandboxGone           410 (the sandbox crashed, was stopped or reaped)
        ├── Busy                  429, 503 (retry later)
        ├── Cancelled             499
        └── ServerError           500 and other 5xx

``origin`` says who answered: ``"sandbox"`` (the sandbox server rejected the call, e.g. a missing
file), ``"control-plane"`` (e.g. an unknown server) or ``"client"`` (a request that failed its wire
model before it was sent: the same 422 items the server would have answered).
"""

from __future__ import annotations

import builtins
import json
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from sandbox_server.http import summarize, validation_items


class IdeGymError(Exception):
    """Base of every error raised by ``idegym_env.client``."""


class TransportError(IdeGymError):
    """The request got no HTTP answer."""


class TimeoutError(TransportError, builtins.TimeoutError):  # noqa: A001 - mirrors the builtin on purpose
    """No answer within the timeout (or an operation did not end within its deadline)."""


class APIError(IdeGymError):
    def __init__(self, status: int, message: str, body: str = "", origin: str = "control-plane",
                 detail: Any = None) -> None:
        super().__init__(f"{status} from the {origin}: {message}")
        self.status = status
        self.message = message
        self.body = body
        self.origin = origin
        self.detail = detail


class BadRequest(APIError):
    pass


class ValidationError(BadRequest):
    pass


class Unauthorized(APIError):
    pass


class NotFound(APIError):
    pass


class Conflict(APIError):
    pass


class SandboxGone(APIError):
    pass


class Busy(APIError):
    pass


class Cancelled(APIError):
    pass


class ServerError(APIError):
    pass


def error_for(status: int, body: str, origin: str) -> APIError:
    """The typed error for an HTTP error answer, with the server's own message."""
    message, detail = body.strip() or f"HTTP {status}", None
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        detail = data.get("detail")
        message = str(data.get("message") or (detail if isinstance(detail, str) else "") or message)
    cls: type[APIError]
    if status == 422:
        cls = ValidationError
    elif status in (401, 403):
        cls = Unauthorized
    elif status == 404:
        cls = NotFound
    elif status == 409:
        cls = Conflict
    elif status == 410:
        cls = SandboxGone
    elif status in (429, 503):
        cls = Busy
    elif status == 499:
        cls = Cancelled
    elif status >= 500:
        cls = ServerError
    else:
        cls = BadRequest
    return cls(status, message, body, origin, detail)


def invalid_request(exc: PydanticValidationError) -> ValidationError:
    """A request that failed its wire model on the client, as the 422 the server would answer."""
    items = validation_items(exc)
    message = summarize(items)
    return ValidationError(422, message, json.dumps({"detail": items, "message": message}), "client", items)
