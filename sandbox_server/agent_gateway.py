"""An agent that brings its own loop: its harness runs in the sandbox, its model calls go out
through the sandbox server.

``POST /api/agent/start`` starts the harness (a tool process, bounded like a bash call: its own
session, capped output, a timeout that ends its tree) and opens its model endpoint: a listener
on a loopback port of the sandbox's own network namespace, so nothing outside the sandbox can
reach it and the sandbox reaches nothing through it but its caller. A call must carry the
episode's key (``Authorization: Bearer``, ``x-api-key`` or ``api-key``); another key is a 401.
Each call waits, unread by anyone else, until the caller collects it with
``POST /api/agent/exchange`` (which also delivers the answer to the previous one): the caller —
the trainer's env, through the control plane — is the model. A call not answered within
``call_timeout`` is a 504 to the agent. A caller on the sandbox's host can spare the control
plane's round trip: it listens on a Unix socket the sandbox can see (``exchange_socket``), the
server connects to it, proves itself with ``exchange_secret`` and serves the exchange route, and
only that, on the connection. A reset, a terminate or the next start closes the
endpoint and fails its calls (503); the harness ends with the tool processes.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from . import web
from .errors import ApiError
from .models import AgentState, ModelCall, ModelReply
from .process import ProcessResult

log = logging.getLogger(__name__)

MAX_CALL_BODY = 32 << 20  # a model request: messages and tools, never a file upload
MAX_WAITING_CALLS = 64  # calls the caller has not collected or answered yet; more is a 429 to the agent
MAX_WAITING_BYTES = 64 << 20  # and their bodies together: the server's memory is not the agent's to fill
LOOPBACK = "127.0.0.1"
CONNECT_BACK_TIMEOUT = 5.0
KEY_HEADERS = ("authorization", "x-api-key", "api-key")
# What of a call's headers the caller sees: what tells it how to answer (never the key).
FORWARDED_HEADERS = ("content-type", "accept", "anthropic-version", "anthropic-beta", "openai-beta",
                     "user-agent", "x-stainless-lang", "x-stainless-package-version")


def _error(status: int, message: str, kind: str) -> web.Response:
    # the shape both OpenAI's and Anthropic's clients read their errors from
    body = {"type": "error", "error": {"type": kind, "message": message, "code": status}}
    return web.json_response(body, status=status)


@dataclass
class _Call:
    model: ModelCall
    answer: asyncio.Future[web.Response]
    size: int = 0
    expired: bool = False  # its agent stopped waiting for it (call_timeout)

    def expire(self) -> None:
        self.expired = True
        self.answer.cancel()


@dataclass
class AgentGateway:
    """One episode's harness and model endpoint."""

    key: str
    call_timeout: float
    max_output: int
    _server: web.Server | None = None
    _waiting: deque[_Call] = field(default_factory=deque)
    _wakeup: asyncio.Future[None] | None = None
    _handed: dict[str, _Call] = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    _process: asyncio.Task[ProcessResult] | None = None
    _exited: asyncio.Event = field(default_factory=asyncio.Event)
    calls: int = 0
    port: int = 0
    _back: tuple[asyncio.BaseTransport, asyncio.Task[None]] | None = None

    async def open(self) -> int:
        app = _Endpoint(self)
        self._server = web.Server(app)
        await self._server.start(host=LOOPBACK, port=0)
        self.port = int(self._server.address.rsplit(":", 1)[1])
        return self.port

    async def connect_back(self, path: str, secret: str, app: web.App) -> str | None:
        """Connect to the caller's socket at ``path``, say ``secret``, then serve ``app`` (the
        exchange route) on that connection. Returns why it could not (the caller falls back to
        the control plane), or None."""
        try:
            self._back = await asyncio.wait_for(web.connect_unix(app, path, secret.encode() + b"\n"),
                                                CONNECT_BACK_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def run(self, start: Callable[[], Awaitable[ProcessResult]]) -> None:
        """Run the harness (``start()`` returns once it ended)."""
        self._process = asyncio.ensure_future(start())
        self._process.add_done_callback(self._on_exit)

    async def ended(self, timeout: float) -> None:
        """Return once the harness has ended (its processes were killed), or ``timeout`` passed."""
        if self._process is not None:
            await asyncio.wait({self._process}, timeout=timeout)

    def state(self) -> AgentState:
        task = self._process
        if task is None or not task.done():
            return AgentState(running=True, calls=self.calls)
        if task.cancelled() or task.exception() is not None:
            error = "cancelled" if task.cancelled() else f"{type(task.exception()).__name__}: {task.exception()}"
            return AgentState(running=False, exit_code=-1, stderr=f"the harness could not run: {error}",
                              calls=self.calls)
        result = task.result()
        return AgentState(running=False, exit_code=result.exit_code, timed_out=result.timed_out,
                          stdout=result.stdout.text(True), stderr=result.stderr.text(True), calls=self.calls)

    async def call_in(self, request: web.Request) -> web.Response:
        """A model call from the agent: held until the caller answers it."""
        presented = [request.headers.get(h, "") for h in KEY_HEADERS]
        presented = [p[7:] if p.lower().startswith("bearer ") else p for p in presented]
        if not any(p and hmac.compare_digest(p.encode(), self.key.encode()) for p in presented):
            return _error(401, "this model endpoint serves one episode: its key is in OPENAI_API_KEY / "
                               "ANTHROPIC_API_KEY of the harness", "authentication_error")
        if self._server is None:
            return _error(503, "the episode's model endpoint is closed", "unavailable")
        held = [*self._waiting, *self._handed.values()]
        if len(held) >= MAX_WAITING_CALLS or sum(c.size for c in held) + len(request.body) > MAX_WAITING_BYTES:
            return _error(429, f"too many model calls are waiting for an answer (at most {MAX_WAITING_CALLS}, "
                               f"{MAX_WAITING_BYTES >> 20} MiB together)", "rate_limit_error")
        self.calls += 1
        headers = {k: v for k, v in request.headers.items() if k in FORWARDED_HEADERS}
        path = request.path + (f"?{request.query_string}" if request.query_string else "")
        call = _Call(ModelCall(id=f"call-{next(self._ids)}", method=request.method, path=path, headers=headers,
                               body_base64=base64.b64encode(request.body).decode("ascii")),
                     asyncio.get_running_loop().create_future(), len(request.body))
        self._waiting.append(call)
        self._wake()
        # The answer awaited as it is, with a timer: wait_for over shield took two more turns of
        # the loop between the reply and the agent's answer.
        timer = asyncio.get_running_loop().call_later(self.call_timeout, call.expire)
        try:
            return await call.answer
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the connection's own end, not the call's
            if call.expired:
                self._handed.pop(call.model.id, None)
                return _error(504, f"no answer from the policy within {self.call_timeout:g} s", "timeout")
            return _error(503, "the episode's model endpoint was closed", "unavailable")
        finally:
            timer.cancel()

    def answer(self, reply: ModelReply) -> None:
        call = self._handed.pop(reply.call_id, None)
        if call is None:
            raise ApiError.for_status(409, f"no model call {reply.call_id!r} is waiting for an answer (answered "
                                           "already, timed out, or of an earlier episode)")
        try:
            body = base64.b64decode(reply.body_base64, validate=True)
        except ValueError:
            self._handed[reply.call_id] = call
            raise ApiError.for_status(422, "reply.body_base64 is not valid base64") from None
        if not call.answer.done():
            call.answer.set_result(web.Response(body, status=reply.status, content_type=reply.content_type))

    async def next_call(self, wait: float) -> ModelCall | None:
        """The agent's next call, or None once it exited (and left none) or ``wait`` ran out."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            while self._waiting:
                call = self._waiting.popleft()
                if not call.answer.done():  # else its agent gave up on it (timeout, closed connection)
                    self._handed[call.model.id] = call
                    return call.model
            left = deadline - loop.time()
            if self._exited.is_set() or left <= 0:
                return None
            self._wakeup = wakeup = loop.create_future()
            timer = loop.call_at(deadline, _wake, wakeup)
            try:
                await wakeup
            finally:
                self._wakeup = None
                timer.cancel()

    def _on_exit(self, _: asyncio.Future[ProcessResult]) -> None:
        self._exited.set()
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None:
            _wake(self._wakeup)

    async def close(self) -> None:
        server, self._server = self._server, None
        for call in [*self._handed.values(), *self._waiting]:
            if not call.answer.done():
                call.answer.cancel()
        self._handed.clear()
        self._waiting.clear()
        self._wake()
        if server is not None:
            await server.close()
        if self._back is not None:
            transport, serving = self._back
            self._back = None
            transport.close()
            serving.cancel()
        # the harness itself ends with the tool processes (every caller ends them next)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Endpoint(web.App):
    """Every path of the listener is a model call (``/v1/chat/completions``, ``/v1/messages``,
    ``/v1/responses``…): the caller decides what it means."""

    def __init__(self, gateway: AgentGateway) -> None:
        super().__init__(client_max_size=MAX_CALL_BODY, on_error=_on_error)
        self.gateway = gateway

    async def dispatch(self, request: web.Request) -> web.Response:
        try:
            return await self.gateway.call_in(request)
        except Exception as exc:  # noqa: BLE001 - the agent gets an answer, never a dropped connection
            return _on_error(request, exc)


def _on_error(request: web.Request, exc: BaseException) -> web.Response:
    if isinstance(exc, ApiError):
        return _error(exc.status, exc.message, exc.kind)
    log.error("model call %s %s failed", request.method, request.path, exc_info=exc)
    return _error(500, f"the sandbox's model endpoint failed: {type(exc).__name__}: {exc}", "server_error")
