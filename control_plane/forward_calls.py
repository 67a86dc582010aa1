"""Forwarded calls: a client's request passed to its sandbox and recorded as an operation.

Without ``Prefer: wait`` a forward is an asynchronous operation (202 with its id; the client
polls). With ``Prefer: wait=N`` (RFC 7240) the sandbox's own answer comes back in the same
response once it arrives within N seconds, and the call is still recorded: its id reserved
before the answer, the record written after it with the others of the same ``RECORD_DELAY`` in
one transaction (sooner when what they hold reaches ``HELD_LIMIT``), or, when it takes longer, as
a running operation the client can poll. Env values of bash calls are never stored.

A record waiting to be written holds what makes it: the call and the sandbox's answer when both
bodies are small, else only what the history keeps of them (made at once), so the bodies held
for the history never exceed ``HELD_LIMIT`` plus one record, and a large body is let go as soon
as it is answered (its reservation in ``body_budget`` ends then too).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from sandbox_server import routes
from sandbox_server.http import Reply

from .backends.base import SandboxAddress
from .constants import PREFER_HEADER
from .metrics import Metrics
from .models import AsyncOperationStatus, AsyncOperationType, ForwardRequestResponse
from .operations import OperationOutcome
from .sandbox_http import ForwardError, PendingReply
from .service import ControlPlane
from .store import now_ms

log = logging.getLogger(__name__)

PREFER_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*(\d+(?:\.\d+)?)", re.IGNORECASE)
MAX_WAIT = 3600.0
STORED_BODY_LIMIT = 64 << 10
UNSTORED_HEADERS = ("authorization", "cookie", "host")
# Inline answers' records wait this long at most, to be written together: a transaction costs
# the loop about as much as a few records, and 0.25 s gathers ~100 back-to-back calls where 0.05 s
# gathered ~20. A control plane killed with SIGKILL loses the records of its last such interval.
RECORD_DELAY = 0.25
HELD_LIMIT = 1 << 20  # bytes of bodies the waiting records may hold before they are written at once
_EMPTY_ENV = re.compile(rb'"env"\s*:\s*(?:\{\s*\}|null)')


def _may_name_env_values(body: bytes | bytearray) -> bool:
    """Whether a bash call's body may hold env values: only parsing tells when it has an escape
    (a key written ``"\\u0065nv"`` is ``env`` too) or names ``"env"`` other than once, empty."""
    if b"\\" in body:
        return True
    named = body.count(b'"env"')
    return named > 1 or (named == 1 and _EMPTY_ENV.search(body) is None)


def prefer_wait(headers: Mapping[str, str]) -> float | None:
    """Seconds of ``Prefer: wait=N`` (capped), or None when the client did not ask to wait."""
    prefer = headers.get(PREFER_HEADER)
    if not prefer:
        return None
    match = PREFER_WAIT.search(prefer)
    return min(float(match.group(1)), MAX_WAIT) if match else None


@dataclass
class ForwardedCall:
    """One forward as the handler received it."""

    client_id: UUID
    server_id: int
    method: str
    path: str  # relative to the sandbox root, query included
    headers: Mapping[str, str]
    body: bytes | bytearray

    def record(self, target: str) -> str:
        """The operation's stored request (secrets masked, body truncated)."""
        # Only what is stored is decoded: a 200 MB body would be copied whole otherwise.
        text = self.body[:STORED_BODY_LIMIT + 4].decode("utf-8", errors="replace")
        if self.path.split("?", 1)[0].rstrip("/").endswith(routes.BASH.relative) and _may_name_env_values(self.body):
            try:  # env values are secrets: never stored
                data = json.loads(self.body)
                if isinstance(data, dict) and isinstance(data.get("env"), dict):
                    data["env"] = {k: "***" for k in data["env"]}
                text = json.dumps(data)
            except (ValueError, RecursionError):  # not JSON (the sandbox says 422): it may still hold values
                text = "[a bash call naming env that is not valid JSON: not kept in the request history]"
        if len(text) > STORED_BODY_LIMIT:
            text = text[:STORED_BODY_LIMIT] + f"... [{len(self.body)} bytes; truncated in the request history]"
        headers = {k: v for k, v in self.headers.items() if k.lower() not in UNSTORED_HEADERS}
        return json.dumps({"method": self.method, "path": self.path, "headers": headers, "body": text,
                           "target_url": target, "server_id": self.server_id})


@dataclass
class Answer:
    """What the handler answers: 202 for ``operation_id`` (``value`` None), else ``value`` at once."""

    operation_id: int
    value: Reply | ForwardError | None = None
    waited: float | None = None

    @property
    def accepted(self) -> ForwardRequestResponse | None:
        return ForwardRequestResponse(async_operation_id=self.operation_id) if self.value is None else None


