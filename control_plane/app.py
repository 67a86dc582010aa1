"""The control plane's HTTP API: app factory, routes and thin handlers.

Handlers validate (422 in the shape of ``specs/``), check ownership (404) and usability (410)
synchronously, then either answer or hand the work to an asynchronous operation (202 with its
id). Forwards also honour ``Prefer: wait=<seconds>`` (RFC 7240): the sandbox's answer comes back
in the same response, and the call is still recorded as an operation.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from uuid import UUID

from aiohttp import web
from pydantic import BaseModel

from sandbox_server import routes
from sandbox_server.http import parse_model
from sandbox_server.models import ExecuteRequest
from sandbox_server.openapi import Route, build_openapi

from . import __version__
from . import fork as forking
from .auth import TOKEN_USER, token_credentials, token_path
from .backends.base import Backend, SandboxAddress
from .body_budget import COPIES, BodyBudget, BodyReservation
from .code_runner import CodeRunnerPool
from .config import ControlPlaneConfig
from .constants import OPERATION_HEADER, PREFERENCE_APPLIED_HEADER, SANDBOX_HEADER
from .errors import ApiError, BadRequest, NotFound, render
from .forward_calls import ForwardedCall, Forwards, prefer_wait
from .forward_protocol import Forwarding, keep_alive_value
from .http import (
    RESERVATION,
    M,
    basic_auth,
    error_response,
    json_response,
    middleware,
    path_int,
    path_uuid,
    query_model,
    read_body,
    read_model,
)
from .jobs import ImageJobs, SnapshotJobs
from .metrics import Metrics
from .models import (
    AsyncOperationStatus,
    AsyncOperationStatusResponse,
    AsyncOperationType,
    BuildFromYamlRequest,
    BuildFromYamlResponse,
    CreateSnapshotRequest,
    CreateSnapshotResponse,
    ErrorResponse,
    FinishClientRequest,
    FinishServerRequest,
    ForkServerRequest,
    ForkServerResponse,
    ForwardRequestResponse,
    HealthCheckResponse,
    JobStatusResponse,
    KeepaliveServerRequest,
    KeepaliveServerResponse,
    ListServersQuery,
    ListServersResponse,
    MissingUploadsRequest,
    MissingUploadsResponse,
    PrepareSnapshotsRequest,
    PrepareSnapshotsResponse,
    PrepareSnapshotsStatusResponse,
    RegisterClientRequest,
    RegisteredClientResponse,
    RestartServerRequest,
    SendClientHeartbeatRequest,
    ServerActionResponse,
    ServerQuery,
    ServerStatusResponse,
    SnapshotExistsRequest,
    SnapshotExistsResponse,
    SnapshotJobStatusResponse,
    StartServerRequest,
    StartServerResponse,
    Status,
    StopClientRequest,
    StopClientResponse,
    StopServerRequest,
    UploadQuery,
    UploadResponse,
)
from .sandbox_http import ForwardError
from .service import ControlPlane
from .startup import Shutdown, lifecycle_context
from .store import SQLiteStore
from .tenants import Tenants, authenticator, tenant_of
from .watcher import Watcher

log = logging.getLogger(__name__)

CP = web.AppKey("control_plane", ControlPlane)
WATCHER = web.AppKey("watcher", Watcher)
IMAGES = web.AppKey("images", ImageJobs)
SNAPSHOTS = web.AppKey("snapshots", SnapshotJobs)
METRICS = web.AppKey("metrics", Metrics)
RUNNER = web.AppKey("runner", CodeRunnerPool)
FORWARDS = web.AppKey("forwards", Forwards)
SHUTDOWN = web.AppKey("shutdown", Shutdown)
TENANTS = web.AppKey("tenants", Tenants)
FORWARDING = web.AppKey("forwarding", Forwarding)

def _cp(request: web.Request) -> ControlPlane:
    return request.app[CP]


async def _read(request: web.Request, model: type[M]) -> tuple[M, ControlPlane]:
    """The request's body as ``model`` (422 when it is not one), and the control plane."""
    return await read_model(request, model), _cp(request)


