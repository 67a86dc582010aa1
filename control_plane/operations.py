"""Asynchronous operations: the 202-and-poll protocol of ``specs/control-plane-api.yaml``.

An operation is a database row (the request history) and, while it runs, an asyncio task. It
ends SUCCEEDED with the serialized success model, or FAILED/CANCELLED with a serialized
``ErrorResponse`` (an ``ApiError`` raised by the work gives its status and message) — never
with a null result, and never parked in FINISHED_BY_WATCHER (the published client would poll it
until its deadline).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pydantic import BaseModel

from .errors import ApiError
from .models import AsyncOperationStatus, AsyncOperationType, ErrorResponse
from .store import SQLiteStore, StoreError

log = logging.getLogger(__name__)

RESTART_MESSAGE = (
    "the control plane restarted while this operation was in progress; it was cut off and did not "
    "finish. Check the server's status and retry the request."
)


@dataclass
class OperationOutcome:
    status: AsyncOperationStatus
    result: str
    touch_server: int | None = None

    @classmethod
    def success(cls, model: BaseModel, touch_server: int | None = None) -> OperationOutcome:
        return cls(AsyncOperationStatus.SUCCEEDED, model.model_dump_json(), touch_server)

    @classmethod
    def failure(cls, status_code: int, body: str, headers: dict[str, str] | None = None,
                touch_server: int | None = None) -> OperationOutcome:
        status = AsyncOperationStatus.CANCELLED if status_code == 499 else AsyncOperationStatus.FAILED
        return cls(status, ErrorResponse(status_code=status_code, headers=headers or {}, body=body).model_dump_json(),
                   touch_server)


Work = Callable[[], Awaitable[BaseModel | OperationOutcome]]


class Operations:
    def __init__(self, store: SQLiteStore, pod_name: str | None) -> None:
        self.store = store
        self.pod_name = pod_name
        self._ends: dict[int, asyncio.Future[OperationOutcome]] = {}
        self._tasks: set[asyncio.Task] = set()

    def recover(self) -> int:
        """Fail every operation a previous run left unfinished. Returns how many."""
        rows = self.store.unfinished_operations()
        for row in rows:
            self.store.finish_operation(
                row.id, AsyncOperationStatus.FAILED,
                ErrorResponse(status_code=500, headers={}, body=RESTART_MESSAGE).model_dump_json(),
            )
        return len(rows)

    def submit(self, kind: AsyncOperationType, request: str | None, work: Work, *, client_id: str | None = None,
               server_id: int | None = None) -> int:
        """Record an operation IN_PROGRESS and run ``work`` in the background. Returns its id.
        The work starts at the loop's next turn: one commit, where SCHEDULED and then IN_PROGRESS
        took two of a fork's six."""
        op_id = self.store.add_operation(kind, request, client_id, server_id, AsyncOperationStatus.IN_PROGRESS,
                                         self.pod_name)
        self._ends[op_id] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._run(op_id, work), name=f"operation-{op_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return op_id

    async def _run(self, op_id: int, work: Work) -> None:
        outcome: OperationOutcome
        try:
            value = await work()
            outcome = value if isinstance(value, OperationOutcome) else OperationOutcome.success(value)
        except ApiError as exc:  # the work's failure: the operation ends with its status and message
            outcome = OperationOutcome.failure(exc.status, exc.message)
        except asyncio.CancelledError:
            outcome = OperationOutcome.failure(499, "the operation was cancelled (control plane shutting down)")
            self._finish(op_id, outcome)
            raise
        except Exception as exc:  # a bug: record it instead of leaving the operation hanging
            log.exception("operation %s failed unexpectedly", op_id)
            outcome = OperationOutcome.failure(500, f"internal error: {type(exc).__name__}: {exc}")
        self._finish(op_id, outcome)

    def _finish(self, op_id: int, outcome: OperationOutcome) -> None:
        try:
            self.store.finish_operation(op_id, outcome.status, outcome.result, outcome.touch_server)
        except StoreError:
            log.exception("could not record the end of operation %s", op_id)
        end = self._ends.pop(op_id, None)
        if end is not None:
            end.set_result(outcome)

    async def outcome(self, op_id: int, timeout: float) -> OperationOutcome | None:
        """The outcome of the operation ``op_id`` submitted here once it ends, waited for up to
        ``timeout`` seconds (None: it is still running); a waiter that came late reads it from the
        store. The outcome is what the store records, handed over without reading it back."""
        end = self._ends.get(op_id)
        if end is None:
            row = self.store.get_operation(op_id)
            return None if row is None or row.result is None else OperationOutcome(row.status, row.result)
        try:
            return await asyncio.wait_for(asyncio.shield(end), timeout)
        except TimeoutError:
            return None

    async def shutdown(self, grace: float = 5.0) -> None:
        """Let running operations finish for ``grace`` seconds, then cancel the rest (CANCELLED)."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)
