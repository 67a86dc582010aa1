"""The control plane's errors: the one hierarchy of ``sandbox_server.errors``, plus its own.

    ApiError                   500  InternalError        (sandbox_server.errors; every class below it too)
    ├── StatusError            any  by its status        decided where raised:
    │   ├── backends.base.BackendError                    a backend's failure (404 unknown image, 409…)
    │   └── sandbox_http.ForwardError                     the sandbox unreachable (410) or no answer (500)
    ├── BadRequest             400
    ├── Unauthorized           401  Unauthorized         missing or wrong credentials
    ├── Forbidden              403
    ├── NotFound               404                       unknown client/server/operation/job, or another client's server
    ├── Conflict               409
    ├── Gone                   410  Gone                 the server exists but is not usable (FINISHED, CRASHED…)
    ├── PayloadTooLarge        413
    ├── Unprocessable          422  ValidationError
    └── Unavailable            503  ServiceUnavailable   the state database cannot be written
        └── store.StoreError

An error raised by the work of an asynchronous operation is not raised to the caller: it ends
the operation FAILED with an ``ErrorResponse`` of the same status and message (``operations.py``).
"""

from __future__ import annotations

from sandbox_server.errors import (
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    StatusError,
    Unprocessable,
    render,
)


class Unauthorized(ApiError, status=401):
    """Missing or wrong credentials."""


class Gone(ApiError, status=410):
    """The server exists but is not usable (FINISHED, STOPPED, CRASHED…), or its sandbox is unreachable."""


class Unavailable(ApiError, status=503, kind="ServiceUnavailable"):
    """The control plane cannot do it now: the state database cannot be written, no sandbox is free."""


__all__ = [
    "ApiError", "BadRequest", "Unauthorized", "Forbidden", "NotFound", "Conflict", "Gone",
    "PayloadTooLarge", "StatusError", "Unprocessable", "Unavailable", "render",
]