def _accepted(model: BaseModel) -> web.Response:
    return json_response(model, status=202)


async def _accepted_or_wait(request: web.Request, op_id: int, model: BaseModel) -> web.Response:
    """202 with the operation id; with ``Prefer: wait=N``, the operation's own result once it ends
    (its success model, or its error status with the ``ErrorResponse`` body)."""
    wait = prefer_wait(request.headers)
    cp = _cp(request)
    outcome = None if wait is None else await cp.ops.outcome(op_id, wait)
    if outcome is None:
        return _accepted(model)
    headers = {OPERATION_HEADER: str(op_id), PREFERENCE_APPLIED_HEADER: f"wait={wait:g}"}
    if outcome.status == AsyncOperationStatus.SUCCEEDED:
        return web.Response(text=outcome.result, content_type="application/json", headers=headers)
    failed = ErrorResponse.model_validate_json(outcome.result)
    return error_response(ApiError.for_status(failed.status_code or 500, failed.body or ""), headers)


# -- clients --------------------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    return json_response(HealthCheckResponse(status="healthy", message=f"idegym control plane {__version__}"))


async def register_client(request: web.Request) -> web.Response:
    req, cp = await _read(request, RegisterClientRequest)
    row = cp.register_client(req.name, req.namespace, req.nodes_count, tenant_of(request))
    if cp.needs_nodes(req.nodes_count):
        op = cp.ops.submit(AsyncOperationType.REGISTER_CLIENT_WITH_NODES, req.model_dump_json(),
                           lambda: cp.reserve_nodes(row), client_id=row.id)
        return await _accepted_or_wait(request, op, cp.client_response(row, operation_id=op))
    return json_response(cp.client_response(row))


async def heartbeat(request: web.Request) -> web.Response:
    req, cp = await _read(request, SendClientHeartbeatRequest)
    return json_response(cp.client_response(cp.heartbeat(req.client_id, req.availability, tenant_of(request))))


async def finish_client(request: web.Request) -> web.Response:
    req, cp = await _read(request, FinishClientRequest)
    return json_response(cp.client_response(cp.finish_client(req.client_id, tenant_of(request))))


async def stop_client(request: web.Request) -> web.Response:
    req, cp = await _read(request, StopClientRequest)
    row = cp.client(req.client_id, tenant_of(request))
    op = cp.ops.submit(AsyncOperationType.STOP_CLIENT, req.model_dump_json(), lambda: cp.stop_client(row),
                       client_id=row.id)
    return await _accepted_or_wait(request, op, StopClientResponse(operation_id=op))


# -- servers --------------------------------------------------------------------------------------


async def start_server(request: web.Request) -> web.Response:
    req, cp = await _read(request, StartServerRequest)
    client = cp.check_can_start(req, tenant_of(request))
    op = cp.ops.submit(AsyncOperationType.START_SERVER, req.model_dump_json(),
                       lambda: cp.start_server(req, client), client_id=client.id)
    return await _accepted_or_wait(request, op, StartServerResponse(namespace=req.namespace,
                                                                   client_id=req.client_id, operation_id=op))


async def stop_server(request: web.Request) -> web.Response:
    req, cp = await _read(request, StopServerRequest)
    row = cp.owned_server(req.client_id, req.server_id, tenant_of(request))
    op = cp.ops.submit(AsyncOperationType.STOP_SERVER, req.model_dump_json(), lambda: cp.stop_server(row),
                       client_id=row.client_id, server_id=row.id)
    return await _accepted_or_wait(request, op, ServerActionResponse(
        server_name=row.generated_name, message=f"Stop initiated for {row.generated_name}", operation_id=op))


