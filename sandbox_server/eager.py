"""Tasks that a callback may step on at once: no loop turn between an answer and the code awaiting it.

A future completed in a protocol's callback (a request's bytes, the spawner's message, a sandbox's
reply in the control plane) wakes the task awaiting it only at the loop's next turn, through a
scheduled wake-up. An isolated tool call crosses four such hops (two in the sandbox server, two in
the control plane), each run with caches the tool has just used.

``task()`` makes a task whose coroutine can also be stepped from a callback (``resume``): the step
runs there and then, as the task (the current task, in its context), and what it yields (the next
future it awaits, or its end) is handed to the task at its own next step, which its wake-up makes
as before. Only a step that the task would take next with nothing thrown in is taken early: a task
being cancelled, awaiting a future that failed or was cancelled, or one stepped early already is
left to its wake-up. Python 3.12's eager tasks take the first step only, and 3.11 has none.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextvars
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_FRESH = object()  # the task has not taken its first step
_NOTHING = object()
_END = object()  # a step taken early ended the coroutine


class _Steppable(collections.abc.Coroutine):
    """A coroutine as its task drives it, with the steps ``resume`` took ahead handed over."""

    __slots__ = ("_coro", "_context", "_waits", "_ahead", "_end")

    def __init__(self, coro: Coroutine[Any, Any, Any], context: contextvars.Context) -> None:
        self._coro = coro
        self._context = context
        self._waits: Any = _FRESH  # what the task was last handed (the future it waits on)
        self._ahead: Any = _NOTHING  # what a step taken early yielded, until the task takes it
        self._end: BaseException | None = None  # how a step taken early ended the coroutine

    def send(self, value: Any) -> Any:
        if self._ahead is not _NOTHING:
            return self._hand_over()
        self._waits = yielded = self._coro.send(value)
        return yielded

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if self._ahead is not _NOTHING:
            # The task is cancelled after a step taken early: the cancellation goes where the
            # coroutine is now, and the future it awaits there is cancelled, as a task's would be.
            ahead, self._ahead = self._ahead, _NOTHING
            if ahead is _END:
                self._ahead = _END
                return self._hand_over()
            if isinstance(ahead, asyncio.Future):
                ahead.cancel()
        self._waits = yielded = self._coro.throw(typ) if val is None and tb is None else self._coro.throw(typ, val, tb)
        return yielded

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Any:
        return self._coro.__await__()

    def _hand_over(self) -> Any:
        ahead, self._ahead = self._ahead, _NOTHING
        if ahead is _END:
            end, self._end = self._end, None
            assert end is not None
            raise end
        self._waits = ahead
        return ahead

    def step(self, task: asyncio.Task[Any]) -> None:
        loop = task.get_loop()
        asyncio.tasks._enter_task(loop, task)
        try:
            self._ahead = self._context.run(self._coro.send, None)
        except BaseException as exc:  # noqa: BLE001 - the task's own step raises it (its result, or its failure)
            self._ahead, self._end = _END, exc
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            asyncio.tasks._leave_task(loop, task)


def task(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task of ``coro`` on the running loop that ``resume`` may step on (its first step too)."""
    context = contextvars.copy_context()
    return asyncio.get_running_loop().create_task(_Steppable(coro, context), context=context)


def resume(task: asyncio.Task[Any] | None) -> None:
    """Take ``task``'s next step now, in this callback, when it is one of ``task()``'s, no other task
    is running, it is not being cancelled, and the future it awaits has its result (else its
    wake-up takes the step, as for any task)."""
    if task is None or task.done() or task.cancelling():
        return
    coro = task.get_coro()
    if not isinstance(coro, _Steppable) or coro._ahead is not _NOTHING:
        return
    waits = coro._waits
    if waits is not _FRESH and not (isinstance(waits, asyncio.Future) and waits.done() and not waits.cancelled()
                                    and waits.exception() is None):
        return
    if asyncio.current_task(task.get_loop()) is not None:
        return
    coro.step(task)
