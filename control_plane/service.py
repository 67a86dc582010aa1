"""The control plane's behaviour, independent of HTTP: clients, servers, reuse, lifecycle.

Routes (``app.py``) validate and translate; everything that changes state happens here, and
every availability change goes through the store's lifecycle-guarded compare-and-set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Iterator
from dataclasses import replace
from typing import Any

from . import lifecycle
from .admission import Admission
from .backends.base import Backend, BackendError, SandboxAddress, SandboxHandle, SandboxSpec
from .config import ControlPlaneConfig
from .errors import ApiError, Conflict, Gone, NotFound
from .image_access import ImageAccess
from .models import (
    AvailabilityStatus as A,
)
from .models import (
    CreateSnapshotResponse,
    RegisteredClientResponse,
    ServerActionResponse,
    ServerKind,
    ServerReuseStrategy,
    ServerStatusResponse,
    ServerSummary,
    StartServerRequest,
    StartServerResponse,
)
from .operations import Operations
from .pool import WarmPool, new_sandbox_name
from .sandbox_http import Forwarder
from .snapshot_caps import SnapshotCaps
from .store import ClientRow, ServerRow, SnapshotRow, SQLiteStore, now_ms
from .uploads import UploadStore

log = logging.getLogger(__name__)


class ControlPlane:
    def __init__(self, config: ControlPlaneConfig, store: SQLiteStore, backend: Backend) -> None:
        self.config = config
        self.store = store
        self.backend = backend
        self.ops = Operations(store, config.pod_name)
        self.forwarder = Forwarder(config.client_request_timeout)
        self.images = ImageAccess(store)  # its builder is set with the app's (app.create_app)
        self.uploads = UploadStore(config.state_dir, store, config.sharing)
        self.admission = Admission(config, store, self.give_way, self.spawn)
        self._endpoints: dict[str, SandboxAddress] = {}
        self.creating: set[str] = set()  # sandbox names being created (the sweep leaves them alone)
        self.leased: set[str] = set()  # sandboxes in use outside any server (the code runner's)
        self.snapshot_caps = SnapshotCaps(config, store, backend)
        self.pool = WarmPool(backend, store, config.warm_pool, config.warm_pool_max,
                             parallel=config.warm_pool_parallel, creating=self.creating)
        self._background: set[asyncio.Task] = set()
        self._busy: dict[int, int] = {}  # servers with a life-cycle change under way

    # -- helpers ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def busy(self, server_id: int) -> Iterator[None]:
        """Mark a server as changing (stop, restart…): the crash check leaves it alone meanwhile,
        since a sandbox being replaced or deleted looks exactly like one that died."""
        self._busy[server_id] = self._busy.get(server_id, 0) + 1
        try:
            yield
        finally:
            self._busy[server_id] -= 1
            if not self._busy[server_id]:
                del self._busy[server_id]

    def is_busy(self, server_id: int) -> bool:
        """Whether a stop, restart or start of the server is under way."""
        return server_id in self._busy

    def spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def client(self, client_id: uuid.UUID | str, tenant: str) -> ClientRow:
        """``tenant``'s client ``client_id``; another tenant's is not found, like one never registered."""
        row = self.store.get_client(client_id)
        if row is None or row.tenant != tenant:
            raise NotFound(f"client {client_id} is not registered; register it with POST /api/clients")
        return row

    def owned_server(self, client_id: uuid.UUID | str, server_id: int, tenant: str) -> ServerRow:
        self.client(client_id, tenant)
        row = self.store.get_server(server_id)
        if row is None or row.client_id != str(client_id):
            raise NotFound(f"server {server_id} not found for client {client_id}")
        return row

    def usable_server(self, client_id: uuid.UUID | str, server_id: int, tenant: str) -> ServerRow:
        row = self.owned_server(client_id, server_id, tenant)
        if not lifecycle.is_usable(row.availability) or not row.handle:
            detail = f": {row.details}" if row.details else ""
            raise Gone(f"server {server_id} is {row.availability.value}, not usable{detail}")
        return row

    def endpoint_of(self, row: ServerRow) -> SandboxAddress:
        assert row.handle
        return self._endpoint(row.handle)

    def forward_endpoint(self, client_id: uuid.UUID | str, server_id: int, tenant: str) -> SandboxAddress:
        """Where to send a call for a usable server the client owns. Forwards are the hot path:
        one query, and the full lookup only to say what is wrong."""
        handle = self.store.usable_handle(str(client_id), server_id, tenant)
        if handle is None:
            return self.endpoint_of(self.usable_server(client_id, server_id, tenant))
        return self._endpoint(handle)

    def _endpoint(self, handle: str) -> SandboxAddress:
        endpoint = self._endpoints.get(handle)
        if endpoint is None:  # parsing the handle costs more than a forward can spare
            if len(self._endpoints) >= 4096:
                self._endpoints.clear()
            endpoint = self._endpoints[handle] = self.backend.endpoint(SandboxHandle.from_json(json.loads(handle)))
        return endpoint

    @staticmethod
    def summary(row: ServerRow) -> dict:
        return dict(
            server_id=row.id, server_name=row.server_name, generated_name=row.generated_name,
            namespace=row.namespace, availability=row.availability, usable=lifecycle.is_usable(row.availability),
            image_tag=row.image_tag, created_at=row.created_at, last_activity_at=row.last_activity_at,
            keepalive_until=row.keepalive_until, details=row.details,
        )

    @staticmethod
    def client_response(row: ClientRow, operation_id: int | None = None) -> RegisteredClientResponse:
        return RegisteredClientResponse(
            id=uuid.UUID(row.id), name=row.name, nodes_count=row.nodes_count, namespace=row.namespace,
            last_heartbeat_time=row.last_heartbeat_time, availability=row.availability,
            created_at=row.created_at, operation_id=operation_id,
        )

    # -- clients ------------------------------------------------------------------------------

    def register_client(self, name: str, namespace: str, nodes_count: int, tenant: str) -> ClientRow:
        now = now_ms()
        row = ClientRow(str(uuid.uuid4()), name, namespace, nodes_count, A.ALIVE, now, now, tenant)
        self.store.add_client(row)
        return row

    def needs_nodes(self, nodes_count: int) -> bool:
        return nodes_count > 0 and self.backend.capabilities.node_reservation

    async def reserve_nodes(self, row: ClientRow) -> RegisteredClientResponse:
        """Provision ``nodes_count`` nodes for the client's name (backends that schedule on nodes)."""
        try:
            await self.backend.reserve_nodes(_node_group(row), row.nodes_count)
        except BackendError as exc:
            raise ApiError.for_status(exc.status, f"reserving {row.nodes_count} nodes failed: {exc.message}") from exc
        return self.client_response(self.client(row.id, row.tenant))

    async def _release_nodes(self, row: ClientRow) -> None:
        if not self.needs_nodes(row.nodes_count):
            return
        others = [c.nodes_count for c in self.store.clients([A.ALIVE, A.FINISHED])
                  if _node_group(c) == _node_group(row) and c.id != row.id]
        try:
            await self.backend.release_nodes(_node_group(row), max(others, default=0))
        except Exception:  # noqa: BLE001 - a failed release is retried by the next client stop
            log.exception("could not release nodes of %s", row.name)

    def heartbeat(self, client_id: uuid.UUID, availability: A, tenant: str) -> ClientRow:
        row = self.client(client_id, tenant)
        if not lifecycle.is_terminal(row.availability):
            self.store.set_client_status(row.id, availability if availability in (A.ALIVE, A.FINISHED) else
                                         row.availability, heartbeat=now_ms())
        return self.client(client_id, tenant)

    def finish_client(self, client_id: uuid.UUID, tenant: str) -> ClientRow:
        row = self.client(client_id, tenant)
        for server in self.store.servers(client_id=row.id, availability=lifecycle.USABLE):
            self.store.set_server_status(server.id, A.FINISHED)
        self.store.set_client_status(row.id, A.FINISHED)
        return self.client(client_id, tenant)

    async def stop_client(self, row: ClientRow) -> RegisteredClientResponse:
        """Delete the sandbox of every server of the client (its finished ones too: nobody can reuse
        them once it is stopped), and again those an earlier stop failed to delete: asking again
        finishes the job. A failure names how many failed, the first one's reason, and the others."""
        client_id = row.id
        servers = sorted((s for s in self.store.servers(client_id=client_id,
                                                         availability=lifecycle.LIVE | {A.DELETION_FAILED})
                          if s.availability != A.DELETION_FAILED or s.handle), key=lambda s: s.id)
        results = await asyncio.gather(*(self.stop(s, A.STOPPED, "stopped with its client") for s in servers),
                                       return_exceptions=True)
        failed: dict[int, str] = {}
        for server, result in zip(servers, results, strict=True):
            if isinstance(result, BaseException):
                failed[server.id] = f"{type(result).__name__}: {result}"
            elif (fresh := self.store.get_server(server.id)) is not None and fresh.availability == A.DELETION_FAILED:
                failed[server.id] = fresh.details or "deletion failed"
        self.store.set_client_status(client_id, A.DELETION_FAILED if failed else A.STOPPED)
        await self._release_nodes(self.client(client_id, row.tenant))
        if failed:
            (first, reason), *others = failed.items()
            more = f"; and {len(others)} more, servers {[sid for sid, _ in others]} (each one's status says why)" \
                if others else ""
            raise BackendError(f"could not delete {len(failed)} of {len(servers)} servers of client {client_id}: "
                               f"server {first}: {reason}{more}. What was not deleted stays DELETION_FAILED; "
                               "stopping the client again retries it", 500)
        return self.client_response(self.client(client_id, row.tenant))

    # -- starting -------------------------------------------------------------------------------

    def check_can_start(self, req: StartServerRequest, tenant: str) -> ClientRow:
        row = self.client(req.client_id, tenant)
        if lifecycle.is_terminal(row.availability):
            raise Gone(f"client {req.client_id} is {row.availability.value}; register a new client")
        return row

    async def start_server(self, req: StartServerRequest, client: ClientRow) -> StartServerResponse:
        base = dict(namespace=req.namespace, client_id=req.client_id, image_tag=req.image_tag,
                    server_name=req.server_name)
        req = req.model_copy(update={"image_tag": await self.images.startable(client.tenant, req.image_tag)})
        peer = self._network_peer(req, client)
        if req.reuse_strategy != ServerReuseStrategy.NONE and req.snapshot is None and peer is None:
            claimed = self.store.claim_finished(client.id, req.reuse_key())
            if claimed is not None:
                return await self._reuse(claimed, req, base)
        snapshot_source = self._resolve_snapshot(req, client.tenant) if req.snapshot else None
        grant = await self.admission.sandboxes.acquire(  # the creation queue: a turn, not a 429
            (client.tenant, client.id), 1, self.queue_timeout(req.server_start_wait_timeout_in_seconds))
        try:
            now = now_ms()
            server_id = self.store.add_server(ServerRow(
                id=0, client_id=client.id, client_name=client.name, server_name=req.server_name, generated_name="",
                namespace=req.namespace, image_tag=req.image_tag, runtime_class_name=req.runtime_class_name,
                run_as_root=req.run_as_root, server_kind=req.server_kind.value, service_port=req.service_port,
                container_port=req.container_port, availability=A.ALIVE, details="starting", created_at=now,
                last_activity_at=now, keepalive_until=None, max_restarts=req.max_restarts, restarts=0,
                request=req.model_dump_json(), handle=None,
            ))
        finally:
            grant.release()  # the server's row counts from here
        row = self.store.get_server(server_id)
        assert row is not None
        spec = replace(SandboxSpec.from_request(req, server_id, row.generated_name, snapshot_source),
                       network_peer=peer)
        try:
            with self.busy(server_id):
                handle = await self._provision(spec, req.server_start_wait_timeout_in_seconds)
        except BackendError as exc:
            self.store.set_server_status(server_id, A.FAILED_TO_START, exc.message)
            raise ApiError.for_status(exc.status,
                                      f"Error creating IdeGym server {row.generated_name}: {exc.message}") from exc
        except asyncio.CancelledError:
            self.store.set_server_status(server_id, A.FAILED_TO_START, "start cancelled")
            raise
        if not self.store.set_server_status(server_id, A.ALIVE, "", handle=json.dumps(handle.to_json()),
                                            last_activity_at=now_ms()):
            # stopped while starting (its client went away): do not leak the sandbox
            self.spawn(self.delete_handle(handle))
            raise Gone(f"server {server_id} was stopped while it was starting")
        return StartServerResponse(**base, server_id=server_id, generated_name=row.generated_name,
                                   service_name=handle.name, reused=False, need_to_reset=False)

    def queue_timeout(self, start_timeout: float | None) -> float:
        """How long a start waits in the creation queue: ``--queue-timeout``, or less when the
        request's own start timeout is shorter."""
        return min(self.config.sharing.queue_timeout, start_timeout or self.config.sharing.queue_timeout)

    async def give_way(self, row: ServerRow, details: str) -> None:
        """Stop a FINISHED server for a waiting start (``admission``); nothing if it was claimed."""
        with self.busy(row.id):
            if not self.store.set_server_status(row.id, A.STOPPED, details, only_from=[A.FINISHED]):
                return
            if row.handle:
                await self.delete_handle(SandboxHandle.from_json(json.loads(row.handle)))

    def _network_peer(self, req: StartServerRequest, client: ClientRow) -> SandboxHandle | None:
        """The sandbox whose network ``req`` joins: a live server of the same client."""
        if req.network_of is None:
            return None
        peer = self.store.get_server(req.network_of)
        if peer is None or peer.client_id != client.id:
            raise NotFound(f"network_of: no server {req.network_of} of this client")
        if peer.availability not in (A.ALIVE, A.REUSED) or not peer.handle:
            raise Conflict(f"network_of: server {req.network_of} is {peer.availability.value}, not running")
        return SandboxHandle.from_json(json.loads(peer.handle))

    async def _provision(self, spec: SandboxSpec, timeout: float) -> SandboxHandle:
        """A sandbox for ``spec``: claimed from the warm pool when one is ready."""
        if spec.network_peer is not None:  # a pool's sandbox has a network of its own
            return await self.pool.create(spec, timeout or 300)
        if not self.backend.capabilities.warm_pool:
            # e.g. Kubernetes: objects carry the request's labels, volumes, overrides… and the
            # server's own name, so nothing pre-made can stand in for them
            return await self.pool.create(spec, timeout or 300)
        if spec.snapshot_source is not None:
            return await self.pool.create(replace(spec, generated_name=new_sandbox_name()), timeout or 300)
        handle, _warm = await self.pool.acquire(spec, timeout or 300)
        return handle

    async def _reuse(self, row: ServerRow, req: StartServerRequest, base: dict) -> StartServerResponse:
        """RESTART swaps in a fresh sandbox; RESET hands the server over as it is and asks the client
        to reset the project (an OpenEnv server has no project: it is taken over as it is)."""
        if req.reuse_strategy == ServerReuseStrategy.RESTART:
            await self._restart(row, req.server_start_wait_timeout_in_seconds, reuse=True)
        elif req.server_kind == ServerKind.OPENENV:
            self.store.set_server_status(row.id, A.ALIVE, "", only_from=[A.REUSED])
        need_reset = req.reuse_strategy == ServerReuseStrategy.RESET and req.server_kind == ServerKind.IDEGYM
        fresh = self.store.get_server(row.id)
        assert fresh is not None and fresh.handle
        handle = SandboxHandle.from_json(json.loads(fresh.handle))
        return StartServerResponse(**base, server_id=row.id, generated_name=row.generated_name,
                                   service_name=handle.name, reused=True, need_to_reset=need_reset)

    def _resolve_snapshot(self, req: StartServerRequest, tenant: str) -> str:
        assert req.snapshot is not None
        candidates = self.store.snapshots(req.snapshot.id, tenant)
        if req.snapshot.tag:
            candidates = [s for s in candidates if s.tag == req.snapshot.tag or s.id == req.snapshot.tag]
        if not candidates:
            which = f"tag {req.snapshot.tag!r} in group" if req.snapshot.tag else "group"
            raise NotFound(f"no snapshot for {which} {req.snapshot.id!r}; take one with "
                                       "POST /api/idegym-servers/snapshot first")
        return candidates[0].id

    # -- restart, stop, finish ------------------------------------------------------------------

    async def restart_server(self, row: ServerRow, timeout: int) -> ServerActionResponse:
        await self._restart(row, timeout, reuse=False)
        return ServerActionResponse(server_name=row.generated_name, message=f"Restarted {row.generated_name}")

    async def _restart(self, row: ServerRow, timeout: int, reuse: bool) -> None:
        """As fresh as a new sandbox from the image, same server id: swap in a new sandbox."""
        with self.busy(row.id):
            await self._restart_unguarded(row, timeout, reuse)

    async def _restart_unguarded(self, row: ServerRow, timeout: int, reuse: bool) -> None:
        req = StartServerRequest.model_validate_json(row.request)
        client = self.store.get_client(row.client_id) if req.network_of is not None else None
        spec = replace(SandboxSpec.from_request(req, row.id, row.generated_name),
                       network_peer=self._network_peer(req, client) if client is not None else None)
        old = SandboxHandle.from_json(json.loads(row.handle)) if row.handle else None
        try:
            if old is not None and self.backend.capabilities.restart_in_place:
                handle = await self.backend.restart(old, spec, timeout or 300)
                old = None
            else:
                handle = await self._provision(spec, timeout or 300)
        except BackendError as exc:
            self.store.set_server_status(row.id, A.RESTART_FAILED, exc.message)
            if old is not None:
                self.spawn(self.delete_handle(old))
            raise ApiError(f"Restarting {row.generated_name} failed: {exc.message}") from exc
        sources = [A.REUSED] if reuse else [A.ALIVE, A.REUSED]
        if not self.store.set_server_status(row.id, A.ALIVE, "", only_from=sources,
                                            handle=json.dumps(handle.to_json()), last_activity_at=now_ms()):
            self.spawn(self.delete_handle(handle))
            raise Gone(f"server {row.id} stopped while it was restarting")
        if old is not None:
            self.spawn(self.delete_handle(old))

    async def stop_server(self, row: ServerRow) -> ServerActionResponse:
        """Delete the server's sandbox; one an earlier stop failed to delete is tried again."""
        if lifecycle.is_terminal(row.availability) and not (row.availability == A.DELETION_FAILED and row.handle):
            return ServerActionResponse(server_name=row.generated_name,
                                        message=f"{row.generated_name} is already {row.availability.value}")
        await self.stop(row, A.STOPPED, "stopped by its client")
        fresh = self.store.get_server(row.id)
        assert fresh is not None
        if fresh.availability == A.DELETION_FAILED:
            raise BackendError(f"Stopping {row.generated_name} failed: {fresh.details}", 500)
        return ServerActionResponse(server_name=row.generated_name, message=f"Stopped {row.generated_name}")

    def settle_client(self, client_id: str) -> None:
        """A client its stop left DELETION_FAILED is STOPPED once none of its servers is (a retry
        deleted what was left)."""
        client = self.store.get_client(client_id)
        if client is not None and client.availability == A.DELETION_FAILED and \
                not self.store.servers(client_id=client_id, availability=[A.DELETION_FAILED]):
            self.store.set_client_status(client_id, A.STOPPED)

    async def stop(self, row: ServerRow, target: A, details: str) -> bool:
        """Delete the sandbox, then record ``target`` (or DELETION_FAILED: never claim a stop that
        did not happen)."""
        with self.busy(row.id):
            return await self._stop_unguarded(row, target, details)

    async def _stop_unguarded(self, row: ServerRow, target: A, details: str) -> bool:
        if row.handle:
            try:
                await self.delete_handle(SandboxHandle.from_json(json.loads(row.handle)), raise_errors=True)
            except Exception as exc:  # noqa: BLE001
                self.store.set_server_status(row.id, A.DELETION_FAILED, f"deletion failed: {exc}")
                return False
        return self.store.set_server_status(row.id, target, details)

    async def delete_handle(self, handle: SandboxHandle, raise_errors: bool = False) -> None:
        """Delete the sandbox; ``raise_errors`` False: nobody waits for the outcome (it is
        logged), and the backend may remove what is left later (``Backend.retire``)."""
        try:
            await self.forwarder.forget(self.backend.endpoint(handle))
            await (self.backend.delete(handle) if raise_errors else self.backend.retire(handle))
        except Exception:
            if raise_errors:
                raise
            log.exception("could not delete sandbox %s", handle.name)

    def finish_server(self, row: ServerRow) -> ServerActionResponse:
        if not self.store.set_server_status(row.id, A.FINISHED, "", only_from=lifecycle.USABLE,
                                            last_activity_at=now_ms()):
            raise Gone(f"server {row.id} is {row.availability.value}; only ALIVE or REUSED servers can be finished")
        return ServerActionResponse(server_name=row.generated_name,
                                    message=f"{row.generated_name} finished; it can be reused")

    def keepalive(self, row: ServerRow, minutes: float) -> tuple[int, float]:
        if not lifecycle.is_usable(row.availability) and row.availability != A.FINISHED:
            raise Gone(f"server {row.id} is {row.availability.value}")
        now = now_ms()
        until = self.store.extend_keepalive(row.id, now + int(minutes * 60_000))
        return until, max(until - now, 0) / 60_000

    async def status(self, row: ServerRow) -> ServerStatusResponse:
        phase = ready = None
        if row.handle and row.availability in lifecycle.LIVE:
            try:
                seen = await self.backend.observe(SandboxHandle.from_json(json.loads(row.handle)))
                phase, ready = seen.phase or ("Running" if seen.running else "Failed"), seen.ready
            except Exception as exc:  # noqa: BLE001 - status must answer even when the backend cannot
                phase = f"Unknown ({exc})"
        idle = max(time.time() * 1000 - row.last_activity_at, 0) / 1000
        return ServerStatusResponse(**self.summary(row), idle_seconds=idle, pod_phase=phase, pod_ready=ready,
                                    restarts=row.restarts, max_restarts=row.max_restarts)

    def list_servers(self, client_id: uuid.UUID, include_terminal: bool, tenant: str) -> list[ServerSummary]:
        row = self.client(client_id, tenant)
        servers = self.store.servers(client_id=row.id)
        return [ServerSummary(**self.summary(s)) for s in servers
                if include_terminal or not lifecycle.is_terminal(s.availability)]

    # -- snapshots -----------------------------------------------------------------------------

    async def snapshot_server(self, row: ServerRow, tenant: str) -> CreateSnapshotResponse:
        assert row.handle
        handle = SandboxHandle.from_json(json.loads(row.handle))
        group = str(row.id)
        room = await self.snapshot_caps.reserve(1, f"a snapshot of server {row.id}")
        try:
            info = await self.backend.snapshot(handle, group)
            await self.snapshot_caps.check_taken(info.snapshot_id, f"the snapshot of server {row.id}",
                                            self.backend.delete_snapshot)
        except BackendError as exc:
            raise ApiError.for_status(exc.status, f"Snapshotting {row.generated_name} failed: {exc.message}") from exc
        finally:
            room.release()
        tag = info.snapshot_tag or info.snapshot_id
        self.store.add_snapshot(SnapshotRow(
            id=info.snapshot_id, group_id=group, server_id=row.id, namespace=row.namespace,
            image_tag=row.image_tag, server_name=row.server_name, runtime_class_name=row.runtime_class_name,
            run_as_root=row.run_as_root, server_kind=row.server_kind, tag=tag, created_at=now_ms(), tenant=tenant,
        ))
        return CreateSnapshotResponse(server_id=row.id, server_name=row.generated_name, snapshot_id=group,
                                      snapshot_tag=tag)

    # -- crash handling (watcher and forward failures) --------------------------------------------

    async def check_sandbox(self, server_id: int) -> None:
        """Look at a live server's sandbox; restart it within ``max_restarts`` or mark it CRASHED.

        One check per server at a time (the watcher and a failed forward may both ask), and
        none while a stop or restart is under way."""
        if server_id in self._busy:
            return
        with self.busy(server_id):
            row = self.store.get_server(server_id)
            if row is not None:
                await self._check_sandbox(row)

    async def _check_sandbox(self, row: ServerRow) -> None:
        if not row.handle or row.availability not in lifecycle.LIVE:
            return
        handle = SandboxHandle.from_json(json.loads(row.handle))
        try:
            seen = await self.backend.observe(handle)
        except Exception:  # noqa: BLE001 - an unobservable backend is not a crashed sandbox
            log.exception("could not observe sandbox of server %s", row.id)
            return
        if self._busy.get(row.id, 0) > 1:
            return  # a stop or restart began while we looked
        restarts = max(row.restarts, seen.restarts)
        if seen.running and restarts <= row.max_restarts:
            if seen.restarts > row.restarts:
                self.store.update_server(row.id, restarts=seen.restarts)
            return
        reason = seen.reason or ("the sandbox is gone" if not seen.exists else "the sandbox server stopped")
        if not seen.running and restarts < row.max_restarts and row.availability != A.FINISHED:
            self.store.update_server(row.id, restarts=restarts + 1, details=f"restarted after a crash: {reason}")
            try:
                fresh = await self._provision(
                    SandboxSpec.from_request(StartServerRequest.model_validate_json(row.request), row.id,
                                             row.generated_name), 300)
            except BackendError as exc:
                reason = f"{reason}; restart failed: {exc.message}"
            else:
                if self.store.set_server_status(row.id, row.availability, None, only_from=[row.availability],
                                                handle=json.dumps(fresh.to_json())):
                    self.spawn(self.delete_handle(handle))
                    return
                self.spawn(self.delete_handle(fresh))
                return
        details = f"crashed: {reason} (restarts {restarts}, max_restarts {row.max_restarts})"
        if self.store.set_server_status(row.id, A.CRASHED, details):
            log.warning("server %s %s", row.id, details)
            self.spawn(self.delete_handle(handle))

    # -- shutdown -------------------------------------------------------------------------------

    async def close(self, budget: float = 30.0) -> None:
        """Stop within ``budget`` seconds: operations get a short grace, the warm pool is deleted,
        live servers are deleted (``ephemeral``) or kept for the next start on this state."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget

        def left(share: float = 1.0) -> float:
            return max((deadline - loop.time()) * share, 0.05)

        await self.ops.shutdown(grace=min(2.0, left(0.25)))
        await _within("deleting the warm pool", self.pool.close(delete_members=True), left(0.5))
        live = self.store.servers(availability=lifecycle.LIVE)
        if self.config.ephemeral:
            await _within("deleting live servers", asyncio.gather(
                *(self.stop(s, A.STOPPED, "control plane shut down") for s in live), return_exceptions=True),
                left(0.8))
        elif live:
            log.warning("control plane stopped: kept %d live server(s) for the next start on %s", len(live),
                        self.config.state_dir)
        if self._background:
            await asyncio.wait(set(self._background), timeout=left())
        await self.forwarder.close()


def _node_group(row: ClientRow) -> str:
    """Whose nodes a client's reservation keeps: its name's, within its tenant."""
    return f"{row.tenant}/{row.name}" if row.tenant else row.name


async def _within(what: str, work: Awaitable[Any], seconds: float) -> None:
    try:
        await asyncio.wait_for(work, seconds)
    except TimeoutError:
        log.warning("shutdown: %s did not finish within %.1f s", what, seconds)
