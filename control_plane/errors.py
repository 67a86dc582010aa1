"""The control plane's errors: the one hierarchy of ``sandbox_server.errors``, plus its own.

    ApiError                   500  InternalError        (sandbox_server.errors; every class below it too)
    ├── BadRequest             400
    ├── Unauthorized           401  Unauthorized         missing or wrong credentials
    ├── Forbidden              403
    ├── NotFound               404                       unknown client/server/operation/job, or another client's server
    ├── Conflict               409
    ├── Gone                   410  Gone                 the server exists but is not usable (FINISHED, STOPPED, CRASHED…)
    ├── PayloadTooLarge        413
    ├── Unprocessable          422  ValidationError
    └── Unavailable            503  ServiceUnavailable   the state database cannot be written
        └── store.StoreError

Failures of asynchronous operations are not raised to the caller: they end the operation FAILED
with an ``ErrorResponse`` (see ``operations.py``).
"""

from __future__ import annotations

from sandbox_server.errors import (
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    Unprocessable,
    register,
    render,
)

ControlPlaneError = ApiError  # the name the control plane's modules knew it by


class Unauthorized(ApiError):
    status, kind = 401, "Unauthorized"


class Gone(ApiError):
    status, kind = 410, "Gone"


class Unavailable(ApiError):
    status, kind = 503, "ServiceUnavailable"


register(Unauthorized, Gone, Unavailable)

__all__ = [
    "ApiError", "ControlPlaneError", "BadRequest", "Unauthorized", "Forbidden", "NotFound", "Conflict", "Gone",
    "PayloadTooLarge", "Unprocessable", "Unavailable", "render",
]
