"""The watcher: reaps idle servers and silent clients, catches crashes, sweeps orphans.

One pass every ``interval`` seconds:

* ALIVE/REUSED servers idle longer than ``inactive_timeout`` are deleted → KILLED, unless a
  keepalive window holds them (windows only ever extend); FINISHED ones wait ``finished_timeout``
  for reuse. Status reads are not activity; forwarded calls are.
* Clients whose heartbeat stopped for ``heartbeat_timeout`` (and that wait for no operation of
  their own) → KILLED, with their usable servers.
* Every live sandbox is observed: a crashed one is restarted while ``max_restarts`` allows,
  else the server becomes CRASHED with the reason in ``details``.
* Backend resources with no database row (and no pool membership) are deleted once they have
  been seen orphaned on two consecutive passes, so a sandbox being created is never swept (at
  start-up and at an ephemeral shutdown, when nothing is being created, on the first sight).
  A DELETION_FAILED server's sandbox is deleted the same way, as a retry of its stop.
* Operations older than the retention are purged; one stuck in progress too long is failed.
* Uploads no build used for ``upload_retention`` are dropped (``uploads.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging

from . import lifecycle
from .backends.base import SandboxHandle
from .config import WatcherConfig
from .models import AsyncOperationStatus, ErrorResponse
from .models import AvailabilityStatus as A
from .records import ServerRow
from .service import ControlPlane
from .store import now_ms

log = logging.getLogger(__name__)


class Watcher:
    def __init__(self, cp: ControlPlane, config: WatcherConfig) -> None:
        self.cp = cp
        self.config = config
        self._suspects: set[str] = set()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="watcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval)
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # the watcher must survive anything a pass meets
                log.exception("watcher pass failed")

    async def run_once(self) -> None:
        await self.reap_idle()
        await self.reap_clients()
        await self.check_crashes()
        await self.cp.pool.maintain()
        await self.sweep_orphans()
        self.purge_operations()
        self.cp.uploads.expire(self.cp.config.sharing.upload_retention)

    async def reap_idle(self) -> None:
        now = now_ms()
        doomed = []
        for row in self.cp.store.servers(availability=lifecycle.LIVE):
            if self.cp.is_busy(row.id) or not row.handle:
                continue  # starting, restarting or stopping: not idle
            if row.keepalive_until is not None and now < row.keepalive_until:
                continue
            timeout = self.config.finished_timeout if row.availability == A.FINISHED else self.config.inactive_timeout
            idle = (now - row.last_activity_at) / 1000
            if idle > timeout:
                state = "finished and not reused" if row.availability == A.FINISHED else "idle"
                doomed.append((row, f"killed by the watcher: {state} for {idle:.0f} s (limit {timeout:g} s)"))
        await asyncio.gather(*(self.cp.stop(row, A.KILLED, why) for row, why in doomed))

    async def reap_clients(self) -> None:
        cutoff = now_ms() - self.config.heartbeat_timeout * 1000
        # A client waiting for a request of its own (a start behind a long build, on a loaded host)
        # is not silent: its silence is ours.
        waiting = {op.client_id for op in self.cp.store.unfinished_operations()}
        for client in self.cp.store.clients([A.ALIVE, A.FINISHED]):
            if client.last_heartbeat_time >= cutoff or client.id in waiting:
                continue
            if self.cp.store.set_client_status(client.id, A.KILLED):
                servers = self.cp.store.servers(client_id=client.id, availability=lifecycle.USABLE)
                await asyncio.gather(*(
                    self.cp.stop(s, A.KILLED, "killed by the watcher: its client stopped sending heartbeats")
                    for s in servers))

    async def check_crashes(self) -> None:
        rows = [r for r in self.cp.store.servers(availability=lifecycle.LIVE) if r.handle]
        slots = asyncio.Semaphore(16)

        async def check(row) -> None:
            async with slots:
                await self.cp.check_sandbox(row.id)

        await asyncio.gather(*(check(r) for r in rows))

    async def sweep_orphans(self, at_once: bool = False) -> None:
        """Delete what the backend holds and no record names, once seen on two passes in a row;
        ``at_once`` deletes on the first sight, for when nothing is being created: at start-up
        (the leftovers of a killed control plane) and at an ephemeral shutdown. The sandbox of a
        server whose delete failed (DELETION_FAILED) is deleted as its stop is retried: with its
        handle, and the server recorded STOPPED once it is gone (its client too, once it has no
        server left DELETION_FAILED)."""
        try:
            present = await self.cp.backend.list_names()
        except Exception:  # noqa: BLE001
            log.exception("could not list backend resources")
            return
        known = set(self.cp.pool.member_names())
        failed: dict[str, ServerRow] = {}
        for row in self.cp.store.servers():
            live = not lifecycle.is_terminal(row.availability)
            if not row.handle or not (live or row.availability == A.DELETION_FAILED):
                continue  # a server that ended holds no sandbox: its handle is not parsed every pass
            name = SandboxHandle.from_json(json.loads(row.handle)).name
            if live or self.cp.is_busy(row.id):
                known.add(name)
            else:
                failed[name] = row
        for member in self.cp.store.pool_members():
            known.add(member.name)
        known |= self.cp.creating | self.cp.leased
        orphans = present - known
        confirmed = orphans if at_once else orphans & self._suspects
        self._suspects = orphans - confirmed
        for name in confirmed:
            retry = failed.get(name)
            if retry is not None:
                log.warning("deleting sandbox %s of server %d again (its delete had failed)", name, retry.id)
                if await self.cp.stop(retry, A.STOPPED, "stopped: its sandbox was deleted on the watcher's retry"):
                    self.cp.settle_client(retry.client_id)
                continue
            log.warning("deleting orphaned sandbox %s (no server or pool record)", name)
            try:
                await self.cp.backend.delete_name(name)
            except Exception:  # noqa: BLE001
                log.exception("could not delete orphan %s", name)

    def purge_operations(self) -> None:
        now = now_ms()
        self.cp.store.purge_operations(now - int(self.config.operation_retention * 1000))
        stale_before = now - int(self.config.stale_operation * 1000)
        for op in self.cp.store.unfinished_operations():
            if (op.started_at or op.scheduled_at) < stale_before:
                self.cp.store.finish_operation(op.id, AsyncOperationStatus.FAILED, ErrorResponse(
                    status_code=504, headers={},
                    body=f"failed by the watcher: in progress for more than {self.config.stale_operation:g} s",
                ).model_dump_json())
