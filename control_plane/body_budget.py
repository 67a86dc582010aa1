"""A budget for the request bodies the control plane holds in memory at once.

A body is read whole before it is handled (parsed, or passed to a sandbox), and a large one is
copied on its way (aiohttp's read, the request encoded for the sandbox, the socket's send
buffer). Unbounded, four concurrent 200 MB forwards took the control plane to 1.7 GiB (915 MB
stayed) and stalled every other call for hundreds of milliseconds. So each request with a body
of ``SMALL`` bytes or more first reserves ``COPIES`` times its size (declared, or the largest
allowed when it is chunked) and waits, unread, until that fits; a body that could never fit is
a 413, one still waiting after ``wait`` seconds a 503. A forward's reservation lasts until its
sandbox has answered. Once the large bodies are gone, freed memory goes back to the system.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import ctypes.util
import logging

from .errors import PayloadTooLarge, Unavailable

log = logging.getLogger(__name__)

COPIES = 3  # a body's bytes held at once at the worst moment of its way through
SMALL = 64 << 10  # smaller bodies are not counted: the hot path of a tool call pays nothing
TRIM_AFTER = 32 << 20  # released this much: give freed heap back to the system (glibc)


class BodyReservation:
    def __init__(self, budget: BodyBudget, size: int) -> None:
        self.budget = budget
        self.size = size
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.budget._release(self.size)


class BodyBudget:
    """``limit`` bytes shared by all requests; first come, first served."""

    def __init__(self, limit: int, wait: float) -> None:
        self.limit = limit
        self.wait = wait
        self.used = 0
        self._queue: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self._freed = 0
        self._trimming = False

    async def reserve(self, body_bytes: int) -> BodyReservation:
        size = body_bytes * COPIES
        if size > self.limit:
            raise PayloadTooLarge(
                f"a request body of {body_bytes} bytes is over what the control plane buffers at once "
                f"({self.limit // COPIES} bytes, --body-budget / {COPIES}); send smaller chunks")
        if not self._queue and self.used + size <= self.limit:
            self.used += size
            return BodyReservation(self, size)
        waiter = asyncio.get_running_loop().create_future()
        entry = (size, waiter)
        self._queue.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.wait)
        except TimeoutError:
            if waiter.done() and not waiter.cancelled():  # granted just as the wait ended
                return BodyReservation(self, size)
            self._remove(entry)
            raise Unavailable(
                f"the control plane is buffering {self.used} bytes of other large request bodies (its budget is "
                f"{self.limit} bytes, --body-budget) and this {body_bytes}-byte body waited {self.wait:g} s; "
                "retry shortly or send smaller chunks") from None
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release(size)
            else:
                self._remove(entry)
            raise
        return BodyReservation(self, size)

    def _remove(self, entry: tuple[int, asyncio.Future[None]]) -> None:
        try:
            self._queue.remove(entry)
        except ValueError:
            pass
        entry[1].cancel()
        self._grant()

    def _release(self, size: int) -> None:
        self.used -= size
        self._freed += size
        self._grant()
        if self._freed >= TRIM_AFTER and self.used == 0 and not self._trimming:
            self._freed = 0
            self._trimming = True
            asyncio.get_running_loop().run_in_executor(None, _trim).add_done_callback(self._trimmed)

    def _trimmed(self, _: object) -> None:
        self._trimming = False

    def _grant(self) -> None:
        while self._queue and self.used + self._queue[0][0] <= self.limit:
            size, waiter = self._queue.popleft()
            if not waiter.done():
                self.used += size
                waiter.set_result(None)


def _trim() -> None:
    """Return free heap pages to the system (large bodies leave the heap fragmented)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()
