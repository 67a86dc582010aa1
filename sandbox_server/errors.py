"""Every error IdeGym's two servers answer with, in one hierarchy, and the one way it is rendered.

    ApiError                      500  InternalError     anything unexpected (a bug: the message says so)
    ├── BadRequest                400  BadRequest        a request that cannot be carried out as asked
    ├── Forbidden                 403  Forbidden         a path outside what the tools may touch, a permission denied
    ├── NotFound                  404  NotFound          a missing file, endpoint, client, server…
    ├── Conflict                  409  Conflict          e.g. a patch whose hunks do not apply (file left unchanged)
    ├── PayloadTooLarge           413  PayloadTooLarge   a body over the configured limit
    └── Unprocessable             422  ValidationError   request validation (the seed's HTTPValidationError shape)

    control_plane/errors.py adds the control plane's own: Unauthorized 401, Gone 410, Unavailable 503.

Each error has ``status``, ``kind`` (the ``error`` field of the body, which the client maps to its
typed exceptions), ``message`` (for a person: what went wrong and what to do) and ``details``
(structured, optional). ``ApiError.for_status`` gives the error of any other HTTP status (405,
429, 504…). ``render`` is the one renderer: a 422 in the seed's ``HTTPValidationError`` shape, any
other error as an ``ErrorBody``. The sandbox server never answers 410 or 499: those mark
control-plane failures for the published client.
"""

from __future__ import annotations

from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, ClassVar

from .models import ErrorBody, HTTPValidationError


class ApiError(Exception):
    status: ClassVar[int] = 500
    kind: ClassVar[str] = "InternalError"

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    @staticmethod
    def for_status(status: int, message: str, details: dict[str, Any] | None = None) -> ApiError:
        """The error that answers ``status``: its class in the hierarchy, or (a status without one)
        an ``ApiError`` whose kind is the status's name (``MethodNotAllowed``, ``GatewayTimeout``)."""
        cls = _BY_STATUS.get(status)
        if cls is not None:
            return cls(message, details)
        error = ApiError(message, details)
        error.status = status  # type: ignore[misc]  # one instance answers a status of its own
        try:
            error.kind = HTTPStatus(status).phrase.replace(" ", "").replace("-", "")  # type: ignore[misc]
        except ValueError:
            error.kind = f"HTTP{status}"  # type: ignore[misc]
        return error


SandboxServerError = ApiError  # the name the sandbox server's modules knew it by


class BadRequest(ApiError):
    status, kind = 400, "BadRequest"


class Forbidden(ApiError):
    status, kind = 403, "Forbidden"


class NotFound(ApiError):
    status, kind = 404, "NotFound"


class Conflict(ApiError):
    status, kind = 409, "Conflict"


class PayloadTooLarge(ApiError):
    status, kind = 413, "PayloadTooLarge"


class Unprocessable(ApiError):
    """A validation failure; ``errors`` are items of the seed's ``HTTPValidationError.detail``."""

    status, kind = 422, "ValidationError"

    def __init__(self, message: str, errors: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.errors = errors

    @classmethod
    def field(cls, loc: list[str | int], msg: str, value: Any = None, type_: str = "value_error") -> Unprocessable:
        return cls(f"{'.'.join(map(str, loc[1:] or loc))}: {msg}", [
            {"loc": loc, "msg": msg, "type": type_, "input": value}
        ])


_BY_STATUS: dict[int, type[ApiError]] = {}


def register(*classes: type[ApiError]) -> None:
    """Make ``ApiError.for_status`` answer these classes' statuses with them."""
    for cls in classes:
        _BY_STATUS[cls.status] = cls


register(ApiError, BadRequest, Forbidden, NotFound, Conflict, PayloadTooLarge)


def render(error: ApiError) -> bytes:
    """The JSON body of ``error`` (answered with ``error.status``), on both servers."""
    if isinstance(error, Unprocessable):
        body = HTTPValidationError.model_validate({"detail": error.errors, "message": error.message})
        return body.model_dump_json(exclude_unset=True).encode()
    return ErrorBody(
        error=error.kind,
        message=error.message,
        detail=error.message,  # where FastAPI-style clients look
        timestamp=datetime.now(UTC).isoformat(),
        details=error.details or None,
    ).model_dump_json(exclude_none=True).encode()


def from_os_error(exc: OSError, path: str) -> ApiError:
    """Map an OSError raised while touching ``path`` to the error the client should see."""
    reason = exc.strerror or str(exc)
    if isinstance(exc, FileNotFoundError):
        return NotFound(f"{path}: no such file or directory")
    if isinstance(exc, PermissionError):
        return Forbidden(f"{path}: permission denied for the sandbox's tool user")
    if isinstance(exc, IsADirectoryError):
        return BadRequest(f"{path}: is a directory, not a file")
    if isinstance(exc, NotADirectoryError):
        return BadRequest(f"{path}: a parent of this path is a file, not a directory")
    return BadRequest(f"{path}: {reason}")
