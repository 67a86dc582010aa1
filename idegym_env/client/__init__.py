"""The typed, friendly way to use IdeGym without Gymnasium: sync and async clients.

    with IdeGymClient("http://localhost:8000") as client:
        with client.start() as sandbox:              # finished (reusable) on exit
            print(sandbox.bash("python3 --version").stdout)

Request bodies are the sandbox server's wire models (``sandbox_server.models``) sent to the routes
of ``sandbox_server.routes``; ``Sandbox.run_tool(call)`` carries out a tool call of
``idegym_env.tools`` and ``Sandbox.call(endpoint, request)`` any route. Calls through the control
plane take one round trip (``Prefer: wait``). Errors are the typed
exceptions of ``idegym_env.client`` (``idegym_env/errors.py`` draws their tree), carrying the server's
own message.
"""

from ..errors import (
    APIError,
    BadRequest,
    Busy,
    Cancelled,
    ConfigurationError,
    Conflict,
    IdeGymError,
    InfrastructureError,
    NotFound,
    SandboxGone,
    ServerError,
    ServiceError,
    TimeoutError,
    TransportError,
    Unauthorized,
    ValidationError,
)
from ._async import AsyncIdeGymClient, AsyncSandbox
from ._plans import ToolResult
from ._settings import BUILTIN_IMAGE, Settings
from ._sync import IdeGymClient, Sandbox

__all__ = [
    "IdeGymClient", "Sandbox", "AsyncIdeGymClient", "AsyncSandbox", "Settings", "BUILTIN_IMAGE", "ToolResult",
    "IdeGymError", "TransportError", "TimeoutError", "APIError", "BadRequest", "ValidationError", "Unauthorized",
    "NotFound", "Conflict", "SandboxGone", "Busy", "Cancelled", "ServerError", "ConfigurationError",
    "ServiceError", "InfrastructureError",
]
