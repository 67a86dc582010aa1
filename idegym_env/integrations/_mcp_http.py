"""Streamable HTTP for ``idegym mcp serve``: credentials, sessions only, and a session's end.

:func:`guard` wraps the SDK's ASGI app:

* **Credentials**: every request must carry the server's token (:mod:`.mcp_token`), else a 401
  whose JSON-RPC error says what to send and where the token is. With ``token=None``
  (``--auth none``) anyone who can connect may run commands in sandboxes.
* **Sessions only**: the 2026-07-28 protocol has no sessions, so its clients could not have
  episodes of their own (each would act on whatever a shared default held). A request at a
  protocol version without the ``initialize`` handshake is answered ``-32022`` naming the
  handshake versions: the SDK's client (``mode="auto"``, its default) then makes the handshake,
  which gives it a session (``mcp-session-id``) and with it an episode of its own.
* **A session's end**: a session's ``DELETE`` ends its episodes before the client hears the
  answer (so a client that counts sandboxes right after it sees them handed back).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from mcp_types import INVALID_REQUEST, UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from .mcp_token import authorized

SESSION_HEADER = "mcp-session-id"
VERSION_HEADER = "mcp-protocol-version"

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


async def _answer(send: Any, status: int, code: int, message: str, data: Any = None,
                  headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """A JSON-RPC error without a request id (the SDK's client gives it the id of its request)."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


def guard(app: ASGIApp, *, token: str | None, credentials_hint: str,
          end_session: Callable[[str], Awaitable[None]]) -> ASGIApp:
    """``app`` behind the checks of the module docstring; ``end_session(session_id)`` ends a
    session's episodes; ``credentials_hint`` says, in a 401, what to send."""

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            return await app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        if token is not None and not authorized(headers.get("authorization"), token):
            return await _answer(send, 401, INVALID_REQUEST, f"this MCP server needs credentials: {credentials_hint}",
                                 headers=((b"www-authenticate", b'Bearer realm="idegym-mcp"'),))
        version = headers.get(VERSION_HEADER)
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            return await _answer(
                send, 400, UNSUPPORTED_PROTOCOL_VERSION,
                f"protocol version {version} has no sessions, and each client's episodes belong to its session: "
                "connect with the initialize handshake (the MCP SDK's Client does by itself, mode 'auto' or "
                "'legacy')", {"supported": list(HANDSHAKE_PROTOCOL_VERSIONS), "requested": version})
        session = headers.get(SESSION_HEADER)
        if scope.get("method") != "DELETE" or not session:
            return await app(scope, receive, send)

        async def send_after_ending(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start" and message.get("status", 500) < 300:
                await end_session(session)
            await send(message)

        await app(scope, receive, send_after_ending)

    return guarded


__all__ = ["guard", "SESSION_HEADER"]
