"""Every error IdeGym's two servers answer with, in one hierarchy, and the one way it is rendered.

    ApiError                      500  InternalError     anything unexpected (a bug: the message says so)
    ├── StatusError               any  by its status     a status chosen where it is raised
    ├── BadRequest                400  BadRequest        a request that cannot be carried out as asked
    ├── Forbidden                 403  Forbidden         a path outside what the tools may touch, a permission denied
    ├── NotFound                  404  NotFound          a missing file, endpoint, client, server…
    ├── Conflict                  409  Conflict          e.g. a patch whose hunks do not apply (file left unchanged)
    ├── PayloadTooLarge           413  PayloadTooLarge   a body over the configured limit
    └── Unprocessable             422  ValidationError   request validation (specs/' HTTPValidationError shape)

    control_plane/errors.py adds the control plane's own: Unauthorized 401, Gone 410, Unavailable 503.

Each error has ``status``, ``kind`` (the ``error`` field of the body, which the client maps to its
typed exceptions), ``message`` (for a person: what went wrong and what to do) and ``details``
(structured, optional). ``ApiError.for_status`` gives the error of any status. ``render`` is
the one renderer: a 422 in the ``HTTPValidationError`` shape of ``specs/``, any other error as an
``ErrorBody``. The sandbox server never answers 410 or 499: those mark
control-plane failures for the published client.
"""

from __future__ import annotations

from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, ClassVar

from .models import ErrorBody, HTTPValidationError

_BY_STATUS: dict[int, type[ApiError]] = {}


class ApiError(Exception):
    """Anything unexpected: a bug, and the message says so. A subclass that names its ``status``
    (``class NotFound(ApiError, status=404)``) answers that status (``for_status``); its kind is
    its name unless it names one."""

    status: ClassVar[int] = 500
    kind: ClassVar[str] = "InternalError"

    def __init_subclass__(cls, status: int | None = None, kind: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status, cls.kind = status, kind or cls.__name__
            _BY_STATUS[status] = cls

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    @staticmethod
    def for_status(status: int, message: str, details: dict[str, Any] | None = None) -> ApiError:
        """The error that answers ``status``: its class in the hierarchy, else a ``StatusError``."""
        cls = _BY_STATUS.get(status)
        return cls(message, details) if cls is not None else StatusError(message, status, details)


_BY_STATUS[ApiError.status] = ApiError


class StatusError(ApiError):
    """An error whose status is chosen where it is raised (a backend's failure, a forward's, a
    status without a class: 405, 429, 504…); its kind is that status's (``kind_of``)."""

    def __init__(self, message: str, status: int = 500, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details)
        self.status = status  # type: ignore[misc]  # this instance's own
        self.kind = kind_of(status)  # type: ignore[misc]


def kind_of(status: int) -> str:
    """The kind of ``status``: its class's, else its HTTP name (``MethodNotAllowed``, ``GatewayTimeout``)."""
    cls = _BY_STATUS.get(status)
    if cls is not None:
        return cls.kind
    try:
        return HTTPStatus(status).phrase.replace(" ", "").replace("-", "")
    except ValueError:
        return f"HTTP{status}"


class BadRequest(ApiError, status=400):
    """A request that cannot be carried out as asked."""


class Forbidden(ApiError, status=403):
    """A path outside what the tools may touch, a permission denied."""


class NotFound(ApiError, status=404):
    """A missing file or endpoint; in the control plane an unknown client, server, operation, job."""


class Conflict(ApiError, status=409):
    """At odds with the current state, e.g. a patch whose hunks do not apply (the file is unchanged)."""


class PayloadTooLarge(ApiError, status=413):
    """A body over the configured limit."""


class Unprocessable(ApiError, status=422, kind="ValidationError"):
    """A validation failure; ``errors`` are items of ``HTTPValidationError.detail`` (``specs/``)."""

    def __init__(self, message: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        # Without items (an operation that failed 422, say) the message is the one item.
        self.errors = errors if errors is not None else [{"loc": ["body"], "msg": message, "type": "value_error"}]

    @classmethod
    def field(cls, loc: list[str | int], msg: str, value: Any = None, type_: str = "value_error") -> Unprocessable:
        return cls(f"{'.'.join(map(str, loc[1:] or loc))}: {msg}", [
            {"loc": loc, "msg": msg, "type": type_, "input": value}
        ])


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
