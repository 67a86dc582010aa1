"""The client's protocol, written once and without I/O.

Every API call is a *plan*: a generator that yields ``Call`` (an HTTP request) or ``Sleep``
instructions and receives ``Reply`` objects, then returns the typed result. ``_sync.py`` and
``_async.py`` only drive plans (over ``_http.HTTPSession`` and ``_http_async.AsyncHTTPSession``) — so the sync and async
clients cannot drift apart.

Calls through the control plane send ``Prefer: wait=<seconds>`` and so take one round trip; when
the control plane answers 202 instead (the call outlived the wait, or an older server ignores
the preference), the plan polls the operation like the published client does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

import pydantic_core
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from control_plane.constants import FORWARD_FAILED, PREFER_HEADER, SANDBOX_HEADER
from control_plane.models import AsyncOperationStatusResponse, ErrorResponse, ForwardRequestResponse
from sandbox_server.grading.models import GradeRequest
from sandbox_server.http import Reply
from sandbox_server.models import ExecuteRequest, TimedRequest
from sandbox_server.routes import Endpoint

from ..errors import APIError, TimeoutError
from ._exceptions import error_for, invalid_request

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
Req = TypeVar("Req", bound=BaseModel)  # a wire model: the sandbox server's or the control plane's

# Seconds added to a call's own timeout before the client gives up waiting for the answer.
SLACK = 30.0
# What the server may take over a call that has no timeout of its own (files, capabilities)…
UNTIMED_CALL = 120.0
# …and what a code-runner call may spend compiling before its own run-time limit starts.
COMPILE_ALLOWANCE = 120.0


def seconds_for(request: BaseModel | None) -> float:
    """How long the sandbox server may take over ``request``; every client timeout comes from here
    (plus ``SLACK`` for the answer to arrive)."""
    if isinstance(request, TimedRequest):
        return request.timeout + request.graceful_termination_timeout
    if isinstance(request, ExecuteRequest):
        return request.timeout + COMPILE_ALLOWANCE
    if isinstance(request, GradeRequest):  # every stage may take its whole time, and installing the tree
        return sum(s.timeout + s.graceful_termination_timeout for s in request.stages) + UNTIMED_CALL
    return UNTIMED_CALL


def wire(model: type[Req], **fields: Any) -> Req:
    """A request body as its wire model, checked here: an invalid one raises ``ValidationError``
    (422, the items the server would answer) without a round trip."""
    try:
        return model(**fields)
    except PydanticValidationError as exc:
        raise invalid_request(exc) from None


@dataclass
class Call:
    method: str
    path: str
    json: Any = None
    params: dict[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float | None = 60.0
    content: IO[bytes] | None = None  # a raw body, streamed from its start (instead of ``json``)
    content_length: int | None = None
    data: bytes | None = None  # a JSON body already encoded (a wire model's, instead of ``json``)


@dataclass
class Sleep:
    seconds: float


@dataclass
class Blocking:
    """Synchronous work inside a plan (an env's grading, made with the sync client): the sync
    driver does it in place, the async one on a worker thread, never on its event loop. It is
    answered with what ``work`` returned."""

    work: Callable[[], Any]


# A Call is answered with its Reply, a Sleep with None, Blocking work with its value.
Plan = Generator["Call | Sleep | Blocking", Any, T]


def request(call: Call) -> Plan[Reply]:
    """Yield ``call`` and take its reply (``yield from request(...)``)."""
    reply = yield call
    if not isinstance(reply, Reply):
        raise TypeError(f"the driver answered {call.method} {call.path} with {reply!r}")
    return reply


@dataclass(frozen=True)
class Target:
    """Where a sandbox's API is: directly at a sandbox server, or behind the control plane."""

    prefix: str  # "" (direct) or "/api/forward/<client>/<server>/"
    via_control_plane: bool

    @classmethod
    def direct(cls) -> Target:
        return cls("/", False)

    @classmethod
    def forwarded(cls, client_id: str, server_id: int) -> Target:
        return cls(f"/api/forward/{client_id}/{server_id}/", True)


def _check(reply: Reply, origin: str) -> Reply:
    if reply.status >= 400:
        raise error_for(reply.status, reply.text, origin)
    return reply


def poll_operation(op_id: int, timeout: float) -> Plan[AsyncOperationStatusResponse]:
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        reply = _check((yield from request(Call("GET", f"/api/operations/status/{op_id}"))), "control-plane")
        op = AsyncOperationStatusResponse.model_validate(reply.json())
        if op.status in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return op
        if time.monotonic() >= deadline:
            raise TimeoutError(f"operation {op_id} did not finish within {timeout:g} s (still {op.status})")
        yield Sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
        delay = min(delay * 1.5, 1.0)


def _failed_operation(op: AsyncOperationStatusResponse, forwarded: bool) -> APIError:
    error = ErrorResponse.model_validate_json(op.result or "{}")
    status = error.status_code or 500
    body = error.body or ""
    ours = status in (410, 499) or (status == 500 and body.startswith(FORWARD_FAILED)) or error.status_code is None
    return error_for(status, body, "sandbox" if forwarded and not ours else "control-plane")


def sandbox_call(target: Target, method: str, path: str, body: Any = None, timeout: float = 600.0, *,
                 data: bytes | None = None) -> Plan[Reply]:
    """One call to the sandbox API (``path`` like ``api/tools/bash``); raises on HTTP errors.
    ``body`` is sent as JSON, or ``data``, JSON already encoded."""
    url = target.prefix + path
    if not target.via_control_plane:
        return _check((yield from request(Call(method, url, json=body, timeout=timeout + SLACK, data=data))),
                      "sandbox")
    wait = timeout + SLACK
    reply = yield from request(Call(method, url, json=body, headers={PREFER_HEADER: f"wait={wait:g}"},
                                    timeout=wait + SLACK, data=data))
    if reply.status == 202:
        op = yield from poll_operation(int(reply.json()["async_operation_id"]), wait + SLACK)
        if op.status != "SUCCEEDED":
            raise _failed_operation(op, forwarded=True)
        result = ForwardRequestResponse.model_validate_json(op.result or "{}")
        return Reply(result.status_code or 200, result.headers or {}, (result.body or "").encode())
    origin = "sandbox" if reply.headers.get(SANDBOX_HEADER.lower()) == "sandbox" else "control-plane"
    return _check(reply, origin)


def call(target: Target, endpoint: Endpoint[Req, M], request: Req | None = None) -> Plan[M]:
    """One sandbox-server route with its wire models: ``request`` in, the typed answer out. Each is
    encoded and parsed once, by pydantic (``to_json``, ``model_validate_json``): no Python dict on
    the way (~20 µs a call less than ``model_dump`` + ``json.dumps`` and ``json.loads`` +
    ``model_validate``)."""
    data = None if request is None else pydantic_core.to_json(request)
    reply = yield from sandbox_call(target, endpoint.method, endpoint.relative, None, seconds_for(request), data=data)
    return endpoint.response.model_validate_json(reply.body) if reply.body else endpoint.response.model_validate({})


def cp_call(method: str, path: str, body: Any = None, params: dict[str, str] | None = None,
            timeout: float | None = 60.0) -> Plan[Reply]:
    return _check((yield from request(Call(method, path, json=body, params=params, timeout=timeout))), "control-plane")


def cp_operation(method: str, path: str, body: Any, model: type[M], timeout: float) -> Plan[M]:
    """An asynchronous control-plane operation, awaited in one round trip when the server can."""
    reply = _check((yield from request(Call(method, path, json=body, headers={PREFER_HEADER: f"wait={timeout:g}"},
                                          timeout=timeout + SLACK))), "control-plane")
    if reply.status != 202:
        return model.model_validate(reply.json())
    data = reply.json()
    op_id = data.get("operation_id") or data.get("async_operation_id")
    op = yield from poll_operation(int(op_id), timeout + SLACK)
    if op.status != "SUCCEEDED":
        raise _failed_operation(op, forwarded=False)
    return model.model_validate_json(op.result or "{}")