async def finish_server(request: web.Request) -> web.Response:
    req, cp = await _read(request, FinishServerRequest)
    return json_response(cp.finish_server(cp.owned_server(req.client_id, req.server_id, tenant_of(request))))


async def restart_server(request: web.Request) -> web.Response:
    req, cp = await _read(request, RestartServerRequest)
    row = cp.usable_server(req.client_id, req.server_id, tenant_of(request))
    op = cp.ops.submit(AsyncOperationType.RESTART_SERVER, req.model_dump_json(),
                       lambda: cp.restart_server(row, req.server_start_wait_timeout_in_seconds),
                       client_id=row.client_id, server_id=row.id)
    return await _accepted_or_wait(request, op, ServerActionResponse(
        server_name=row.generated_name, message=f"Restart initiated for {row.generated_name}", operation_id=op))


async def keepalive(request: web.Request) -> web.Response:
    req, cp = await _read(request, KeepaliveServerRequest)
    until, minutes = cp.keepalive(cp.owned_server(req.client_id, req.server_id, tenant_of(request)), req.minutes)
    return json_response(KeepaliveServerResponse(server_id=req.server_id, keepalive_until=until, minutes=minutes))


async def list_servers(request: web.Request) -> web.Response:
    q = query_model(request, ListServersQuery)
    servers = _cp(request).list_servers(q.client_id, q.include_terminal, tenant_of(request))
    return json_response(ListServersResponse(client_id=q.client_id, servers=servers))


async def server_status(request: web.Request) -> web.Response:
    cp = _cp(request)
    row = cp.owned_server(query_model(request, ServerQuery).client_id, path_int(request, "server_id"),
                          tenant_of(request))
    return json_response(await cp.status(row))


async def capabilities(request: web.Request) -> web.Response:
    cp = _cp(request)
    row = cp.usable_server(query_model(request, ServerQuery).client_id, path_int(request, "server_id"),
                           tenant_of(request))
    try:
        reply = await cp.forwarder.request(cp.endpoint_of(row), "GET", routes.CAPABILITIES.relative, timeout=30)
    except ForwardError as exc:
        return error_response(exc)
    return web.Response(body=reply.body, status=reply.status, content_type="application/json")


async def snapshot_server(request: web.Request) -> web.Response:
    req, cp = await _read(request, CreateSnapshotRequest)
    tenant = tenant_of(request)
    row = cp.usable_server(req.client_id, req.server_id, tenant)
    if not cp.backend.capabilities.snapshots:
        raise BadRequest(f"Pod snapshot feature is not enabled on the {cp.backend.name} backend")
    op = cp.ops.submit(AsyncOperationType.SNAPSHOT_SERVER, req.model_dump_json(),
                       lambda: cp.snapshot_server(row, tenant),
                       client_id=row.client_id, server_id=row.id)
    return await _accepted_or_wait(request, op, CreateSnapshotResponse(server_id=row.id, server_name=row.generated_name,
                                                                      operation_id=op))


async def fork_server(request: web.Request) -> web.Response:
    req, cp = await _read(request, ForkServerRequest)
    row = forking.check_can_fork(cp, req, tenant_of(request))
    op = cp.ops.submit(AsyncOperationType.FORK_SERVER, req.model_dump_json(), lambda: forking.fork_server(cp, row, req),
                       client_id=row.client_id, server_id=row.id)
    return await _accepted_or_wait(request, op, ForkServerResponse(server_id=row.id, server_name=row.generated_name,
                                                                  operation_id=op))


# -- operations, jobs, snapshots ------------------------------------------------------------------


async def operation_status(request: web.Request) -> web.Response:
    op_id = path_int(request, "operation_id")
    row = _cp(request).store.tenant_operation(op_id, tenant_of(request))
    if row is None:
        raise NotFound(f"operation {op_id} not found (operations are kept for the configured retention)")
    return json_response(AsyncOperationStatusResponse(
        id=row.id, request_type=row.request_type, status=row.status, request=row.request, result=row.result,
        client_id=UUID(row.client_id) if row.client_id else None, server_id=row.server_id,
        orchestrator_pod=row.orchestrator_pod, scheduled_at=row.scheduled_at, started_at=row.started_at,
        finished_at=row.finished_at,
    ))


