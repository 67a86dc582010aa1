"""Starting and stopping a control plane: its backend, the records a previous run left, the
warm pool, the watcher.

Stopping (SIGTERM, SIGINT, the embedding process gone) takes at most ``SHUTDOWN_BUDGET``
seconds: every call in flight is answered 503 at once (the sandbox keeps what it was doing), new
ones too, running operations get a short grace, the warm pool is deleted, and live servers are
kept for the next start on the same state directory (their sandboxes' leases keep them until
then) or, ``--ephemeral``, deleted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from .backends.base import Limits, SandboxSpec
from .errors import Unavailable
from .jobs import ImageJobs
from .models import ServerKind
from .service import ControlPlane
from .watcher import Watcher

log = logging.getLogger(__name__)


SHUTDOWN_BUDGET = 9.0  # seconds from the stop signal to the end of the process (within 10)
SHUTTING_DOWN = "the control plane is shutting down; the call was cut off (retry once it is back)"


class Shutdown:
    """Cuts calls in flight off with 503 once the control plane is told to stop."""

    def __init__(self, budget: float = SHUTDOWN_BUDGET) -> None:
        self.budget = budget
        self.started: float | None = None
        self._inflight: set[asyncio.Task] = set()
        self._cut: set[asyncio.Task] = set()

    def begin(self) -> None:
        if self.started is not None:
            return
        self.started = time.monotonic()
        for task in list(self._inflight):
            self._cut.add(task)
            task.cancel()

    def remaining(self, reserve: float = 0.0) -> float:
        """Seconds left of the budget (minus ``reserve`` for what comes after); the full budget
        before ``begin``."""
        spent = 0.0 if self.started is None else time.monotonic() - self.started
        return max(self.budget - spent - reserve, 0.05)

    @contextmanager
    def in_flight(self) -> Iterator[None]:
        """Around a request's work: ``Unavailable`` once stopping; until it ends, ``begin`` cuts it
        off (its cancellation undone, the request answers 503)."""
        if self.started is not None:
            raise Unavailable(SHUTTING_DOWN)
        task = asyncio.current_task()
        assert task is not None
        self._inflight.add(task)
        try:
            yield
        except asyncio.CancelledError:
            if task not in self._cut:
                raise
            task.uncancel()
            raise Unavailable(SHUTTING_DOWN) from None
        finally:
            self._inflight.discard(task)
            self._cut.discard(task)


async def _bounded(what: str, work: Any, seconds: float) -> None:
    try:
        await asyncio.wait_for(work, seconds)
    except TimeoutError:
        log.warning("shutdown: %s did not finish within %.1f s; going on", what, seconds)


def lifecycle_context(cp: ControlPlane, watcher: Watcher, images: ImageJobs, shutdown: Shutdown):
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        await cp.backend.start()
        failed = cp.ops.recover()
        images.recover()
        if failed:
            log.warning("failed %d operations cut off by a previous run", failed)
        await cp.pool.adopt()
        await watcher.check_crashes()  # adopt live sandboxes: crashed ones are marked now
        await watcher.sweep_orphans(at_once=True)
        for image in cp.config.pool_images:
            cp.pool.watch(SandboxSpec(0, "pool", "idegym", image, ServerKind.IDEGYM, False, None, 8000, 80, Limits()))
        watcher.start()
        yield
        shutdown.begin()  # also when stopped without a signal (tests, an embedding program)
        await watcher.stop()
        await cp.close(shutdown.remaining(reserve=1.5))
        if cp.config.ephemeral:
            # Nothing outlives an ephemeral control plane, not even a sandbox half-made by a
            # request that shutdown cut off (a code-runner lease did leave one behind).
            await _bounded("settling sandbox creates", cp.backend.settle(), shutdown.remaining(reserve=1.0))
            await _bounded("the last orphan sweep", watcher.sweep_orphans(at_once=True), shutdown.remaining(0.5))
        await _bounded("closing the backend", cp.backend.close(), shutdown.remaining())
        cp.store.close()

    return ctx
