"""The creation queue: fair turns for sandboxes and builds when trainers share a control plane.

A start (and a fork's children) waits here for room instead of failing at once with 429: room
under ``--max-servers`` (everyone), the tenant's ``--tenant-max-servers`` and the client's
``--client-max-servers``, and a token of ``--start-rate`` (sandboxes made per second, in bursts
of ``--start-burst``). When room frees, the turn goes to the waiting tenant that holds the
fewest sandboxes, within it to the client that holds the fewest, and within a client to the
first that came: max-min fairness, so trainers bursting together each end up with an equal
share, and a tenant's burst never holds back another tenant whose own limits leave it room.
A FINISHED server (a sandbox kept for reuse) gives way: when FINISHED servers fill the room a
waiting start needs, the least recently used one is stopped. A start that waited
``--queue-timeout`` (or its own start timeout, if shorter) answers 429 naming the limit that
held it; a request that could never fit (a fork of more children than a limit) at once.

Builds wait for their turn the same way under ``--tenant-max-builds`` and ``--client-max-builds``.

Sandboxes are counted from the store (servers with a sandbox behind them, ``lifecycle.LIVE``)
plus the grants not recorded as servers: a start holds its grant until its server's row exists,
a sandbox that is no server (a snapshot preparation's, the code runner's) for its whole life
(``Turns.hold``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from .config import ControlPlaneConfig
from .errors import ApiError
from .models import AvailabilityStatus as A
from .store import ServerRow, SQLiteStore

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (tenant, client id)


@dataclass(frozen=True)
class Caps:
    total: int  # 0: none
    tenant: int
    client: int
    flags: tuple[str, str, str]  # the flags that set them, for messages


@dataclass
class _Waiter:
    key: Key
    count: int
    seq: int
    since: float
    future: asyncio.Future[None] = field(repr=False)


class Grant:
    """Room for ``count`` of a kind, held until ``release`` (idempotent)."""

    def __init__(self, turns: Turns, key: Key, count: int) -> None:
        self._turns, self.key, self.count = turns, key, count
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._turns._release(self.key, self.count)


class TokenBucket:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, max(burst, 1)
        self.tokens = float(self.burst)
        self.stamp = time.monotonic()

    def _fill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait(self) -> float:
        """Seconds until a token is there (0: now)."""
        self._fill()
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate

    def take(self, count: int) -> None:
        self.tokens -= count


class Turns:
    """One kind's queue (sandboxes, builds): who waits, what is held, whose turn is next."""

    def __init__(self, kind: tuple[str, str], caps: Caps, counted: Callable[[], dict[Key, int]],
                 rate: TokenBucket | None = None, make_room: Callable[[Key, str], bool] | None = None) -> None:
        self.kind = kind  # (one, several): ("sandbox", "sandboxes")
        self.caps = caps
        self.counted = counted
        self.rate = rate
        self.make_room = make_room
        self._waiting: list[_Waiter] = []
        self._held: dict[Key, int] = {}
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # per key, for /metrics
        self.granted: dict[Key, int] = {}
        self.waited: dict[Key, float] = {}
        self.refused: dict[Key, int] = {}

    # -- asking ---------------------------------------------------------------------------------

    async def acquire(self, key: Key, count: int = 1, timeout: float | None = None) -> Grant:
        """Wait for room for ``count`` (at most ``timeout`` seconds, then 429)."""
        self._loop = asyncio.get_running_loop()
        self._never_fits(key, count)
        waiter = _Waiter(key, count, next(self._seq), time.monotonic(), self._loop.create_future())
        self._waiting.append(waiter)
        self._pump()
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout)
        except TimeoutError:
            if not (waiter.future.done() and not waiter.future.cancelled()):
                self._forget(waiter)
                self.refused[key] = self.refused.get(key, 0) + 1
                raise ApiError.for_status(429, f"waited {timeout:g} s for a turn to make {self._noun(count)}: "
                                               f"{self.why(key)}; retry later") from None
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled():
                self._release(key, count)
            else:
                self._forget(waiter)
            raise
        return Grant(self, key, count)

    def reserve(self, key: Key, count: int = 1) -> Grant:
        """Count ``count`` more for ``key`` now, without waiting (a sandbox on its way out)."""
        self._held[key] = self._held.get(key, 0) + count
        return Grant(self, key, count)

    @contextlib.asynccontextmanager
    async def hold(self, key: Key, count: int = 1, timeout: float | None = None) -> AsyncIterator[Grant]:
        """Room for ``count`` while the block runs: for sandboxes that are not servers."""
        grant = await self.acquire(key, count, timeout)
        try:
            yield grant
        finally:
            grant.release()

    def kick(self) -> None:
        """Room may have freed (a server stopped counting): give the next turns. Any thread."""
        if not self._waiting or self._loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._loop.call_soon(self._pump)
        else:
            self._loop.call_soon_threadsafe(self._pump)

    # -- counting -------------------------------------------------------------------------------

    def usage(self) -> dict[Key, int]:
        counts = dict(self.counted())
        for key, n in self._held.items():
            counts[key] = counts.get(key, 0) + n
        return counts

    def queued(self) -> dict[Key, int]:
        out: dict[Key, int] = {}
        for w in self._waiting:
            out[w.key] = out.get(w.key, 0) + w.count
        return out

    def _blocking(self, key: Key, count: int, counts: dict[Key, int]) -> list[str]:
        """The scopes ('total', 'tenant', 'client') whose limit ``count`` more would pass."""
        tenant = key[0]
        out = []
        if self.caps.total and sum(counts.values()) + count > self.caps.total:
            out.append("total")
        if self.caps.tenant and sum(n for k, n in counts.items() if k[0] == tenant) + count > self.caps.tenant:
            out.append("tenant")
        if self.caps.client and counts.get(key, 0) + count > self.caps.client:
            out.append("client")
        return out

    def _never_fits(self, key: Key, count: int) -> None:
        for cap, flag, what in zip((self.caps.total, self.caps.tenant, self.caps.client), self.caps.flags,
                                   ("this control plane", f"tenant {key[0]!r}" if key[0] else "one tenant",
                                    f"client {key[1]}"), strict=True):
            if cap and count > cap:
                raise ApiError.for_status(429, f"{self._noun(count)} at once can never fit: {what} may have "
                                               f"{cap} ({flag})")

    def _noun(self, count: int) -> str:
        return f"{count} {self.kind[0] if count == 1 else self.kind[1]}"

    def blocked(self, key: Key, count: int = 1) -> bool:
        """Whether ``count`` more for ``key`` would wait now."""
        return bool(self._waiting) or bool(self._blocking(key, count, self.usage()))

    def why(self, key: Key) -> str:
        counts = self.usage()
        tenant = key[0]
        parts = []
        if self.caps.total and sum(counts.values()) >= self.caps.total:
            parts.append(f"this control plane holds {sum(counts.values())} of {self.caps.total} ({self.caps.flags[0]})")
        held = sum(n for k, n in counts.items() if k[0] == tenant)
        if self.caps.tenant and held >= self.caps.tenant:
            parts.append(f"tenant {tenant!r} holds {held} of {self.caps.tenant} ({self.caps.flags[1]})")
        if self.caps.client and counts.get(key, 0) >= self.caps.client:
            parts.append(f"client {key[1]} holds {counts.get(key, 0)} of {self.caps.client} ({self.caps.flags[2]})")
        if self.rate is not None and not parts:
            parts.append(f"the rate of {self.rate.rate:g} per second (--start-rate) and the turns of "
                         f"{len(self._waiting)} waiting requests")
        return "; ".join(parts) or f"{len(self._waiting)} requests waiting before it"

    # -- turns ----------------------------------------------------------------------------------

    def _pump(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._waiting:
            return
        counts = self.usage()
        while self._waiting:
            if self.rate is not None:
                delay = self.rate.wait()
                if delay > 0:
                    assert self._loop is not None
                    self._timer = self._loop.call_later(delay, self._pump)
                    return
            fits = [w for w in self._waiting if not self._blocking(w.key, w.count, counts)]
            if not fits:
                self._ask_for_room(counts)
                return
            tenants: dict[str, int] = {}
            for k, n in counts.items():
                tenants[k[0]] = tenants.get(k[0], 0) + n
            chosen = min(fits, key=lambda w: (tenants.get(w.key[0], 0), counts.get(w.key, 0), w.seq))
            self._waiting.remove(chosen)
            if chosen.future.done():  # gave up meanwhile
                continue
            self._held[chosen.key] = self._held.get(chosen.key, 0) + chosen.count
            counts[chosen.key] = counts.get(chosen.key, 0) + chosen.count
            if self.rate is not None:
                self.rate.take(chosen.count)
            self.granted[chosen.key] = self.granted.get(chosen.key, 0) + chosen.count
            self.waited[chosen.key] = self.waited.get(chosen.key, 0.0) + time.monotonic() - chosen.since
            chosen.future.set_result(None)

    def _ask_for_room(self, counts: dict[Key, int]) -> None:
        """Nobody fits: let a FINISHED server give way to the waiter whose turn it would be."""
        if self.make_room is None:
            return
        tenants: dict[str, int] = {}
        for k, n in counts.items():
            tenants[k[0]] = tenants.get(k[0], 0) + n
        for waiter in sorted(self._waiting, key=lambda w: (tenants.get(w.key[0], 0), counts.get(w.key, 0), w.seq)):
            scopes = self._blocking(waiter.key, waiter.count, counts)
            # the narrowest scope first: a client's own FINISHED server before another's
            for scope in ("client", "tenant", "total"):
                if scope in scopes:
                    if self.make_room(waiter.key, scope):
                        return
                    break

    def _release(self, key: Key, count: int) -> None:
        left = self._held.get(key, 0) - count
        if left > 0:
            self._held[key] = left
        else:
            self._held.pop(key, None)
        if self._waiting:
            self._pump()

    def _forget(self, waiter: _Waiter) -> None:
        with contextlib.suppress(ValueError):
            self._waiting.remove(waiter)
        waiter.future.cancel()


class Admission:
    """The control plane's queues: ``sandboxes`` (starts, forks) and ``builds``."""

    def __init__(self, config: ControlPlaneConfig, store: SQLiteStore,
                 stop_finished: Callable[[ServerRow, str], Awaitable[None]],
                 spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        sharing = config.sharing
        self.store = store
        self._stop_finished = stop_finished
        self._spawn = spawn  # background work the control plane waits for at shutdown
        self._giving_way: set[int] = set()
        rate = TokenBucket(sharing.start_rate, sharing.start_burst) if sharing.start_rate > 0 else None
        self.sandboxes = Turns(("sandbox", "sandboxes"), Caps(config.max_servers, sharing.tenant_max_servers,
                                                 sharing.client_max_servers,
                                                 ("--max-servers", "--tenant-max-servers", "--client-max-servers")),
                               store.live_counts, rate, self._make_room)
        self.builds = Turns(("build", "builds"), Caps(0, sharing.tenant_max_builds, sharing.client_max_builds,
                                           ("", "--tenant-max-builds", "--client-max-builds")), dict)
        store.on_release = self.sandboxes.kick

    def _make_room(self, key: Key, scope: str) -> bool:
        """Stop the least recently used FINISHED server in ``scope`` of ``key``; False if none."""
        if self._giving_way:
            return True  # one at a time: the next is chosen once that one has gone
        tenant = key[0] if scope in ("tenant", "client") else None
        rows = self.store.servers(tenant=tenant, availability=[A.FINISHED])
        if scope == "client":
            rows = [r for r in rows if r.client_id == key[1]]
        if not rows:
            return False
        row = min(rows, key=lambda r: r.last_activity_at)
        owner = self.store.get_client(row.client_id)
        self._giving_way.add(row.id)
        # it counts until its sandbox is gone, not only until its status changes
        grant = self.sandboxes.reserve((owner.tenant if owner else "", row.client_id))
        self._spawn(self._give_way(row, grant))
        return True

    async def _give_way(self, row: ServerRow, grant: Grant) -> None:
        try:
            await self._stop_finished(row, "stopped to make room for a waiting start (FINISHED servers give way "
                                           "when the live sandboxes are at a limit)")
        except Exception:  # noqa: BLE001 - the queue goes on; the watcher sweeps what is left
            log.exception("could not stop FINISHED server %s to make room", row.id)
        finally:
            self._giving_way.discard(row.id)
            grant.release()
