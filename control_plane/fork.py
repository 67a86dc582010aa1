"""``POST /api/idegym-servers/fork``: one live server into ``count`` new ones (``docs/fork.md``).

Each child is an ordinary server of the parent's client, with the parent's request (image,
limits, kind, root), its own id and ``generated_name``, and the parent's whole filesystem as it
was at one instant: the backend copies no process (``Backend.fork``). Children are reused,
kept alive, snapshotted, stopped and forked again like any server; a RESTART (or a crash
restart) gives a child a fresh sandbox of the image, as for any server.

Refused before an operation is made: an unknown server or another client's (404), a FINISHED
one (409: handed back for reuse, it may be reset at any moment), a stopped or crashed one (410),
a backend that cannot fork (400); ``count`` outside 1..64 is a validation error (422). The
children wait for their turn in the creation queue (``admission.py``) like any start; the
operation fails with 429 when they waited too long, or could never fit a limit.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace

from . import lifecycle
from .backends.base import BackendError, ForkChild, SandboxHandle, SandboxSpec
from .errors import ApiError, BadRequest, Conflict, Gone, NotFound
from .models import AvailabilityStatus as A
from .models import ForkedServer, ForkServerRequest, ForkServerResponse, StartServerRequest
from .pool import HOLD_OFF_AFTER_FORK, new_sandbox_name
from .service import ControlPlane
from .store import ServerRow, now_ms

log = logging.getLogger(__name__)


def check_can_fork(cp: ControlPlane, req: ForkServerRequest, tenant: str) -> ServerRow:
    """The parent, when it can be forked now (else the error that says why)."""
    row = cp.owned_server(req.client_id, req.server_id, tenant)
    if row.namespace != req.namespace:
        raise NotFound(f"server {req.server_id} is not in namespace {req.namespace!r} (it is in {row.namespace!r})")
    if row.availability == A.FINISHED:
        raise Conflict(f"server {row.id} is FINISHED: it was handed back for reuse and may be reset at any moment; "
                       "fork a server before finishing it")
    if not lifecycle.is_usable(row.availability) or not row.handle:
        detail = f": {row.details}" if row.details else ""
        raise Gone(f"server {row.id} is {row.availability.value}, not running: nothing to fork{detail}")
    if not cp.backend.capabilities.fork:
        raise BadRequest(f"the {cp.backend.name} backend cannot fork servers here (the local backend needs "
                         "bubblewrap isolation; Kubernetes needs GKE pod snapshots)")
    return row


def child_request(parent: ServerRow, server_name: str | None) -> StartServerRequest:
    """A child's request: the parent's, under ``server_name`` when given, never restoring a
    snapshot (its own restart starts from the image)."""
    req = StartServerRequest.model_validate_json(parent.request)
    return req.model_copy(update={"server_name": server_name or req.server_name, "snapshot": None})


async def fork_server(cp: ControlPlane, parent: ServerRow, req: ForkServerRequest) -> ForkServerResponse:
    child_req = child_request(parent, req.server_name)
    owner = cp.store.get_client(parent.client_id)
    grant = await cp.admission.sandboxes.acquire(  # the children wait their turn like any start
        (owner.tenant if owner else "", parent.client_id), req.count,
        cp.queue_timeout(child_req.server_start_wait_timeout_in_seconds))
    now = now_ms()
    try:  # one transaction for all the children's rows
        rows = cp.store.add_servers(replace(
            parent, id=0, server_name=child_req.server_name, generated_name="", availability=A.ALIVE,
            details=f"forking from server {parent.id}", created_at=now, last_activity_at=now,
            keepalive_until=None, restarts=0, request=child_req.model_dump_json(), handle=None), req.count)
    finally:
        grant.release()  # the children's rows count from here
    specs = [replace(SandboxSpec.from_request(child_req, row.id, row.generated_name), generated_name=new_sandbox_name())
             for row in rows]
    template = SandboxSpec.from_request(child_req, parent.id, parent.generated_name)
    warm = cp.pool.take(template, req.count) if cp.backend.capabilities.warm_pool else []
    children = [ForkChild(spec, warm[i] if i < len(warm) else None) for i, spec in enumerate(specs)]
    names = {s.generated_name for s in specs} | {h.name for h in warm}
    cp.creating.update(names)  # the orphan sweep leaves them alone until they are recorded
    assert parent.handle
    ids = [row.id for row in rows]
    timeout = child_req.server_start_wait_timeout_in_seconds or 300
    try:
        handles = await cp.backend.fork(SandboxHandle.from_json(json.loads(parent.handle)), children, timeout)
    except BackendError as exc:
        cp.store.set_servers_status(dict.fromkeys(ids, {}), A.FAILED_TO_START,
                                    f"fork of server {parent.id} failed: {exc.message}")
        raise ApiError.for_status(exc.status, f"Forking server {parent.id} ({parent.generated_name}) failed: "
                                             f"{exc.message}") from exc
    except asyncio.CancelledError:
        cp.store.set_servers_status(dict.fromkeys(ids, {}), A.FAILED_TO_START, "fork cancelled")
        raise
    finally:
        cp.creating.difference_update(names)
        if warm:
            cp.pool.refill(template, after=HOLD_OFF_AFTER_FORK)
    servers = []
    now = now_ms()
    alive = cp.store.set_servers_status({row.id: {"handle": json.dumps(handle.to_json()), "last_activity_at": now}
                                         for row, handle in zip(rows, handles, strict=True)}, A.ALIVE, "")
    for row, handle in zip(rows, handles, strict=True):
        if alive[row.id]:
            servers.append(ForkedServer(server_id=row.id, generated_name=row.generated_name,
                                        service_name=handle.name))
        else:  # stopped while forking (its client went away): do not leak the sandbox
            cp.spawn(cp.delete_handle(handle))
    if len(servers) < len(rows):
        raise Gone(f"servers {[r.id for r in rows if r.id not in {s.server_id for s in servers}]} "
                   "were stopped while they were being forked")
    log.info("forked server %s into %s", parent.id, [s.server_id for s in servers])
    return ForkServerResponse(server_id=parent.id, server_name=parent.generated_name, servers=servers)

