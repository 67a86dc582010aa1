"""Removals: what a retired sandbox leaves, removed off the hot path.

A sandbox nobody waits on (a restart's old one, ``Backend.retire``) is killed at once
(``teardown.kill``: nothing of it runs any more) and the rest of its teardown (``teardown.clear``:
its cgroups, mounts, files, holds on fork layers, then its lease monitor) waits here, so that it
does not compete with the next episode's first calls. Until it is removed its directory and record
stay, and its lease monitor runs: a control plane killed meanwhile leaves it to the next start's
orphan sweep, or to the monitor once the lease lapses, as a delete cut off half-way. The running
control plane's sweep leaves it alone (``names``); ``finish`` takes one back for a delete that
wants it gone now; ``drain`` (the backend's close) removes every one before it returns. A removal
that fails is logged with what was left, which stays for the orphan sweep.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from . import teardown
from .handle_data import LocalHandleData
from .layout import Space
from .remover import Remover

log = logging.getLogger(__name__)

# Experiment knobs (to be fixed once measured).
QUIET = float(os.environ.get("IDEGYM_REMOVAL_QUIET", "1.0"))  # seconds without a claim or retire
MAX_WAIT = float(os.environ.get("IDEGYM_REMOVAL_MAX_WAIT", "30"))
MAX_PENDING = int(os.environ.get("IDEGYM_REMOVAL_MAX_PENDING", "64"))
NICE = int(os.environ.get("IDEGYM_REMOVAL_NICE", "0"))
PROCESS = os.environ.get("IDEGYM_REMOVAL_PROCESS", "0") == "1"


@dataclass
class _Removal:
    space: Space
    name: str
    data: LocalHandleData | None
    sb: Path
    run: Path
    cgroups: dict[str, str]
    since: float  # the loop's time it was queued
    done: asyncio.Future | None = None  # under way: its thread's outcome


class Removals:
    """The removals of one launcher: one at a time, each ``DELAY`` seconds after it was queued;
    ``at_once`` at a time and at once when draining."""

    def __init__(self, at_once: int) -> None:
        self.at_once = at_once
        self._queue: dict[tuple[str, str], _Removal] = {}  # in the order queued
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        self._draining = False
        self._busy = 0.0  # the loop's time of the last claim or retire (``touch``)
        self._remover = Remover()

    def add(self, space: Space, name: str, data: LocalHandleData | None, sb: Path, run: Path,
            cgroups: dict[str, str]) -> None:
        """Queue the removal of the killed sandbox ``name`` (``teardown.kill``'s findings)."""
        loop = asyncio.get_running_loop()
        self._queue.setdefault((space.kind, name), _Removal(space, name, data, sb, run, cgroups, loop.time()))
        self.touch()
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def touch(self) -> None:
        """A sandbox is claimed or retired: calls follow, removals wait for a quiet moment."""
        self._busy = asyncio.get_running_loop().time()

    def names(self, kind: str) -> set[str]:
        """The sandboxes of the space ``kind`` whose removal waits or is under way."""
        return {name for k, name in self._queue if k == kind}

    async def finish(self, space: Space, name: str) -> None:
        """The removal of ``name`` no longer waits: one under way is waited for (its failure is
        the caller's to find again), one not begun is dropped: the caller removes it now."""
        removal = self._queue.get((space.kind, name))
        if removal is None:
            return
        if removal.done is None:
            del self._queue[(space.kind, name)]
            return
        await asyncio.wait({removal.done})

    async def drain(self) -> None:
        """Every removal now, ``at_once`` at a time; returns once none is left."""
        self._draining = True
        self._wake.set()
        while self._task is not None and not self._task.done():
            await asyncio.wait({self._task})
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None
        await asyncio.get_running_loop().run_in_executor(None, self._remover.close)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            waiting = [r for r in self._queue.values() if r.done is None]
            running = {r.done for r in self._queue.values() if r.done is not None}
            hurry = self._draining or len(waiting) > MAX_PENDING
            if not waiting or len(running) >= (self.at_once if hurry else 1):
                await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                continue
            first = waiting[0]
            wait = min(first.since + MAX_WAIT, self._busy + QUIET) - loop.time()
            if wait > 0 and not hurry:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
                continue
            if self._threads is None:
                self._threads = concurrent.futures.ThreadPoolExecutor(
                    self.at_once, thread_name_prefix="idegym-removal", initializer=_lower_priority)
            files = self._remover.remove_files if PROCESS and not hurry else None
            first.done = asyncio.ensure_future(loop.run_in_executor(
                self._threads, teardown.clear, first.name, first.space, first.data, first.sb, first.run,
                first.cgroups, None, files))
            first.done.add_done_callback(functools.partial(self._ended, (first.space.kind, first.name)))

    def _ended(self, key: tuple[str, str], done: asyncio.Future) -> None:
        self._queue.pop(key, None)
        if not done.cancelled() and done.exception() is not None:
            log.warning("removing what is left of sandbox %s failed (the orphan sweep retries it): %s", key[1],
                        done.exception())


def _lower_priority() -> None:
    if NICE:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
