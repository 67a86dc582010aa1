"""Plans for every public call, shared by the sync and async clients (see ``_protocol.py``)."""

from __future__ import annotations

from typing import Any

from control_plane.models import (
    CreateSnapshotResponse,
    JobStatusResponse,
    KeepaliveServerResponse,
    ListServersResponse,
    RegisteredClientResponse,
    ServerActionResponse,
    ServerStatusResponse,
    StartServerRequest,
    StartServerResponse,
)
from sandbox_server.models import (
    BashCommandResponse,
    CheckResult,
    ExecuteResponse,
    FileResult,
    ResetResult,
    TestReport,
)

from sandbox_server.grading.models import ExportRequest, ExportResponse, GradeRequest, GradeResponse

from ._exceptions import ServerError
from ._protocol import Plan, Target, cp_call, cp_operation, sandbox_call, sandbox_model

# -- sandbox ---------------------------------------------------------------------------------------


def bash(target: Target, command: str, timeout: float, cwd: str | None, env: dict[str, str] | None,
         user: str | None, max_output_bytes: int | None, strip_output: bool,
         grace: float) -> Plan[BashCommandResponse]:
    body = {"command": command, "cwd": cwd, "env": env or {}, "user": user, "timeout": timeout,
            "graceful_termination_timeout": grace, "max_output_bytes": max_output_bytes,
            "strip_output": strip_output}
    return (yield from sandbox_model(target, "api/tools/bash", body, BashCommandResponse, timeout + grace))


def write_file(target: Target, path: str, content: str) -> Plan[FileResult]:
    if not isinstance(content, str):
        raise TypeError(f"write_file takes text (str), not {type(content).__name__}; "
                        "send bytes with upload(path, data)")
    return (yield from sandbox_model(target, "api/tools/file/create", {"file_path": path, "content": content},
                                     FileResult, 60))


def edit(target: Target, path: str, start_line: int, end_line: int, new_content: str) -> Plan[FileResult]:
    body = {"file_path": path, "start_line": start_line, "end_line": end_line, "new_content": new_content}
    return (yield from sandbox_model(target, "api/tools/file/edit", body, FileResult, 60))


def patch(target: Target, path: str, patch_text: str) -> Plan[FileResult]:
    return (yield from sandbox_model(target, "api/tools/file/patch", {"file_path": path, "patch": patch_text},
                                     FileResult, 60))


def check(target: Target, kind: str, script: str, timeout: float) -> Plan[CheckResult]:
    field = {"setup": "setup_check_script", "compilation": "compilation_script"}[kind]
    return (yield from sandbox_model(target, f"api/rewards/{kind}", {field: script, "timeout": timeout},
                                     CheckResult, timeout + 5))


def run_tests(target: Target, script: str, timeout: float, report_glob: str) -> Plan[TestReport]:
    body = {"test_script": script, "timeout": timeout, "report_glob": report_glob}
    return (yield from sandbox_model(target, "api/rewards/test", body, TestReport, timeout + 5))


def export_files(target: Target, req: ExportRequest) -> Plan[ExportResponse]:
    return (yield from sandbox_model(target, "api/project/export", req.model_dump(mode="json"), ExportResponse, 300))


def grade(target: Target, req: GradeRequest) -> Plan[GradeResponse]:
    timeout = sum(s.timeout + s.graceful_termination_timeout for s in req.stages) + 120
    return (yield from sandbox_model(target, "api/grade", req.model_dump(mode="json"), GradeResponse, timeout))


def reset(target: Target, timeout: float = 600.0) -> Plan[ResetResult]:
    result = yield from sandbox_model(target, "api/project/reset", {"timeout": timeout}, ResetResult, timeout)
    if result.status != "success":
        raise ServerError(500, f"project reset failed: {result.output}", result.output, "sandbox")
    return result


def execute(target: Target, language: str, code: str, args: list[str] | None, files: list[dict[str, str]] | None,
            stdin: str, timeout: float) -> Plan[ExecuteResponse]:
    body = {"language": language, "code": code, "args": args or [], "files": files or [], "stdin": stdin,
            "timeout": timeout}
    prefix = Target("/", False) if not target.via_control_plane else target
    return (yield from sandbox_model(prefix, "execute", body, ExecuteResponse, timeout + 120))


def capabilities(target: Target) -> Plan[list[str]]:
    reply = yield from sandbox_call(target, "GET", "api/capabilities", None, 30)
    return list(reply.json()["plugins"])


# -- control plane -------------------------------------------------------------------------------


def register(name: str, namespace: str) -> Plan[RegisteredClientResponse]:
    reply = yield from cp_call("POST", "/api/clients", {"name": name, "nodes_count": 0, "namespace": namespace})
    return RegisteredClientResponse.model_validate(reply.json())


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


def build_images(yaml_text: str, namespace: str) -> Plan[list[str]]:
    reply = yield from cp_call("POST", "/api/build-push-images", {"namespace": namespace, "yaml_content": yaml_text})
    return list(reply.json()["job_names"])


def wait_job(name: str, timeout: float) -> Plan[JobStatusResponse]:
    import time

    from ._exceptions import TimeoutError
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
