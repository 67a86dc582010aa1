"""The typed, friendly way to use IdeGym without Gymnasium: sync and async clients.

    with IdeGymClient("http://localhost:8000") as client:
        with client.start() as sandbox:              # finished (reusable) on exit
            print(sandbox.bash("python3 --version").stdout)

Calls through the control plane take one round trip (``Prefer: wait``). Errors are the typed
exceptions of ``idegym_env.client`` (see ``_exceptions.py`` for the tree), carrying the server's
own message.
"""

from ._async import AsyncIdeGymClient, AsyncSandbox
from ._exceptions import (
    APIError,
    BadRequest,
    Busy,
    Cancelled,
    Conflict,
    IdeGymError,
    NotFound,
    SandboxGone,
    ServerError,
    TimeoutError,
    TransportError,
    Unauthorized,
    ValidationError,
)
from ._settings import BUILTIN_IMAGE, Settings
from ._sync import IdeGymClient, Sandbox

__all__ = [
    "IdeGymClient", "Sandbox", "AsyncIdeGymClient", "AsyncSandbox", "Settings", "BUILTIN_IMAGE",
    "IdeGymError", "TransportError", "TimeoutError", "APIError", "BadRequest", "ValidationError", "Unauthorized",
    "NotFound", "Conflict", "SandboxGone", "Busy", "Cancelled", "ServerError",
]