class Forwards:
    """Runs forwarded calls for one control plane, counting them in ``metrics``."""

    def __init__(self, cp: ControlPlane, metrics: Metrics) -> None:
        self.cp = cp
        self.metrics = metrics
        self._flush: asyncio.Handle | None = None
        self._flush_soon = False

    async def forward(self, call: ForwardedCall, endpoint: SandboxAddress, release: Callable[[], None] | None = None
                      ) -> Answer:
        """Forward ``call`` to ``endpoint`` (``ControlPlane.forward_endpoint`` of its server);
        ``release`` (the body's budget reservation) is called once the sandbox has answered."""
        cp = self.cp
        wait = prefer_wait(call.headers)
        if wait is None:
            async def work() -> OperationOutcome:
                try:
                    pending = cp.forwarder.start(endpoint, call.method, call.path, call.headers, call.body)
                    started = time.perf_counter()
                    await pending.wait()
                    return self._outcome(call, self._settled(call, pending, started))
                finally:
                    if release is not None:
                        release()

            op = cp.ops.submit(AsyncOperationType.FORWARD_REQUEST, call.record(endpoint.base_url), work,
                               client_id=str(call.client_id), server_id=call.server_id)
            return Answer(op)
        started_ms, started = now_ms(), time.perf_counter()
        loop = asyncio.get_running_loop()
        settled = loop.create_future()  # the answer, or ``wait`` seconds

        def wake() -> None:
            if not settled.done():
                settled.set_result(None)

        try:
            # woken in the very turn the answer arrives: a callback of the reply's future would
            # wake it a turn later
            pending = cp.forwarder.start(endpoint, call.method, call.path, call.headers, call.body, on_end=wake)
        except BaseException:
            if release is not None:
                release()
            raise
        if release is not None:
            pending.future.add_done_callback(lambda _: release())
        if not pending.future.done():
            timer = loop.call_later(wait, wake)
            try:
                await settled  # never cancels the forward: a cut-off wait leaves it running
            finally:
                timer.cancel()
        if not pending.future.done():
            op_id = cp.store.add_operation(AsyncOperationType.FORWARD_REQUEST, call.record(endpoint.base_url),
                                           str(call.client_id), call.server_id, AsyncOperationStatus.IN_PROGRESS,
                                           cp.config.pod_name)

            def finish(future: asyncio.Future) -> None:
                outcome = (OperationOutcome.failure(499, "cancelled") if future.cancelled()
                           else self._outcome(call, self._settled(call, pending, started)))
                cp.store.finish_operation(op_id, outcome.status, outcome.result, outcome.touch_server)

            pending.future.add_done_callback(finish)
            return Answer(op_id)
        value = self._settled(call, pending, started)
        op_id = cp.store.reserve_operation_id()
        finished_ms = now_ms()

        def record() -> dict[str, Any]:
            outcome = self._outcome(call, value, cp.config.inline_result_limit)
            return dict(request_type=AsyncOperationType.FORWARD_REQUEST, request=call.record(endpoint.base_url),
                        client_id=str(call.client_id), server_id=call.server_id, pod=cp.config.pod_name,
                        started=started_ms, status=outcome.status, result=outcome.result,
                        touch_server=outcome.touch_server, op_id=op_id, finished=finished_ms)

        held = len(call.body) + (len(value.body) if isinstance(value, Reply) else 0)
        if held > STORED_BODY_LIMIT:  # what the history keeps of it, made now: the bodies are let go
            made = record()
            held = len(made["request"]) + len(made["result"])
            cp.store.defer_record(lambda: made, held)
        else:
            cp.store.defer_record(record, held)
        self._schedule_flush()
        return Answer(op_id, value, wait)

    def _schedule_flush(self) -> None:
        """Write the waiting records within ``RECORD_DELAY``, or at the loop's next turn (after
        this answer is sent) once what they hold reaches ``HELD_LIMIT``."""
        soon = self.cp.store.deferred_bytes >= HELD_LIMIT
        if self._flush is not None and (self._flush_soon or not soon):
            return
        if self._flush is not None:
            self._flush.cancel()
        loop = asyncio.get_running_loop()
        self._flush = loop.call_soon(self._write) if soon else loop.call_later(RECORD_DELAY, self._write)
        self._flush_soon = soon

    def _write(self) -> None:
        self._flush = None
        self.cp.store.flush()

    def _settled(self, call: ForwardedCall, pending: PendingReply, started: float) -> Reply | ForwardError:
        """The reply or the failure of an ended forward, counted in the metrics at the loop's next
        turn: not while the answer is being made."""
        seconds = time.perf_counter() - started
        try:
            reply = pending.result()
        except ForwardError as exc:
            asyncio.get_running_loop().call_soon(self.metrics.forward, exc.status, seconds)
            if exc.status == 410:
                self.cp.spawn(self.cp.check_sandbox(call.server_id))  # find out now whether the sandbox crashed
            return exc
        asyncio.get_running_loop().call_soon(self.metrics.forward, reply.status, seconds)
        return reply

    @staticmethod
    def _outcome(call: ForwardedCall, value: Reply | ForwardError,
                 inline_limit: int | None = None) -> OperationOutcome:
        """The operation's stored result. A body already answered inline is not kept above the limit."""
        if isinstance(value, ForwardError):
            return OperationOutcome.failure(value.status, value.message)
        touch = call.server_id if value.status < 500 else None
        if inline_limit is not None and len(value.body) > inline_limit:  # not decoded only to be dropped
            text = f"[{len(value.body)} bytes answered inline; not kept in the request history]"
        else:
            text = value.text
        if value.status < 400:
            answer = ForwardRequestResponse(status_code=value.status, headers=dict(value.headers), body=text)
            return OperationOutcome.success(answer, touch)
        return OperationOutcome.failure(value.status, text, dict(value.headers), touch)
