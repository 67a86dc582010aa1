"""Errors the control plane answers with synchronously, and their HTTP status.

    ControlPlaneError          500  unexpected (the message says it is a bug)
    ├── BadRequest             400
    ├── Unauthorized           401  missing or wrong Basic credentials
    ├── NotFound               404  unknown client/server/operation/job, or another client's server
    ├── Conflict               409
    ├── Gone                   410  the server exists but is not usable (FINISHED, STOPPED, CRASHED…)
    ├── TooManyRequests        429
    └── Unavailable            503  the state database cannot be written
        └── store.StoreError

Failures of asynchronous operations are not raised to the caller: they end the operation FAILED
with an ``ErrorResponse`` (see ``operations.py``).
"""

from __future__ import annotations

from typing import Any


class ControlPlaneError(Exception):
    status = 500
    kind = "InternalError"

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class BadRequest(ControlPlaneError):
    status, kind = 400, "BadRequest"


class Unauthorized(ControlPlaneError):
    status, kind = 401, "Unauthorized"


class NotFound(ControlPlaneError):
    status, kind = 404, "NotFound"


class Conflict(ControlPlaneError):
    status, kind = 409, "Conflict"


class Gone(ControlPlaneError):
    status, kind = 410, "Gone"


class TooManyRequests(ControlPlaneError):
    status, kind = 429, "TooManyRequests"


class Unavailable(ControlPlaneError):
    status, kind = 503, "ServiceUnavailable"