async def build_images(request: web.Request) -> web.Response:
    req = await read_model(request, BuildFromYamlRequest)
    tenant = tenant_of(request)
    client = str(_cp(request).client(req.client_id, tenant).id) if req.client_id else ""
    return json_response(BuildFromYamlResponse(job_names=request.app[IMAGES].submit(req.yaml_content, tenant,
                                                                                    client)))


async def missing_uploads(request: web.Request) -> web.Response:
    req = await read_model(request, MissingUploadsRequest)
    return json_response(MissingUploadsResponse(missing=_cp(request).uploads.missing(tenant_of(request), req.digests)))


async def put_upload(request: web.Request) -> web.Response:
    q = query_model(request, UploadQuery)
    tenant = tenant_of(request)
    client = str(_cp(request).client(q.client_id, tenant).id) if q.client_id else ""
    answer = await _cp(request).uploads.receive(request, tenant, request.match_info["digest"], client)
    return json_response(answer, status=201 if answer.stored else 200)


async def delete_upload(request: web.Request) -> web.Response:
    digest = request.match_info["digest"]
    if not _cp(request).uploads.remove(tenant_of(request), digest):
        raise NotFound(f"upload {digest} not found")
    return web.Response(status=204)


async def job_status(request: web.Request) -> web.Response:
    name = request.match_info["job_name"]
    job = _cp(request).store.get_job(name, tenant_of(request))
    if job is None:
        raise NotFound(f"job {name!r} not found; POST /api/build-push-images returns job names")
    return json_response(JobStatusResponse(id=job.id, job_name=job.job_name, status=Status(job.status),
                                           created_at=job.created_at, updated_at=job.updated_at,
                                           details=job.details, tag=job.tag, request_id=job.request_id))


async def prepare_snapshots(request: web.Request) -> web.Response:
    req = await read_model(request, PrepareSnapshotsRequest)
    return _accepted(PrepareSnapshotsResponse(request_id=await request.app[SNAPSHOTS].submit(req.requests,
                                                                                             tenant_of(request))))


async def prepare_status(request: web.Request) -> web.Response:
    status = request.app[SNAPSHOTS].status(request.match_info["request_id"], tenant_of(request))
    if status is None:
        raise NotFound(f"snapshot preparation {request.match_info['request_id']!r} not found")
    return json_response(status)


async def snapshot_job(request: web.Request) -> web.Response:
    job = request.app[SNAPSHOTS].job(request.match_info["job_id"], tenant_of(request))
    if job is None:
        raise NotFound(f"snapshot job {request.match_info['job_id']!r} not found")
    return json_response(job)


async def snapshot_exists(request: web.Request) -> web.Response:
    q = query_model(request, SnapshotExistsRequest)
    cp, tenant = _cp(request), tenant_of(request)
    image = cp.images.resolve(tenant, q.image_tag) or q.image_tag  # servers record the image they ran
    snap = cp.store.find_snapshot(q.namespace, image, q.server_name, q.runtime_class_name, q.run_as_root,
                                  q.server_kind.value, tenant)
    if snap is None:
        return json_response(SnapshotExistsResponse(exists=False))
    return json_response(SnapshotExistsResponse(exists=True, snapshot_name=snap.group_id, snapshot_tag=snap.tag))


# -- forwarding -----------------------------------------------------------------------------------


@dataclass
class Relayed:
    """A forward's answer, for aiohttp's handler and ``forward_protocol`` alike."""

    status: int
    headers: dict[str, str]  # but Content-Type
    body: bytes
    content_type: str


