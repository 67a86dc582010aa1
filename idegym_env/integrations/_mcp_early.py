"""Early starts of stdio tool calls: a call starts once the SDK's own checks have passed, not after its dispatch.

From a request's parsed message to the tool's handler the SDK takes ~0.55 ms on this host (two
stream hops, a task per request, the request's context, the checks). A running episode's call
needs none of that to start: :class:`EarlyStarts` sees each message as the SDK's serving loop
receives it, makes the checks the SDK makes before calling a ``tools/call`` handler, with the
SDK's own functions and models, and when all pass hands the call to the server, which starts it
at once; the handler, once the SDK calls it, awaits that call instead of making it. The answer,
its errors and its cancellation are the handler's as before.

A call starts early only when the SDK is sure to hand it to the handler as it stands, and when
nothing could order before it:

- its protocol version is the one the SDK would check it at: on a connection that opened with
  the 2026-07-28 per-request envelope (as the SDK's own ``Client`` does), the request's envelope
  passes the SDK's ``classify_inbound_request``; on a handshake connection, the request carries
  no envelope (refused there) and an ``initialize`` was answered with a result (the SDK's gate is
  open), whose negotiated version it is;
- the request passes ``validate_client_request`` at that version and the handler's params model;
- the server has no middleware (with tracing on, the SDK's OpenTelemetry middleware stays, and
  a middleware may rewrite or refuse a request): no call starts before its span;
- no other request of the connection is unanswered (an early start never takes an episode ahead
  of a request the SDK has not dispatched yet).

Only stdio serves this way (one client, its messages in order); streamable HTTP and in-process
clients call the handler as the SDK dispatches. ``python -m benchmarks integrations`` measures it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import anyio
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse, RequestId

log = logging.getLogger(__name__)

try:  # the SDK's own checks (mcp is pinned; without them nothing starts early)
    from mcp.server.runner import _has_modern_envelope
    from mcp.shared.inbound import InboundLadderRejection, classify_inbound_request
    from mcp_types.methods import validate_client_request
except ImportError:  # pragma: no cover - a different SDK
    _has_modern_envelope = classify_inbound_request = validate_client_request = None  # type: ignore[assignment]

#: ``wants(name)``: whether a call of tool ``name`` could start early now (a cheap look, made
#: before the SDK's checks, so that a call that cannot start pays nothing more).
Wants = Callable[[str], bool]
#: ``start(request_id, name, arguments)``: start the call if it may (the SDK's checks passed).
Start = Callable[[RequestId, str, dict[str, Any]], None]
#: ``cancel(request_id)``: the client cancelled a request (it may have started early; its handler may still come).
#: ``forget(request_id)``: a new request reuses the id: a call started early under it is void.
Void = Callable[[RequestId], None]


class EarlyStarts:
    """Watches one stdio connection's messages both ways (:meth:`wrap`) and starts the calls that may start early."""

    def __init__(self, server: Any, *, wants: Wants, start: Start, cancel: Void, forget: Void) -> None:
        self._server = server  # the SDK's lowlevel Server
        self._wants = wants
        self._start = start
        self._cancel = cancel
        self._forget = forget
        self._legacy: bool | None = None  # the connection's era, once its first request came
        self._version: str | None = None  # the protocol version a handshake negotiated
        self._initializing: set[RequestId] = set()
        self._pending: set[RequestId] = set()  # requests received and not yet answered
        self.enabled = validate_client_request is not None

    def wrap(self, read: Any, write: Any) -> tuple[Any, Any]:
        """The transport's streams, watched; pass them to ``Server.run``."""
        return _Received(read, self._received), _Sent(write, self._sent)

    def _received(self, item: Any) -> None:
        message = item.message if isinstance(item, SessionMessage) else None
        if isinstance(message, JSONRPCRequest):
            params = message.params
            if self._legacy is None:  # as serve_dual_era_loop decides the era
                self._legacy = message.method == "initialize" or not (self.enabled and _has_modern_envelope(params))
            key = coerce_request_id(message.id)
            self._forget(key)
            if message.method == "initialize":
                self._initializing.add(key)
            elif message.method == "tools/call" and params and isinstance(name := params.get("name"), str) \
                    and self._may_start(name, params):
                self._start(key, name, dict(params.get("arguments") or {}))
            self._pending.add(key)
        elif isinstance(message, JSONRPCNotification) and message.method == "notifications/cancelled":
            request = (message.params or {}).get("requestId")
            if isinstance(request, str | int):
                key = coerce_request_id(request)
                self._pending.discard(key)  # a cancelled request gets no answer
                self._cancel(key)

    def _may_start(self, name: str, params: Mapping[str, Any]) -> bool:
        """Whether the call may start, and the SDK will call the ``tools/call`` handler with ``params``
        as they are (its checks, after the cheap ones)."""
        if not self.enabled or self._pending or self._server.middleware or not self._wants(name):
            return False
        entry = self._server.get_request_handler("tools/call")
        if entry is None:
            return False
        try:
            if self._legacy:
                if self._version is None or _has_modern_envelope(params):
                    return False
                version = self._version
            else:  # as _serve_modern_stream routes each request by its envelope
                route = classify_inbound_request({"method": "tools/call", "params": params})
                if isinstance(route, InboundLadderRejection):
                    return False
                version = route.protocol_version
            validate_client_request("tools/call", version, params)
            entry.params_type.model_validate(params, by_name=False)
        except Exception:  # noqa: BLE001 - whatever the SDK refuses, it refuses: the handler never runs
            return False
        return True

    def _sent(self, item: Any) -> None:
        message = item.message if isinstance(item, SessionMessage) else None
        if isinstance(message, JSONRPCResponse | JSONRPCError) and message.id is not None:
            key = coerce_request_id(message.id)
            self._pending.discard(key)
            if key in self._initializing:
                self._initializing.discard(key)
                if isinstance(message, JSONRPCResponse):
                    version = message.result.get("protocolVersion")
                    self._version = version if isinstance(version, str) else None


class _Received:
    """The transport's read stream, each message shown to ``seen`` as the SDK's serving loop receives it."""

    def __init__(self, inner: Any, seen: Callable[[Any], None]) -> None:
        self._inner = inner
        self._seen = seen

    @property
    def last_context(self) -> Any:  # the sender's context, which the SDK restores per message
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        item = await self._inner.receive()
        self._seen(item)
        return item

    def __aiter__(self) -> _Received:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def close(self) -> None:
        self._inner.close()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _Received:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


class _Sent:
    """The transport's write stream, each message shown to ``seen`` as the SDK sends it."""

    def __init__(self, inner: Any, seen: Callable[[Any], None]) -> None:
        self._inner = inner
        self._seen = seen

    async def send(self, item: Any) -> None:
        self._seen(item)
        await self._inner.send(item)

    def close(self) -> None:
        self._inner.close()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _Sent:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


__all__ = ["EarlyStarts"]
