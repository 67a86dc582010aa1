"""Plans for every public call, shared by the sync and async clients (see ``_protocol.py``)."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError as PydanticValidationError

from control_plane.models import (
    CreateSnapshotResponse,
    ForkedServer,
    ForkServerRequest,
    ForkServerResponse,
    JobStatusResponse,
    KeepaliveServerResponse,
    ListServersResponse,
    RegisteredClientResponse,
    ServerActionResponse,
    ServerStatusResponse,
    StartServerRequest,
    StartServerResponse,
)
from sandbox_server import models as m
from sandbox_server import routes
from sandbox_server.routes import endpoint_for

from ..errors import ServerError
from ._exceptions import invalid_request
from ._protocol import Plan, Target, call, cp_call, cp_operation, wire

if TYPE_CHECKING:
    from ..tools import ToolCall

ToolResult = m.Response
"""What a tool call answers: its route's response model (``routes.endpoint_for(request).response``),
e.g. bash its output, a file write its status, a read the bytes it got."""

# -- sandbox ---------------------------------------------------------------------------------------


def bash(target: Target, command: str, timeout: float, cwd: str | None, env: dict[str, str] | None,
         user: str | None, max_output_bytes: int | None, strip_output: bool,
         grace: float) -> Plan[m.BashCommandResponse]:
    return (yield from call(target, routes.BASH, wire(
        m.BashCommandRequest, command=command, cwd=cwd, env=env or {}, user=user, timeout=timeout,
        graceful_termination_timeout=grace, max_output_bytes=max_output_bytes, strip_output=strip_output)))


def write_file(target: Target, path: str, content: str) -> Plan[m.FileResult]:
    if not isinstance(content, str):
        raise TypeError(f"write_file takes text (str), not {type(content).__name__}; "
                        "send bytes with upload(path, data)")
    return (yield from call(target, routes.CREATE_FILE, wire(m.CreateFileRequest, file_path=path, content=content)))


def edit(target: Target, path: str, start_line: int, end_line: int, new_content: str) -> Plan[m.FileResult]:
    return (yield from call(target, routes.EDIT_FILE, wire(
        m.EditFileRequest, file_path=path, start_line=start_line, end_line=end_line, new_content=new_content)))


def patch(target: Target, path: str, patch_text: str) -> Plan[m.FileResult]:
    return (yield from call(target, routes.PATCH_FILE, wire(m.PatchFileRequest, file_path=path, patch=patch_text)))


def upload(target: Target, path: str, data: bytes, chunk: int) -> Plan[int]:
    if chunk < 1:
        raise ValueError("chunk must be at least 1 byte")
    offset = 0
    while True:
        piece = data[offset: offset + chunk]
        answer = yield from call(target, routes.UPLOAD_FILE, wire(
            m.UploadFileChunkRequest, file_path=path, content_base64=base64.b64encode(piece).decode("ascii"),
            offset=offset, truncate=True))
        offset += answer.bytes_written
        if offset >= len(data):
            return answer.size


def download(target: Target, path: str, chunk: int) -> Plan[bytes]:
    parts: list[bytes] = []
    offset = 0
    while True:
        answer = yield from call(target, routes.DOWNLOAD_FILE,
                                 wire(m.DownloadFileChunkRequest, file_path=path, offset=offset, length=chunk))
        piece = base64.b64decode(answer.content_base64, validate=True)
        parts.append(piece)
        offset += len(piece)
        if answer.eof or not piece:
            return b"".join(parts)


def run_tool(target: Target, tool_call: ToolCall, bash_timeout: float) -> Plan[ToolResult]:
    """The sandbox-server call that carries out ``tool_call`` (an ``idegym_env.tools`` tool call)."""
    try:
        request = tool_call.to_request(bash_timeout)
    except PydanticValidationError as exc:
        raise invalid_request(exc) from None
    if request is None:
        raise ValueError(f"{tool_call.tool!r} is not a sandbox call: the environment carries it out")
    # the route is found at run time; its response model is one of the tools' (a `Response`)
    result: ToolResult = yield from call(target, endpoint_for(request), request)
    return result


def setup_check(target: Target, script: str, timeout: float, keep_processes: bool = False) -> Plan[m.CheckResult]:
    return (yield from call(target, routes.SETUP_CHECK, wire(m.SetupRequest, setup_check_script=script, timeout=timeout,
                                                             keep_processes=keep_processes)))


def compile_check(target: Target, script: str, timeout: float, keep_processes: bool = False) -> Plan[m.CheckResult]:
    return (yield from call(target, routes.COMPILATION_CHECK,
                            wire(m.CompilationRequest, compilation_script=script, timeout=timeout,
                                 keep_processes=keep_processes)))


def run_tests(target: Target, script: str, timeout: float, report_glob: str) -> Plan[m.TestReport]:
    return (yield from call(target, routes.TEST_CHECK,
                            wire(m.TestRequest, test_script=script, timeout=timeout, report_glob=report_glob)))


def reset(target: Target, timeout: float = 600.0, to_fork_point: bool = False) -> Plan[m.ResetResult]:
    result = yield from call(target, routes.RESET_PROJECT, wire(m.ResetRequest, timeout=timeout,
                                                                 to_fork_point=to_fork_point))
    if result.status != "success":
        raise ServerError(500, f"project reset failed: {result.output}", result.output, "sandbox")
    return result


def terminate_processes(target: Target, grace: float) -> Plan[int]:
    answer = yield from call(target, routes.TERMINATE_PROCESSES,
                             wire(m.TerminateRequest, graceful_termination_timeout=grace))
    return answer.killed_processes


def execute(target: Target, language: str, code: str, args: list[str] | None, files: list[dict[str, str]] | None,
            stdin: str, timeout: float) -> Plan[m.ExecuteResponse]:
    return (yield from call(target, routes.EXECUTE, wire(
        m.ExecuteRequest, language=language, code=code, args=args or [], files=files or [], stdin=stdin,
        timeout=timeout)))


def capabilities(target: Target) -> Plan[list[str]]:
    return (yield from call(target, routes.CAPABILITIES)).plugins


# -- background processes and terminal sessions ----------------------------------------------------


def start_session(target: Target, command: str, fields: dict[str, Any]) -> Plan[m.SessionInfo]:
    return (yield from call(target, routes.SESSION_START, wire(m.SessionStartRequest, command=command, **fields)))


def read_session(target: Target, sid: str, offset: int, wait: float, max_bytes: int) -> Plan[m.SessionReadResponse]:
    request = wire(m.SessionReadRequest, id=sid, offset=offset, wait=wait, max_bytes=max_bytes)
    return (yield from call(target, routes.SESSION_READ, request))


def write_session(target: Target, sid: str, data: str) -> Plan[m.SessionInfo]:
    return (yield from call(target, routes.SESSION_WRITE, wire(m.SessionWriteRequest, id=sid, data=data)))


def resize_session(target: Target, sid: str, cols: int, rows: int) -> Plan[m.SessionInfo]:
    return (yield from call(target, routes.SESSION_RESIZE, wire(m.SessionResizeRequest, id=sid, cols=cols, rows=rows)))


def end_session(target: Target, sid: str, grace: float) -> Plan[m.SessionInfo]:
    request = wire(m.SessionEndRequest, id=sid, graceful_termination_timeout=grace)
    return (yield from call(target, routes.SESSION_END, request))


# -- control plane -------------------------------------------------------------------------------


def register(name: str, namespace: str) -> Plan[RegisteredClientResponse]:
    reply = yield from cp_call("POST", "/api/clients", {"name": name, "nodes_count": 0, "namespace": namespace})
    try:
        return RegisteredClientResponse.model_validate(reply.json())
    except ValueError:  # not JSON, or not a client: a successful answer of some other service
        raise ServerError(reply.status, reply.text, reply.text, "control-plane") from None


def heartbeat(client_id: str) -> Plan[RegisteredClientResponse]:
    reply = yield from cp_call("POST", "/api/clients/heartbeat", {"client_id": client_id, "availability": "ALIVE"})
    return RegisteredClientResponse.model_validate(reply.json())


def stop_client(client_id: str, namespace: str) -> Plan[RegisteredClientResponse]:
    return (yield from cp_operation("DELETE", "/api/clients", {"client_id": client_id, "namespace": namespace},
                                    RegisteredClientResponse, 120))


def start(req: StartServerRequest) -> Plan[StartServerResponse]:
    """Start (or reuse) a server; a RESET reuse is completed by resetting the project here."""
    timeout = req.server_start_wait_timeout_in_seconds + 60
    started = yield from cp_operation("POST", "/api/idegym-servers", req.model_dump(mode="json"),
                                      StartServerResponse, timeout)
    if started.need_to_reset and started.server_id:
        yield from reset(Target.forwarded(str(req.client_id), started.server_id))
    return started


def server_action(method: str, path: str, client_id: str, server_id: int, namespace: str,
                  extra: dict[str, Any] | None = None, timeout: float = 120) -> Plan[ServerActionResponse]:
    body = {"client_id": client_id, "namespace": namespace, "server_id": server_id, **(extra or {})}
    if path.endswith("/finish"):
        reply = yield from cp_call(method, path, body)
        return ServerActionResponse.model_validate(reply.json())
    return (yield from cp_operation(method, path, body, ServerActionResponse, timeout))


def keepalive(client_id: str, server_id: int, namespace: str, minutes: float) -> Plan[KeepaliveServerResponse]:
    reply = yield from cp_call("POST", "/api/idegym-servers/keepalive", {
        "client_id": client_id, "namespace": namespace, "server_id": server_id, "minutes": minutes})
    return KeepaliveServerResponse.model_validate(reply.json())


def status(client_id: str, server_id: int) -> Plan[ServerStatusResponse]:
    reply = yield from cp_call("GET", f"/api/idegym-servers/{server_id}/status", params={"client_id": client_id})
    return ServerStatusResponse.model_validate(reply.json())


def list_servers(client_id: str, include_terminal: bool) -> Plan[ListServersResponse]:
    reply = yield from cp_call("GET", "/api/idegym-servers", params={
        "client_id": client_id, "include_terminal": str(include_terminal).lower()})
    return ListServersResponse.model_validate(reply.json())


def snapshot(client_id: str, server_id: int, namespace: str) -> Plan[CreateSnapshotResponse]:
    return (yield from cp_operation("POST", "/api/idegym-servers/snapshot", {
        "client_id": client_id, "server_id": server_id, "namespace": namespace}, CreateSnapshotResponse, 300))


def fork(client_id: str, server_id: int, namespace: str, count: int, server_name: str | None,
         timeout: float) -> Plan[ForkServerResponse]:
    body = wire(ForkServerRequest, client_id=client_id, server_id=server_id, namespace=namespace, count=count,
                server_name=server_name)
    return (yield from cp_operation("POST", "/api/idegym-servers/fork", body.model_dump(mode="json"),
                                    ForkServerResponse, timeout))


def forked_info(parent: StartServerResponse | None, namespace: str, client_id: str,
                child: ForkedServer) -> StartServerResponse:
    """What a fork's child handle records: the parent's server, under the child's id and name."""
    return StartServerResponse(namespace=namespace, client_id=client_id, server_id=child.server_id,
                               generated_name=child.generated_name, service_name=child.service_name,
                               server_name=parent.server_name if parent else None,
                               image_tag=parent.image_tag if parent else None)


def build_images(yaml_text: str, namespace: str, client_id: str | None = None) -> Plan[list[str]]:
    body = {"namespace": namespace, "yaml_content": yaml_text, **({"client_id": client_id} if client_id else {})}
    reply = yield from cp_call("POST", "/api/build-push-images", body)
    return list(reply.json()["job_names"])


def wait_job(name: str, timeout: float) -> Plan[JobStatusResponse]:
    import time

    from ..errors import TimeoutError
    from ._protocol import Sleep

    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        reply = yield from cp_call("GET", f"/api/jobs/status/{name}")
        job = JobStatusResponse.model_validate(reply.json())
        if job.status != "in_progress":
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {name} did not finish within {timeout:g} s; last details: {job.details}")
        yield Sleep(delay)
        delay = min(delay * 1.5, 1.0)