async def relay(app: web.Application, endpoint: SandboxAddress, call: ForwardedCall,
                reservation: BodyReservation | None = None) -> Relayed:
    """Forward ``call`` to its sandbox at ``endpoint``: the sandbox's answer, the 202 of an
    operation, or the forward's failure. ``reservation`` is held until the sandbox has answered."""
    try:
        answer = await app[FORWARDS].forward(call, endpoint, reservation.release if reservation else None)
    except BaseException:
        if reservation is not None:
            reservation.release()
        raise
    if answer.value is None:
        accepted = ForwardRequestResponse(async_operation_id=answer.operation_id)
        return Relayed(202, {}, accepted.model_dump_json(by_alias=True).encode(), "application/json")
    extra = {OPERATION_HEADER: str(answer.operation_id), PREFERENCE_APPLIED_HEADER: f"wait={answer.waited:g}"}
    value = answer.value
    if isinstance(value, ForwardError):
        return Relayed(value.status, extra, render(value), "application/json")
    headers = {k: v for k, v in value.headers.items() if k != "content-type"}
    headers.update(extra)
    headers[SANDBOX_HEADER] = "sandbox"
    return Relayed(value.status, headers, value.body,
                   value.headers.get("content-type", "application/json").split(";")[0])


async def forward(request: web.Request) -> web.StreamResponse:
    cp = _cp(request)
    client_id = path_uuid(request, "client_id")
    server_id = path_int(request, "server_id")
    path = request.match_info["path"]
    if request.query_string:
        path = f"{path}?{request.query_string}"
    endpoint = cp.forward_endpoint(client_id, server_id, tenant_of(request))
    body = await read_body(request, cp.config.max_body_bytes)
    call = ForwardedCall(client_id, server_id, request.method, path, request.headers, body)
    answer = await relay(request.app, endpoint, call, request.pop(RESERVATION, None))
    return web.Response(body=answer.body, status=answer.status, headers=answer.headers,
                        content_type=answer.content_type)


async def ws_forward(request: web.Request) -> web.StreamResponse:
    from .openenv_ws import relay

    cp = _cp(request)
    row = cp.usable_server(path_uuid(request, "client_id"), path_int(request, "server_id"), tenant_of(request))
    return await relay(request, cp, row)


# -- code runner ------------------------------------------------------------------------------------


async def execute(request: web.Request) -> web.Response:
    body = await request.read()
    parse_model(body, ExecuteRequest)  # 422 here, before a sandbox is spent on it
    reply = await request.app[RUNNER].run("POST", routes.EXECUTE.relative, body)
    return web.Response(body=reply.body, status=reply.status, content_type="application/json")


async def languages(request: web.Request) -> web.Response:
    reply = await request.app[RUNNER].languages()
    return web.Response(body=reply.body, status=reply.status, content_type="application/json")


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


@functools.cache
def openapi_document() -> dict:
    """Built on first use: it took 28 ms of CPU at every start, and few clients ask for it."""
    return build_openapi(ROUTES, title="IdeGym control plane", version=__version__)


async def metrics(request: web.Request) -> web.Response:
    return request.app[METRICS].render(request.app[CP], tenant_of(request))


