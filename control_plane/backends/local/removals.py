"""Removals: a retired sandbox's teardown, after a quiet moment.

A sandbox nobody waits on (``Backend.retire``: a restart's old one, the warm pool's own deletes)
has every process SIGKILLed at once (``teardown.signal_all``: one pass, no wait) and the rest of its
teardown, the wait for its processes to be gone included (``teardown.destroy``), waits here for a
quiet moment: ``QUIET`` seconds without a claim or a retire (the calls of the episode that follows
come then), at most ``MAX_WAIT`` seconds, and at once for all but ``MAX_PENDING`` of them (each keeps
its layer mounted, and every mount namespace a launch copies carries it). One at a time, through
the launcher's bounded teardowns (a stuck one fails, logged, and the next goes on). Until it is
removed its directory and record stay and its lease monitor runs: a control plane killed meanwhile
leaves it to the next start's orphan sweep, or to the monitor once the lease lapses, as a delete
cut off half-way. The running control plane's sweep leaves it alone (``names``); a delete of it
removes it at once (``drop``); ``drain`` (the launcher's close) removes every one before it
returns. A removal that fails is logged with what was left, which the orphan sweep takes again.

Measured with back-to-back RESTART resets as ``benchmarks/env_step.py`` makes them (4 rounds of
200 alternated with a delete that waited and removed at once, 2 cores, load 19-38): that delete's
thread took 16.1 ms of CPU p50 (p90 26.9), 13.0 of it its kill's looks at the groups while the
processes died (326 ms p50 at that load), beside the next episode's first calls and the pool's
fills; retired, the signals take 2.7 ms at once (p90 5.2) and the teardown 5.1 later (its
processes gone by then: one look). Reset p95 per round 178 101 126 130 -> 98 70 163 66 ms
(pooled p90 72 -> 56, p95 131 -> 86), the step after unchanged (p50 113 -> 115 ms).
Tried and dropped: a thread that killed and waited at once and removed the rest after a quiet
moment (the removal proper was ~2.5 ms of the 12: pooled reset p95 70.3 ms against 60.8, 3 rounds
of 200 at load 13-35), and that removal in a process of its own at nice 19 (no GIL to share; 92.6).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .handle_data import LocalHandleData
from .layout import Space

log = logging.getLogger(__name__)

QUIET = 0.5
MAX_WAIT = 5.0
MAX_PENDING = 8


@dataclass
class _Removal:
    space: Space
    name: str
    data: LocalHandleData | None
    since: float  # when it was queued (time.monotonic)
    task: asyncio.Task | None = None  # under way


class Removals:
    """The retired sandboxes of one launcher, removed by ``remove`` (its bounded teardown)."""

    def __init__(self, remove: Callable[[Space, str, LocalHandleData | None], Awaitable[None]]) -> None:
        self._remove = remove
        self._queue: dict[tuple[str, str], _Removal] = {}  # in the order queued
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._draining = False
        self._busy = 0.0  # when the last claim or retire was (``touch``; time.monotonic)

    def add(self, space: Space, name: str, data: LocalHandleData | None) -> None:
        """Queue the removal of the sandbox ``name``, whose processes were just SIGKILLed."""
        self._queue.setdefault((space.kind, name), _Removal(space, name, data, time.monotonic()))
        self.touch()
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def touch(self) -> None:
        """A sandbox is claimed or retired: its calls follow, removals wait for a quiet moment
        (a removal already waiting sees it when its wait ends). Any thread."""
        self._busy = time.monotonic()

    def names(self, kind: str) -> set[str]:
        """The sandboxes of the space ``kind`` whose removal waits or is under way."""
        return {name for k, name in self._queue if k == kind}

    def drop(self, space: Space, name: str) -> None:
        """A delete removes ``name`` now: its removal, if it has not begun, is dropped (one under
        way is the same bounded teardown the delete joins)."""
        removal = self._queue.get((space.kind, name))
        if removal is not None and removal.task is None:
            del self._queue[(space.kind, name)]

    async def drain(self) -> None:
        """Every removal now (the launcher's turns bound how many at once); returns once none is left."""
        self._draining = True
        self._wake.set()
        while self._task is not None and not self._task.done():
            await asyncio.wait({self._task})

    async def _run(self) -> None:
        while self._queue:
            waiting = [r for r in self._queue.values() if r.task is None]
            running = {r.task for r in self._queue.values() if r.task is not None}
            hurry = self._draining or len(waiting) > MAX_PENDING
            if not waiting or (running and not hurry):
                await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                continue
            first = waiting[0]
            wait = min(first.since + MAX_WAIT, self._busy + QUIET) - time.monotonic()
            if wait > 0 and not hurry:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
                continue
            for removal in (waiting if self._draining else waiting[:max(len(waiting) - MAX_PENDING, 1)]):
                removal.task = asyncio.ensure_future(self._removing(removal))

    async def _removing(self, removal: _Removal) -> None:
        try:
            await self._remove(removal.space, removal.name, removal.data)
        except Exception as exc:  # noqa: BLE001 - nobody waits for it: said here, left to the sweep
            log.warning("removing the retired sandbox %s failed (the orphan sweep retries it): %s", removal.name, exc)
        finally:
            self._queue.pop((removal.space.kind, removal.name), None)
