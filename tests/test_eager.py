"""Tasks a callback steps on at once (``sandbox_server/eager.py``), on asyncio's loop and uvloop's:
the awaiting code runs in the callback that completes its future, as the task, and the task goes
on from there; a cancellation, a failure or a running task leave the step to the task's wake-up.

Can fail (on main the module is not there; each of these seen failing with the module changed): a
step taken early without the task entered (no current task: ``Shutdown.in_flight`` asserts one),
and a cancellation after such a step that leaves the future the coroutine awaits now uncancelled
(as a task's cancel would not)."""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from sandbox_server import eager

LOOPS = ["asyncio", "uvloop"]
NAME: contextvars.ContextVar[str] = contextvars.ContextVar("NAME", default="")


def _run(kind: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    if kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        uvloop.run(main())
    else:
        asyncio.run(main())


def _in(name: str) -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == name:
            return True
        frame = frame.f_back
    return False


@pytest.mark.parametrize("kind", LOOPS)
def test_the_awaiting_code_runs_in_the_callback_that_answers_as_its_task(kind: str) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        first, second = loop.create_future(), loop.create_future()
        seen: list[tuple[str, bool, bool, str]] = []

        async def work() -> str:
            NAME.set("work")
            seen.append(("first step", _in("start"), asyncio.current_task() is made[0], NAME.get()))
            await first
            seen.append(("after first", _in("answer"), asyncio.current_task() is made[0], NAME.get()))
            await second
            seen.append(("after second", _in("answer"), asyncio.current_task() is made[0], NAME.get()))
            return "done"

        made: list[asyncio.Task[str]] = []

        def start() -> None:
            made.append(eager.task(work()))
            eager.resume(made[0])  # its first step, now
            assert [s[0] for s in seen] == ["first step"]

        def answer(future: asyncio.Future[int]) -> None:
            future.set_result(1)
            eager.resume(made[0])

        loop.call_soon(start)
        await asyncio.sleep(0.01)
        loop.call_soon(answer, first)
        await asyncio.sleep(0.01)
        loop.call_soon(answer, second)
        assert await made[0] == "done"
        assert seen == [("first step", True, True, "work"), ("after first", True, True, "work"),
                        ("after second", True, True, "work")]
        assert NAME.get() == ""  # the task's context, not the caller's

    _run(kind, main)


@pytest.mark.parametrize("kind", LOOPS)
def test_a_task_cancelled_after_a_step_taken_early_is_cancelled_where_it_is_now(kind: str) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        first, second = loop.create_future(), loop.create_future()
        where: list[str] = []

        async def work() -> None:
            await first
            try:
                await second
            except asyncio.CancelledError:
                where.append("second")
                raise

        made = eager.task(work())
        await asyncio.sleep(0)  # its own first step: it waits on ``first``

        def answer_then_cancel() -> None:
            first.set_result(None)
            eager.resume(made)  # now at ``second``; the task still waits for its wake-up
            made.cancel()

        loop.call_soon(answer_then_cancel)
        with pytest.raises(asyncio.CancelledError):
            await made
        assert where == ["second"] and second.cancelled()

    _run(kind, main)


@pytest.mark.parametrize("kind", LOOPS)
def test_a_step_taken_early_that_ends_the_coroutine_ends_the_task_with_it(kind: str) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future(), loop.create_future()]

        async def work(future: asyncio.Future[None], fail: bool) -> str:
            await future
            if fail:
                raise ValueError("failed")
            return "ended"

        ends, fails = eager.task(work(futures[0], False)), eager.task(work(futures[1], True))
        await asyncio.sleep(0)

        def answer() -> None:
            for future, made in zip(futures, (ends, fails), strict=True):
                future.set_result(None)
                eager.resume(made)

        loop.call_soon(answer)
        assert await ends == "ended"
        with pytest.raises(ValueError, match="failed"):
            await fails

    _run(kind, main)


@pytest.mark.parametrize("kind", LOOPS)
def test_no_step_is_taken_early_for_a_failed_future_a_cancelled_task_a_plain_one_or_inside_a_task(kind: str) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        stepped: list[str] = []

        async def work(name: str, future: asyncio.Future[None]) -> None:
            try:
                await future
            finally:
                stepped.append(name if _in("resume") else "")

        def made(name: str, make: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]) -> tuple[
                asyncio.Task[None], asyncio.Future[None]]:
            future = loop.create_future()
            return make(work(name, future)), future

        failed, failed_future = made("failed", eager.task)
        cancelled, cancelled_future = made("cancelled", eager.task)
        plain, plain_future = made("plain", loop.create_task)
        inner, inner_future = made("inside a task", eager.task)
        await asyncio.sleep(0)

        def answer() -> None:
            failed_future.set_exception(ValueError("no"))
            eager.resume(failed)
            cancelled_future.set_result(None)
            cancelled.cancel()
            eager.resume(cancelled)
            plain_future.set_result(None)
            eager.resume(plain)

        loop.call_soon(answer)
        await asyncio.sleep(0)
        inner_future.set_result(None)
        eager.resume(inner)  # this test's own task runs
        assert stepped == []
        await asyncio.gather(failed, cancelled, plain, inner, return_exceptions=True)
        assert stepped == ["", "", "", ""]

    _run(kind, main)
