"""Errors the sandbox server answers with, and how each maps to HTTP.

    SandboxServerError            500  anything unexpected (a bug: the message says so)
    ├── BadRequest                400  a request that cannot be carried out as asked
    ├── Forbidden                 403  a path outside what the tools may touch, a permission denied
    ├── NotFound                  404  a missing file or endpoint
    ├── Conflict                  409  a patch whose hunks do not apply (file left unchanged)
    ├── PayloadTooLarge           413  a body over the configured limit
    └── Unprocessable             422  request validation (HTTPValidationError shape)

The server never answers 410 or 499: those mark control-plane failures for the published client.
"""

from __future__ import annotations

from typing import Any


class SandboxServerError(Exception):
    status = 500
    kind = "InternalError"

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class BadRequest(SandboxServerError):
    status = 400
    kind = "BadRequest"


class Forbidden(SandboxServerError):
    status = 403
    kind = "Forbidden"


class NotFound(SandboxServerError):
    status = 404
    kind = "NotFound"


class Conflict(SandboxServerError):
    status = 409
    kind = "Conflict"


class PayloadTooLarge(SandboxServerError):
    status = 413
    kind = "PayloadTooLarge"


class Unprocessable(SandboxServerError):
    """A validation failure; ``errors`` are items of the seed's ``HTTPValidationError.detail``."""

    status = 422
    kind = "ValidationError"

    def __init__(self, message: str, errors: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.errors = errors

    @classmethod
    def field(cls, loc: list[str | int], msg: str, value: Any = None, type_: str = "value_error") -> Unprocessable:
        return cls(f"{'.'.join(map(str, loc[1:] or loc))}: {msg}", [
            {"loc": loc, "msg": msg, "type": type_, "input": value}
        ])


def from_os_error(exc: OSError, path: str) -> SandboxServerError:
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
