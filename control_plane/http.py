"""aiohttp plumbing of the control plane: JSON bodies in and out, errors as JSON, request logs."""

from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from aiohttp import web
from pydantic import BaseModel, ValidationError

from sandbox_server.http import parse_model, summarize, validation_items

from .body_budget import SMALL, BodyBudget, BodyReservation
from .errors import ApiError, Unauthorized, Unprocessable, render
from .tenants import SINGLE, TENANT

if TYPE_CHECKING:
    from .startup import Shutdown

log = logging.getLogger("control_plane.http")
M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def read_model(request: web.Request, model: type[M]) -> M:
    return parse_model(await request.read(), model)


async def read_body(request: web.Request, max_body: int) -> bytes | bytearray:
    """The body, read as it arrives into one growing buffer: unlike ``request.read()`` no final
    copy of the whole (200 MB that block the event loop), and the socket is read no faster than
    the body is taken."""
    if request.content_length is not None and request.content_length < (1 << 20):
        return await request.read()
    body = bytearray()
    async for chunk in request.content.iter_any():
        body += chunk
        if len(body) > max_body:
            raise web.HTTPRequestEntityTooLarge(max_size=max_body, actual_size=len(body))
    return body


STREAMED_PREFIX = "/api/uploads/"


def streamed_to_disk(request: web.Request) -> bool:
    """An upload's body goes to a file as it arrives, under its own limit (``uploads.py``): neither
    the body limit nor the memory budget of bodies read whole applies to it."""
    return request.method == "PUT" and request.path.startswith(STREAMED_PREFIX)


def json_response(model: BaseModel, status: int = 200) -> web.Response:
    return web.Response(
        body=model.model_dump_json(by_alias=True).encode(), status=status, content_type="application/json"
    )


def error_response(error: ApiError, headers: dict[str, str] | None = None) -> web.Response:
    """``error`` as the answer (``errors.render``, the one renderer of both servers)."""
    return web.Response(body=render(error), status=error.status, content_type="application/json", headers=headers)


_HTTP_HINTS = {
    404: "no such endpoint; GET /openapi.json lists them",
    405: "method not allowed on this endpoint; GET /openapi.json lists them",
    413: "request body too large",
}


RESERVATION = web.RequestKey("body_reservation", BodyReservation)


