"""Warm pool: spare sandboxes kept ready per image, so that a start is a claim, not a boot.

Each pool key (image, kind, root, runtime class, port, limits) keeps ``target`` sandboxes ready.
The target starts at the configured floor for keys in use and grows with demand (claims in the
last minute, the recent claim rate times a fill's duration, and the largest fork of the last
minute), up to a ceiling; keys nobody
asked for in a while shrink back to nothing. Members are recorded in the store, so a restarted
control plane adopts them instead of leaking them. Fills are background work: the backend
makes them at a lower priority than the sandboxes that serve (``Backend.create(background=True)``)
and gives a member its full share when it is claimed. A claim that finds none ready while fills
are under way takes whichever is ready first, the next fill to land or a sandbox made for it
(the other becomes a member). At most ``parallel`` fills are made at once, of every key; but
once a key's claims outrun its fills (a claim found none ready, or took the last, and no member
has landed since), its fills start at once up to its target, and a claim that outruns them
hurries those under way: claims wait for them now, so the rest of each is made at the normal
priority (``Backend.hurry``). Each will be claimed as it lands: a turn waited for, or a fill left
at the background weight, is a claim's wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import replace

from .backends.base import Backend, BackendError, SandboxHandle, SandboxSpec
from .store import SQLiteStore

log = logging.getLogger(__name__)

DEMAND_WINDOW = 60.0
IDLE_KEY_TTL = 600.0
RATE_CLAIMS, RATE_WINDOW = 10, 5.0  # the claim rate: from the last 10 claims within 5 s
DEFAULT_FILL_SECONDS = 0.1  # until a fill of the key has been timed
# After a fork took members, fills of that kind wait this long: the children's first calls come
# now (a trainer's group is waiting on them), and 8 sandbox starts beside them, even at a low
# priority, added ~20 ms to the 8 children's first answers (they share locks in the kernel).
HOLD_OFF_AFTER_FORK = 0.5
FORK_HOLD_LIMIT = 300.0  # seconds a fork that took members holds off the kind's fills at most
MEMBER_PREFIX = "pool"  # a pool member's sandbox name: pool-<hex> (a start's own is sbx-<hex>)
# made for a start that found none ready, beside the fills: it may become a member (pool-s-<hex>)
RACER_PREFIX = "pool-s"


def new_sandbox_name(prefix: str = "sbx") -> str:
    return f"{prefix}-{secrets.token_hex(5)}"


class WarmPool:
    def __init__(self, backend: Backend, store: SQLiteStore, floor: int, ceiling: int,
                 create_timeout: float = 120.0, parallel: int = 4, creating: set[str] | None = None) -> None:
        self.backend = backend
        # names of sandboxes being created right now (shared with the control plane): the
        # orphan sweep must never take one of them for a leak
        self.creating = creating if creating is not None else set()
        self.store = store
        self.floor = floor
        self.ceiling = max(ceiling, floor)
        self.create_timeout = create_timeout
        self._ready: dict[tuple, deque[SandboxHandle]] = {}
        self._templates: dict[tuple, SandboxSpec] = {}
        self._filling: dict[tuple, int] = {}
        self._waiting: dict[tuple, deque[asyncio.Future[SandboxHandle]]] = {}  # claims that found none ready
        self._making: dict[tuple, dict[str, bool]] = {}  # fills being made, oldest first: name -> hurried
        # (image, how) -> starts served: "ready" (a member was), "fill" (waited for one), "own" (made for it)
        self.served: dict[tuple[str, str], int] = {}
        self._demand: dict[tuple, deque[float]] = {}
        self._groups: dict[tuple, deque[tuple[float, int]]] = {}  # (when, how many) a fork took at once
        self._last_used: dict[tuple, float] = {}
        self._failures: dict[tuple, int] = {}
        self._fill_seconds: dict[tuple, float] = {}  # how long a fill takes (moving average)
        self.parallel = parallel
        self._running = 0  # fills being made, of every key
        self._outrun: set[tuple] = set()  # keys whose claims outran their fills (none ready since)
        self._turns = asyncio.Event()  # set when a fill may start that could not (then replaced)
        self._held_off: dict[tuple, asyncio.TimerHandle] = {}  # key -> when its fills may start again
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    # -- claiming ---------------------------------------------------------------------------

    def template(self, spec: SandboxSpec) -> SandboxSpec:
        return replace(spec, server_id=0, generated_name="pool", request=None)

    def watch(self, spec: SandboxSpec) -> None:
        """Keep this kind of sandbox warm from now on (without claiming one)."""
        key = spec.pool_key()
        self._templates.setdefault(key, self.template(spec))
        self._last_used[key] = time.monotonic()
        self._refill(key)

    async def acquire(self, spec: SandboxSpec, timeout: float) -> tuple[SandboxHandle, bool]:
        """A ready sandbox for ``spec`` (warm=True), or a freshly created one (warm=False)."""
        key = spec.pool_key()
        now = time.monotonic()
        self._templates.setdefault(key, self.template(spec))
        self._demand.setdefault(key, deque()).append(now)
        self._last_used[key] = now
        ready = self._ready.get(key)
        while ready:
            handle = ready.popleft()
            self.store.remove_pool_member(handle.name)
            observed = await self.backend.observe(handle)
            if observed.running and observed.ready:
                self.backend.claim(handle)
                self._refill(key)
                if not ready:  # the last one: the next claim would wait for a fill
                    self._outrun_by(key)
                self._count(spec, "ready")
                return handle, True
            self._spawn(self._discard(handle))  # died while waiting: never hand it out
        self._outrun_by(key)
        if self._filling.get(key):
            # made as a member is (from the kind's template, not this request): it may become one
            racer = replace(self._templates[key], generated_name=new_sandbox_name(RACER_PREFIX))
            return await self._first_ready(key, racer, timeout)
        self._refill(key)
        handle = await self.create(replace(spec, generated_name=new_sandbox_name()), timeout)
        self._count(spec, "own")
        return handle, False

    def _count(self, spec: SandboxSpec, how: str) -> None:
        self.served[spec.image_tag, how] = self.served.get((spec.image_tag, how), 0) + 1

    async def _first_ready(self, key: tuple, spec: SandboxSpec, timeout: float) -> tuple[SandboxHandle, bool]:
        """None ready, fills under way: the first sandbox of the kind to be ready serves, a fill's
        (it started earlier: back-to-back claims outrun the fills, and then a claim that made its
        own waited a whole start while a fill landed meanwhile) or the one made for this claim;
        the other joins the pool."""
        landed: asyncio.Future[SandboxHandle] = asyncio.get_running_loop().create_future()
        waiting = self._waiting.setdefault(key, deque())
        waiting.append(landed)
        unwanted = False  # set once this claim needs its own no more: it then lands in the pool

        async def make_own() -> SandboxHandle:
            try:
                handle = await self.create(spec, timeout)
            except BackendError as exc:
                if not unwanted:
                    raise
                log.warning("a sandbox made for a claim that a fill served failed: %s", exc.message)
                raise asyncio.CancelledError from exc  # nobody waits for it
            if unwanted:
                self._land(key, handle)
            return handle

        own = asyncio.ensure_future(make_own())
        self._tasks.add(own)
        own.add_done_callback(self._tasks.discard)
        self._refill(key)  # after: this claim's own start comes first
        try:
            await asyncio.wait({landed, own}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            unwanted = True
            self._give_up(key, landed, own)
            raise
        if landed.done():  # a fill's, or both at once: the fill serves, this claim's own joins the pool
            unwanted = True
            if own.done() and not own.cancelled() and own.exception() is None:
                self._land(key, own.result())
            self.backend.claim(landed.result())
            self._count(spec, "fill")
            return landed.result(), True
        waiting.remove(landed)
        landed.cancel()
        handle = own.result()
        self._count(spec, "own")
        return handle, False

    def _outrun_by(self, key: tuple) -> None:
        """A claim of ``key`` found none ready, or took the last: its queued fills start now, and
        those under way are no longer ahead of demand: claims wait for them (``Backend.hurry``;
        hurrying only the oldest left the others at the background weight until the claims
        caught up with each)."""
        self._outrun.add(key)
        self._wake()
        making = self._making.get(key, {})
        for name, hurried in making.items():
            if not hurried:
                making[name] = True
                self.backend.hurry(name)

    def _wake(self) -> None:
        self._turns.set()
        self._turns = asyncio.Event()

    @contextlib.asynccontextmanager
    async def _turn(self, key: tuple) -> AsyncIterator[None]:
        """A turn to make a fill of ``key``: one of ``parallel``, or, while the key's claims outrun
        its fills, one of its target's (``_outrun``)."""
        def may_start() -> bool:
            if self._running < self.parallel:
                return True
            return key in self._outrun and len(self._making.get(key, ())) < self.target(key)

        while not may_start():
            await self._turns.wait()
        self._running += 1
        try:
            yield
        finally:
            self._running -= 1
            self._wake()

    def _give_up(self, key: tuple, landed: asyncio.Future[SandboxHandle], own: asyncio.Future[SandboxHandle]) -> None:
        """A claim cancelled while it waited: what it was handed, or made, goes to the pool."""
        if landed.done():
            self._land(key, landed.result())
        else:
            self._waiting.get(key, deque()).remove(landed)
            landed.cancel()
        if own.done() and not own.cancelled() and own.exception() is None:
            self._land(key, own.result())

    def _land(self, key: tuple, handle: SandboxHandle) -> None:
        """A new sandbox of ``key``'s kind: to the claim that has waited longest, else into the pool."""
        waiting = self._waiting.get(key, deque())
        while waiting:
            claim = waiting.popleft()
            if not claim.done():
                claim.set_result(handle)
                return
        if self._closed:
            self._spawn(self._discard(handle))
            return
        self.store.add_pool_member(handle.name, json.dumps(list(map(str, key))), json.dumps(handle.to_json()))
        self._ready.setdefault(key, deque()).append(handle)
        self._outrun.discard(key)  # ahead of the claims again: its fills take turns

    def take(self, spec: SandboxSpec, count: int) -> list[SandboxHandle]:
        """Up to ``count`` ready members of ``spec``'s kind, creating none (a fork turns them into
        its children, and its backend claims each as it does: ``Backend.fork``; the claim is off
        the event loop there); what is asked for counts as demand, as claims do."""
        key = spec.pool_key()
        now = time.monotonic()
        self._templates.setdefault(key, self.template(spec))
        self._demand.setdefault(key, deque()).extend([now] * count)
        self._groups.setdefault(key, deque()).append((now, count))
        self._last_used[key] = now
        ready = self._ready.get(key) or deque()
        taken: list[SandboxHandle] = []
        if ready:
            # No fill of the kind until the fork says when (``refill(after=…)``, as it ends): the
            # target grew with the fork, and a fill started meanwhile (the maintenance loop's)
            # would compete with the children being made. The limit only covers a fork that never says.
            self.refill(spec, after=FORK_HOLD_LIMIT)
        while ready and len(taken) < count:
            taken.append(ready.popleft())
        if taken:
            self.store.remove_pool_members(h.name for h in taken)  # one transaction for all
        return taken

    def refill(self, spec: SandboxSpec, after: float = 0.0) -> None:
        """Bring ``spec``'s kind back to its target (now: an earlier hold-off ends); with ``after``,
        no fill of it starts before that many seconds (the maintenance loop's included)."""
        key = spec.pool_key()
        if (timer := self._held_off.pop(key, None)) is not None:
            timer.cancel()
        if after <= 0:
            self._refill(key)
            return

        def resume() -> None:
            self._held_off.pop(key, None)
            self._refill(key)

        self._held_off[key] = asyncio.get_running_loop().call_later(after, resume)

    async def create(self, spec: SandboxSpec, timeout: float, *, background: bool = False) -> SandboxHandle:
        self.creating.add(spec.generated_name)
        try:
            return await self.backend.create(spec, timeout, background=background)
        finally:
            self.creating.discard(spec.generated_name)

    def target(self, key: tuple) -> int:
        demand = self._demand.get(key, deque())
        cutoff = time.monotonic() - DEMAND_WINDOW
        while demand and demand[0] < cutoff:
            demand.popleft()
        if time.monotonic() - self._last_used.get(key, 0.0) > IDLE_KEY_TTL:
            return 0
        if self._failures.get(key, 0) >= 3:
            return 0  # this image does not start; stop burning CPU on it
        # Claims in the last minute say how busy the key is; the recent claim rate times how long
        # a fill takes says how many must be on their way now, so that a burst of episodes (a
        # trainer's first batch) does not drain the pool before the minute's count catches up.
        recent = [t for t in list(demand)[-RATE_CLAIMS:] if t >= time.monotonic() - RATE_WINDOW]
        in_flight = 0
        if len(recent) >= 2 and recent[-1] > recent[0]:
            rate = (len(recent) - 1) / (recent[-1] - recent[0])
            in_flight = math.ceil(rate * self._fill_seconds.get(key, DEFAULT_FILL_SECONDS) * 2)
        # A fork of n in the last minute: the next of its kind (a trainer forks a group per
        # prompt) finds n ready, not the half of them the minute's count says.
        groups = self._groups.get(key, deque())
        while groups and groups[0][0] < cutoff:
            groups.popleft()
        group = max((n for _t, n in groups), default=0)
        return min(self.ceiling, max(self.floor, len(demand) // 2, self.floor + in_flight, group))

    def sizes(self) -> dict[str, int]:
        return {self._templates[k].image_tag: len(v) for k, v in self._ready.items() if k in self._templates}

    # -- filling ------------------------------------------------------------------------------

    def _refill(self, key: tuple) -> None:
        if self._closed or key in self._held_off:
            return
        have = len(self._ready.get(key, ())) + self._filling.get(key, 0)
        for _ in range(self.target(key) - have):
            self._filling[key] = self._filling.get(key, 0) + 1
            self._spawn(self._fill_one(key))

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fill_one(self, key: tuple) -> None:
        try:
            async with self._turn(key):
                if self._closed:
                    return
                spec = replace(self._templates[key], generated_name=new_sandbox_name(MEMBER_PREFIX))
                started = time.monotonic()
                making = self._making.setdefault(key, {})
                making[spec.generated_name] = False
                try:
                    handle = await self.create(spec, self.create_timeout, background=True)
                finally:
                    making.pop(spec.generated_name, None)
                took = time.monotonic() - started
                self._fill_seconds[key] = 0.7 * self._fill_seconds.get(key, took) + 0.3 * took
            if self._closed:
                await self._discard(handle)
                return
            self._land(key, handle)
            self._failures[key] = 0
        except BackendError as exc:
            self._failures[key] = self._failures.get(key, 0) + 1
            log.warning("warm pool could not create a %s sandbox: %s", self._templates[key].image_tag, exc.message)
        except Exception:
            self._failures[key] = self._failures.get(key, 0) + 1
            log.exception("warm pool fill failed")
        finally:
            self._filling[key] = self._filling.get(key, 1) - 1

    async def _discard(self, handle: SandboxHandle) -> None:
        """Delete a member nobody will claim (the pool shrank or closes, a previous run's): nobody
        waits for it, so it is retired (``Backend.retire``: its processes killed now, the rest
        removed at a quiet moment, and before the backend's close returns)."""
        try:
            await self.backend.retire(handle)
        except Exception:
            log.exception("could not delete pool sandbox %s", handle.name)

    async def maintain(self) -> None:
        """Refill every key to its target and shed members of keys nobody wants any more."""
        for key in list(self._templates):
            want = self.target(key)
            ready = self._ready.get(key, deque())
            while len(ready) > want:
                handle = ready.pop()
                self.store.remove_pool_member(handle.name)
                self._spawn(self._discard(handle))
            self._refill(key)

    # -- restart and shutdown -------------------------------------------------------------------

    def member_names(self) -> set[str]:
        return {h.name for q in self._ready.values() for h in q}

    async def adopt(self) -> None:
        """Delete the pool a previous run left: its keys' templates are not known to this run."""
        for row in self.store.pool_members():
            self.store.remove_pool_member(row.name)
            await self._discard(SandboxHandle.from_json(json.loads(row.handle)))

    async def close(self, delete_members: bool = True) -> None:
        self._closed = True
        for timer in self._held_off.values():
            timer.cancel()
        self._held_off.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=10)
        if delete_members:
            handles = [h for q in self._ready.values() for h in q]
            self._ready.clear()
            for handle in handles:
                self.store.remove_pool_member(handle.name)
            await asyncio.gather(*(self._discard(h) for h in handles))
