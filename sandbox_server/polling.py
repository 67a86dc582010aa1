"""Waiting for a condition that has no event to wait on: look again soon, then less often.

Most conditions we poll (a killed process gone, a cgroup empty, a group frozen) hold after the
first look or within a millisecond; a few take longer. Starting at half a millisecond and
doubling up to a cap answers the quick ones at once without spinning on the slow ones.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator

FIRST_PAUSE = 0.0005
MAX_PAUSE = 0.02


def pauses(first: float = FIRST_PAUSE, cap: float = MAX_PAUSE):
    """The pause before each next look: ``first``, doubling up to ``cap``."""
    pause = first
    while True:
        yield pause
        pause = min(pause * 2, cap)


def _looks(done: Callable[[], bool], timeout: float, first: float, cap: float) -> Generator[float, None, bool]:
    """Yields each pause to sleep; returns ``done()`` once it holds or ``timeout`` has passed."""
    deadline = time.monotonic() + timeout
    for pause in pauses(first, cap):
        if done():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return done()
        yield min(pause, left)
    raise AssertionError("unreachable")  # pragma: no cover


def wait_until(done: Callable[[], bool], timeout: float, *, first: float = FIRST_PAUSE,
               cap: float = MAX_PAUSE) -> bool:
    """Block until ``done()`` is true or ``timeout`` seconds passed; returns the last ``done()``."""
    looks = _looks(done, timeout, first, cap)
    while True:
        try:
            time.sleep(next(looks))
        except StopIteration as end:
            return end.value


async def until(done: Callable[[], bool], timeout: float, *, first: float = FIRST_PAUSE,
                cap: float = MAX_PAUSE) -> bool:
    """``wait_until`` for coroutines: sleeps without blocking the event loop."""
    looks = _looks(done, timeout, first, cap)
    while True:
        try:
            await asyncio.sleep(next(looks))
        except StopIteration as end:
            return end.value