ROUTES: tuple[Route, ...] = (
    Route("GET", "/health", health, "Health", "health_health_get", None, HealthCheckResponse),
    Route("POST", "/api/clients", register_client, "Register Client", "register_client_api_clients_post",
          RegisterClientRequest, RegisteredClientResponse),
    Route("POST", "/api/clients/heartbeat", heartbeat, "Send Heartbeat", "send_heartbeat_api_clients_heartbeat_post",
          SendClientHeartbeatRequest, RegisteredClientResponse),
    Route("DELETE", "/api/clients", stop_client, "Stop Client", "stop_client_api_clients_delete",
          StopClientRequest, StopClientResponse, async_operation=True),
    Route("POST", "/api/clients/finish", finish_client, "Finish Client", "finish_client_api_clients_finish_post",
          FinishClientRequest, RegisteredClientResponse),
    Route("POST", "/api/idegym-servers", start_server, "Start Server", "start_server_api_idegym_servers_post",
          StartServerRequest, StartServerResponse, async_operation=True),
    Route("DELETE", "/api/idegym-servers", stop_server, "Stop Server", "stop_server_api_idegym_servers_delete",
          StopServerRequest, ServerActionResponse, async_operation=True),
    Route("GET", "/api/idegym-servers", list_servers, "List Servers", "list_servers_api_idegym_servers_get",
          None, ListServersResponse, query=ListServersQuery),
    Route("POST", "/api/idegym-servers/finish", finish_server, "Finish Server",
          "finish_server_api_idegym_servers_finish_post", FinishServerRequest, ServerActionResponse),
    Route("GET", "/api/idegym-servers/{server_id}/capabilities", capabilities, "Capabilities",
          "capabilities_api_idegym_servers__server_id__capabilities_get", None, None, query=ServerQuery),
    Route("POST", "/api/idegym-servers/keepalive", keepalive, "Keepalive",
          "keepalive_api_idegym_servers_keepalive_post", KeepaliveServerRequest, KeepaliveServerResponse),
    Route("GET", "/api/idegym-servers/{server_id}/status", server_status, "Server Status",
          "server_status_api_idegym_servers__server_id__status_get", None, ServerStatusResponse, query=ServerQuery),
    Route("POST", "/api/idegym-servers/restart", restart_server, "Restart Server",
          "restart_server_api_idegym_servers_restart_post", RestartServerRequest, ServerActionResponse,
          async_operation=True),
    Route("POST", "/api/idegym-servers/snapshot", snapshot_server, "Create Snapshot",
          "create_snapshot_api_idegym_servers_snapshot_post", CreateSnapshotRequest, CreateSnapshotResponse,
          async_operation=True),
    Route("POST", "/api/idegym-servers/fork", fork_server, "Fork Server", "fork_server_api_idegym_servers_fork_post",
          ForkServerRequest, ForkServerResponse, async_operation=True),
    Route("POST", "/api/build-push-images", build_images, "Build And Push", "build_and_push_api_build_push_images_post",
          BuildFromYamlRequest, BuildFromYamlResponse),
    Route("POST", "/api/uploads/missing", missing_uploads, "Missing Uploads",
          "missing_uploads_api_uploads_missing_post", MissingUploadsRequest, MissingUploadsResponse),
    Route("PUT", "/api/uploads/{digest}", put_upload, "Upload A Tree", "put_upload_api_uploads__digest__put",
          None, UploadResponse, query=UploadQuery),
    Route("DELETE", "/api/uploads/{digest}", delete_upload, "Delete An Upload",
          "delete_upload_api_uploads__digest__delete", None, None),
    Route("GET", "/api/jobs/status/{job_name}", job_status, "Job Status", "job_status_api_jobs_status__job_name__get",
          None, JobStatusResponse),
    Route("GET", "/api/operations/status/{operation_id}", operation_status, "Operation Status",
          "get_operation_status_api_operations_status__operation_id__get", None, AsyncOperationStatusResponse),
    Route("POST", "/api/snapshots/prepare", prepare_snapshots, "Prepare Snapshots",
          "prepare_snapshots_api_snapshots_prepare_post", PrepareSnapshotsRequest, PrepareSnapshotsResponse,
          async_operation=True),
    Route("GET", "/api/snapshots/prepare/{request_id}", prepare_status, "Prepare Snapshots Status",
          "prepare_status_api_snapshots_prepare__request_id__get", None, PrepareSnapshotsStatusResponse),
    Route("GET", "/api/snapshots/jobs/{job_id}", snapshot_job, "Get Snapshot Job Status",
          "snapshot_job_api_snapshots_jobs__job_id__get", None, SnapshotJobStatusResponse),
    Route("GET", "/api/snapshots/exists", snapshot_exists, "Snapshot Exists",
          "snapshot_exists_api_snapshots_exists_get", None, SnapshotExistsResponse, query=SnapshotExistsRequest),
    Route("POST", routes.EXECUTE.path, execute, "Run code, isolated from other runs", "execute", ExecuteRequest, None),
    Route("GET", routes.LANGUAGES.path, languages, "Available languages", "languages", None, None),
)