def middleware(service: str, observe: Callable[[web.Request, int, float], None] | None, max_body: int,
               authenticate: Callable[[Mapping[str, str]], str] | None, shutdown: Shutdown,
               budget: BodyBudget) -> Callable:
    """What every request goes through, in one layer (a forward paid each of four layers: a
    coroutine, aiohttp's wrapping, a lookup of the request's app), in this order:

    * its failures as JSON errors, and one log line (never bodies): an ``ApiError``
      (``errors.py``) answers its own status, an HTTP failure of aiohttp's (no such route, 405,
      413) the error of its status, anything else a 500 that says it is a bug;
      ``observe(request, status, seconds)`` sees every request with the status answered (metrics);
    * a body declared larger than ``max_body`` refused before any of it is read (aiohttp alone
      would wait for the bytes, and only then say 413);
    * ``authenticate`` (the request's tenant, ``tenant_of``, or ``Unauthorized``) on every route but
      ``/health``;
    * ``shutdown``: 503 once the control plane is stopping, and calls in flight cut off then (after
      auth: an unauthenticated caller learns nothing);
    * the body's reservation in ``budget`` before anything reads it (a call waiting for it is cut
      off by a shutdown too), released when the handler returns unless the handler took it over
      (``request.pop(RESERVATION)``).
    """

    @web.middleware
    async def handle(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        try:
            streamed = streamed_to_disk(request)
            declared = request.content_length
            if declared is not None and declared > max_body and not streamed:
                raise web.HTTPRequestEntityTooLarge(max_size=max_body, actual_size=declared)
            if authenticate is not None and request.path != "/health":
                request[TENANT] = authenticate(request.headers)
            reservation: BodyReservation | None = None
            try:
                with shutdown.in_flight():
                    size = max_body if declared is None else declared
                    if size >= SMALL and request.body_exists and not streamed:
                        request[RESERVATION] = reservation = await budget.reserve(size)
                    response = await handler(request)
            finally:
                if request.get(RESERVATION) is reservation and reservation is not None:
                    reservation.release()
            status = response.status
            return response
        except ApiError as exc:
            status = exc.status
            return error_response(exc)
        except web.HTTPException as exc:
            status = exc.status
            if exc.status < 400:
                raise
            hint = _HTTP_HINTS.get(exc.status, exc.reason)
            message = f"{request.method} {request.path}: {hint}"
            if exc.status == 413:
                message = f"{request.method} {request.path}: {exc.text or hint}; send smaller chunks"
            return error_response(ApiError.for_status(exc.status, message))
        except Exception as exc:  # a bug: say so, keep the server up
            return error_response(unexpected(service, request.method, request.path, exc))
        finally:
            seconds = time.perf_counter() - started
            if observe is not None:  # after the answer is written: metrics cost the caller nothing
                asyncio.get_running_loop().call_soon(observe, request, status, seconds)
            log_request(request.method, request.path, status, seconds)

    return handle


def unexpected(service: str, method: str, path: str, exc: Exception) -> ApiError:
    """A failure no handler meant (a bug), logged: the 500 that says so, the server kept up."""
    log.exception("unhandled error in %s %s", method, path)
    return ApiError(f"{service} hit an unexpected {type(exc).__name__}: {exc}. This is a bug; please report it.")


def log_request(method: str, path: str, status: int, seconds: float) -> None:
    """One line per request (never bodies)."""
    if log.isEnabledFor(logging.INFO):
        log.info("request", extra={"method": method, "path": path, "status": status, "ms": round(seconds * 1000, 2)})


def basic_auth(credentials: tuple[str, str], hint: str) -> Callable[[Mapping[str, str]], str]:
    """HTTP Basic auth with ``credentials``: the one tenant (``SINGLE``) of a request's headers, or
    ``Unauthorized``; ``hint`` says where the credentials are."""
    user, password = credentials
    expected = ("Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()).encode()

    def check(headers: Mapping[str, str]) -> str:
        if not hmac.compare_digest(headers.get("Authorization", "").encode(), expected):
            raise Unauthorized(f"missing or wrong credentials: send HTTP Basic auth, {hint} "
                               "(idegym-client: IDEGYM_AUTH_USERNAME / IDEGYM_AUTH_PASSWORD)")
        return SINGLE

    return check


# -- request parts --------------------------------------------------------------------------------


def query_model(request: web.Request, model: type[BaseModel]) -> Any:
    try:
        return model.model_validate(dict(request.query))
    except ValidationError as exc:
        items = validation_items(exc, prefix="query")
        raise Unprocessable(summarize(items), items) from exc


def path_int(request: web.Request, name: str) -> int:
    return int_param(request.match_info[name], name)


def int_param(raw: str, name: str) -> int:
    """A path parameter that must be an integer (422 when it is not one)."""
    try:
        value = int(raw)
    except ValueError:
        raise Unprocessable.field(["path", name], "must be an integer", raw, "int_parsing") from None
    if not -(1 << 63) <= value < 1 << 63:  # no row has such an id, and SQLite could not even look
        raise Unprocessable.field(["path", name], "is out of range (a 64-bit integer is expected)", raw)
    return value


def path_uuid(request: web.Request, name: str) -> UUID:
    return uuid_param(request.match_info[name], name)


def uuid_param(raw: str, name: str) -> UUID:
    """A path parameter that must be a UUID (422 when it is not one)."""
    try:
        return UUID(raw)
    except ValueError:
        raise Unprocessable.field(["path", name], "must be a UUID", raw, "uuid_parsing") from None