FORWARD_METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")


# -- middlewares and factory ----------------------------------------------------------------------


def required_credentials(config: ControlPlaneConfig) -> tuple[str, str] | None:
    """What every route but ``/health`` requires without a tenants file: ``--auth USER:PASSWORD``,
    else the state directory's token (made on first start); None only with ``--auth none``."""
    if config.no_auth:
        log.warning("AUTHENTICATION IS OFF (--auth none): anyone who can connect to this control plane "
                    "can start sandboxes, build images from allowed directories and run commands")
        return None
    return config.auth or token_credentials(config.state_dir)


def create_app(config: ControlPlaneConfig, backend: Backend | None = None) -> web.Application:
    """Build the control plane. Nothing runs until the app is started (cleanup context)."""
    from .images import parse_build_yaml

    config.state_dir.mkdir(parents=True, exist_ok=True)
    tenants = Tenants(config.tenants) if config.tenants is not None else None  # a bad file: refused now
    backend = backend or config.backend.build()
    store = SQLiteStore(config.db_path)
    cp = ControlPlane(config, store, backend)
    watcher = Watcher(cp, config.watcher)
    builder = backend.image_builder()
    cp.images.builder = builder
    images = ImageJobs(cp, builder, builder.parse_yaml if builder is not None else parse_build_yaml)
    meter = Metrics()
    shutdown = Shutdown()
    authenticate = None
    if tenants is not None:
        authenticate = authenticator(tenants)
    elif (credentials := required_credentials(config)) is not None:
        hint = (f"user {TOKEN_USER!r} and the token in {token_path(config.state_dir)} as password"
                if config.auth is None else "the credentials given to --auth")
        authenticate = basic_auth(credentials, hint)
    budget = BodyBudget(config.body_budget_bytes or COPIES * config.max_body_bytes, config.body_wait)
    middlewares = [middleware("control plane", meter.observe, config.max_body_bytes, authenticate, shutdown, budget)]
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=middlewares)
    app[CP] = cp
    app[WATCHER] = watcher
    app[IMAGES] = images
    app[SNAPSHOTS] = SnapshotJobs(cp)
    app[METRICS] = meter
    app[RUNNER] = CodeRunnerPool(cp, config.runner_image, config.runner_concurrency)
    app[FORWARDS] = Forwards(cp, meter)
    app[SHUTDOWN] = shutdown
    app[FORWARDING] = Forwarding(app, cp, meter, shutdown, authenticate)
    if tenants is not None:
        app[TENANTS] = tenants
    app.cleanup_ctx.append(lifecycle_context(cp, watcher, images, shutdown))
    app.cleanup_ctx.append(app[RUNNER].context)  # after the backend starts, ends before it closes
    for route in ROUTES:
        app.router.add_route(route.method, route.path, route.handler)
    for method in FORWARD_METHODS:
        app.router.add_route(method, "/api/forward/{client_id}/{server_id}/{path:.*}", forward)
    app.router.add_get("/api/ws-forward/{client_id}/{server_id}/ws", ws_forward)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/metrics", metrics)
    app.on_response_prepare.append(_say_keep_alive(config.header_timeout))
    return app


def _say_keep_alive(idle: float) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """aiohttp's answers say how long their connection may idle (``Keep-Alive``), as the forwards' do."""
    value = keep_alive_value(idle)

    async def say(request: web.Request, response: web.StreamResponse) -> None:
        if request.keep_alive and not isinstance(response, web.WebSocketResponse):
            response.headers.setdefault("Keep-Alive", value)

    return say


__all__ = ["create_app", "ROUTES", "CP"]
