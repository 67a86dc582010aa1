"""The in-sandbox server: app factory, routes and handlers (served by ``web.py``).

Routes are declared once in ``ROUTES``; the router and ``GET /openapi.json`` both come from it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from . import __version__, routes, web
from .agent_gateway import AgentGateway
from .config import ServerConfig
from .errors import ApiError, BadRequest, Forbidden, Unprocessable, render
from .files import FileTools
from .grading.export import export as export_project
from .grading.grade import grade as grade_project
from .grading.models import ExportRequest, GradeRequest
from .http import parse_model
from .judge import judge_env
from .junit import find_reports, fresh_reports, parse_reports
from .memory_events import MemoryEvents
from .models import (
    AgentExchangeRequest,
    AgentExchangeResponse,
    AgentStartRequest,
    AgentStartResponse,
    AgentStopRequest,
    AgentStopResponse,
    BashCommandRequest,
    BashCommandResponse,
    CapabilitiesResponse,
    CheckResult,
    CompilationRequest,
    CreateFileRequest,
    DownloadFileChunkRequest,
    DownloadFileChunkResponse,
    EditFileRequest,
    ExecuteRequest,
    FileEntry,
    FileResult,
    HealthResponse,
    LanguagesResponse,
    ListFilesRequest,
    ListFilesResponse,
    PatchFileRequest,
    ResetRequest,
    ResetResult,
    SessionEndRequest,
    SessionListResponse,
    SessionReadRequest,
    SessionReadResponse,
    SessionResizeRequest,
    SessionStartRequest,
    SessionWriteRequest,
    SetupRequest,
    Status,
    TerminateRequest,
    TerminateResult,
    TestReport,
    TestRequest,
    TestScores,
    UploadFileChunkRequest,
    UploadFileChunkResponse,
)
from .openapi import Route, build_openapi
from .process import ProcessResult, Supervisor
from .project import CopyProject, OverlayProject, Project, prepare_pristine
from .runner import CodeRunner, forked_runs_template
from .sessions import Sessions
from .spawner import ToolEnv
from .tool_cgroups import ToolCgroups
from .users import UserSpec

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)

CONFIG = web.AppKey("config", ServerConfig)
STATE = web.AppKey("state", "SandboxState")


@dataclass
class SandboxState:
    config: ServerConfig
    supervisor: Supervisor
    user: UserSpec
    base_env: dict[str, str]
    files: FileTools
    runner: CodeRunner
    project: Project | None = None
    reset_lock: asyncio.Lock | None = None
    agent: AgentGateway | None = None  # the running episode's harness and model endpoint
    sessions: Sessions = field(default_factory=Sessions)  # background processes and terminals
    _tool_envs: dict[tuple[str, str, str], ToolEnv] = field(default_factory=dict, init=False, repr=False)

    async def close_agent(self) -> None:
        agent, self.agent = self.agent, None
        if agent is not None:
            await agent.close()

    def __post_init__(self) -> None:
        # Resolved once: a PATH search for every call costs more than the rest of the spawn.
        self.bash = shutil.which("bash", path=self.base_env.get("PATH")) or "bash"

    def env_for(self, user: UserSpec) -> dict[str, str]:
        return dict(self.tool_env(user))

    def tool_env(self, user: UserSpec) -> ToolEnv:
        """The environment of ``user``'s tools (made once per user: the spawner gets it encoded)."""
        key = (user.name, user.home, user.shell)
        env = self._tool_envs.get(key)
        if env is None:
            env = self._tool_envs[key] = ToolEnv(
                {**self.base_env, "HOME": user.home, "USER": user.name, "LOGNAME": user.name, "SHELL": user.shell})
        return env

    def resolve_user(self, name: str | None) -> UserSpec:
        if name is None:
            return self.user
        try:
            user = UserSpec.lookup(name)
        except KeyError:
            raise Unprocessable.field(
                ["body", "user"], f"unknown user {name!r}: no such user in the sandbox", name
            ) from None
        if user.uid == 0 and not self.config.root_tools:
            raise Forbidden(
                f"cannot run as {name!r}: this sandbox does not give tools root (start the server with "
                "run_as_root to have it)"
            )
        if user.uid != os.geteuid() and os.geteuid() != 0:
            raise Forbidden(
                f"cannot run as {name!r}: the server runs as uid {os.geteuid()}, not root; "
                "start it as root (run_as_root) or leave 'user' unset"
            )
        return user

    def resolve_cwd(self, cwd: str | None) -> str:
        path = self.config.project if cwd is None else self.config.project / cwd
        where = str(path)
        if not os.path.isdir(where):  # not pathlib's: a few us of every call
            raise BadRequest(f"working directory {cwd!r} does not exist in the sandbox (resolved to {path})")
        return where

    async def run_script(
        self, script: str, timeout: float, grace: float, *, user: UserSpec | None = None,
        cwd: str | None = None, env: dict[str, str] | None = None, max_output: int | None = 1 << 20,
        via_spawner: bool = True,
    ) -> ProcessResult:
        who = user or self.user
        return await self.supervisor.run(
            [self.bash, "-c", script],
            cwd=self.resolve_cwd(cwd),
            env={**self.tool_env(who), **env} if env else self.tool_env(who),
            user=who,
            timeout=min(timeout, self.config.max_timeout),
            grace=min(grace, 60.0),
            max_output=max_output,
            via_spawner=via_spawner,
        )

    async def run_check(self, script: str, timeout: float, grace: float, keep_processes: bool = False) -> ProcessResult:
        """A reward check: the task's script as the tool user in the project, with a fresh, empty
        HOME and TMPDIR and no Python user site, so that nothing the agent left in its home
        (usercustomize.py, .npmrc, git config, shims, caches) takes part in the check; started
        by the server itself, never by the spawner the agent's user can signal.

        What the check leaves running ends with it, unless ``keep_processes`` (a service the next
        checks use): everything it left (re-parented to the server) gets SIGTERM and the grace and
        is then killed, and, with the tools' cgroups, the check's own groups are emptied. The
        agent's processes are not the check's; a tool call that starts while the check runs is."""
        loop = asyncio.get_running_loop()
        home = await loop.run_in_executor(None, _check_home, self.user)
        env = {"HOME": home, "TMPDIR": home, "PYTHONNOUSERSITE": "1"}
        supervisor = self.supervisor
        try:
            if keep_processes:
                return await self.run_script(script, timeout, grace, via_spawner=False, env=env)
            group = supervisor.stage("check") if supervisor.tool_cgroups is not None else contextlib.nullcontext()
            result: ProcessResult | None = None
            try:
                async with group:
                    before = supervisor.children()
                    result = await self.run_script(script, timeout, grace, via_spawner=False, env=env)
                    await supervisor.end_new_children(before, min(grace, 60.0))
            except RuntimeError as exc:  # a process stuck in the kernel outlived the check's groups
                if result is None:
                    raise
                log.warning("reward check: %s", exc)
            return result
        finally:
            await loop.run_in_executor(None, shutil.rmtree, home, True)


def _check_home(user: UserSpec) -> str:
    home = tempfile.mkdtemp(prefix="idegym-check-")
    if os.geteuid() == 0 and user.uid != 0:
        os.chown(home, user.uid, user.gid)
    return home


def _state(request: web.Request) -> SandboxState:
    return request.app[STATE]


async def read_model(request: web.Request, model: type[M]) -> M:
    return parse_model(await request.read(), model)


def json_response(model: BaseModel, status: int = 200) -> web.Response:
    return web.Response(model.model_dump_json(by_alias=True).encode(), status=status)


def on_error(request: web.Request, exc: BaseException) -> web.Response:
    """Every failure as JSON (``errors.render``): our errors with their status, anything else a
    500 that says it is a bug. Never 410 or 499 (those mark control-plane failures)."""
    if not isinstance(exc, ApiError):
        log.error("unhandled error in %s %s", request.method, request.path, exc_info=exc)
        exc = ApiError(f"the sandbox server hit an unexpected {type(exc).__name__}: {exc}. This is a bug; "
                       "please report it.")
    return web.Response(render(exc), status=exc.status)


# -- tools ----------------------------------------------------------------------------------------


async def bash(request: web.Request) -> web.Response:
    req = await read_model(request, BashCommandRequest)
    if not req.command.strip():
        raise Unprocessable.field(["body", "command"], "command is empty: there is nothing to run", req.command)
    state = _state(request)
    result = await state.run_script(
        req.command, req.timeout, req.graceful_termination_timeout, user=state.resolve_user(req.user),
        cwd=req.cwd, env=req.env, max_output=req.max_output_bytes,
    )
    return json_response(BashCommandResponse(
        stdout=result.stdout.text(req.strip_output),
        stderr=result.stderr.text(req.strip_output),
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        duration_seconds=round(result.duration, 4),
        oom_killed=result.oom_killed,
    ))


def _file_tool(model: type[M], apply: Callable[[FileTools, M], object]) -> Callable[
        [web.Request], Awaitable[web.Response]]:
    """The handler of a file tool that answers only success (a failure raises)."""
    async def handler(request: web.Request) -> web.Response:
        apply(_state(request).files, await read_model(request, model))
        return json_response(FileResult(status=Status.SUCCESS))

    return handler


create_file = _file_tool(CreateFileRequest, lambda files, req: files.create(req.file_path, req.content))
edit_file = _file_tool(EditFileRequest, lambda files, req: files.edit(req.file_path, req.start_line, req.end_line,
                                                                       req.new_content))
patch_file = _file_tool(PatchFileRequest, lambda files, req: files.patch(req.file_path, req.patch))


async def upload_file(request: web.Request) -> web.Response:
    req = await read_model(request, UploadFileChunkRequest)
    written, size = _state(request).files.upload(req.file_path, req.content_base64, req.offset, req.truncate)
    return json_response(UploadFileChunkResponse(file_path=req.file_path, bytes_written=written, size=size))


async def download_file(request: web.Request) -> web.Response:
    req = await read_model(request, DownloadFileChunkRequest)
    data, size = _state(request).files.download(req.file_path, req.offset, req.length)
    return json_response(DownloadFileChunkResponse(
        file_path=req.file_path,
        offset=req.offset,
        content_base64=base64.b64encode(data).decode("ascii"),
        bytes_read=len(data),
        size=size,
        eof=req.offset + len(data) >= size,
    ))



async def list_files(request: web.Request) -> web.Response:
    req = await read_model(request, ListFilesRequest)
    entries, truncated = _state(request).files.list_dir(req.file_path, req.depth, req.max_entries)
    return json_response(ListFilesResponse(
        file_path=req.file_path, truncated=truncated,
        entries=[FileEntry(path=path, kind=kind, size=size) for path, kind, size in entries]))

# -- rewards -------------------------------------------------------------------------------------


def _failure_output(result: ProcessResult, what: str, timeout: float) -> str:
    text = f"stdout:\n{result.stdout.text(True)}\n\nstderr:\n{result.stderr.text(True)}"
    if result.timed_out:
        return f"{what} timed out after {timeout:g} seconds (processes killed).\n{text}"
    return text


async def setup_reward(request: web.Request) -> web.Response:
    req = await read_model(request, SetupRequest)
    result = await _state(request).run_check(req.setup_check_script, req.timeout, req.graceful_termination_timeout,
                                             req.keep_processes)
    ok = result.exit_code == 0 and not result.timed_out
    return json_response(CheckResult(
        status=Status.SUCCESS if ok else Status.FAILURE,
        output="" if ok else _failure_output(result, "setup check", req.timeout),
        exit_code=result.exit_code, timed_out=result.timed_out,
    ))


async def compilation_reward(request: web.Request) -> web.Response:
    req = await read_model(request, CompilationRequest)
    result = await _state(request).run_check(req.compilation_script, req.timeout, req.graceful_termination_timeout,
                                             req.keep_processes)
    ok = result.exit_code == 0 and not result.timed_out
    output = ""
    if not ok:
        stderr = result.stderr.text(True)
        # Kotlin's compiler marks errors with "e:"; other compilers get their whole output.
        marked = [line for line in stderr.splitlines() if line.startswith("e:")]
        output = "\n".join(marked) if marked and not result.timed_out else _failure_output(
            result, "compilation", req.timeout
        )
    return json_response(CheckResult(
        status=Status.SUCCESS if ok else Status.FAILURE, output=output,
        exit_code=result.exit_code, timed_out=result.timed_out,
    ))


async def test_reward(request: web.Request) -> web.Response:
    req = await read_model(request, TestRequest)
    state = _state(request)
    root = state.config.project
    loop = asyncio.get_running_loop()
    before = await loop.run_in_executor(None, find_reports, root, req.report_glob)
    result = await state.run_check(req.test_script, req.timeout, req.graceful_termination_timeout)
    after = await loop.run_in_executor(None, find_reports, root, req.report_glob)
    # Only reports this run wrote count, each file once: a planted or hard-linked one is ignored.
    fresh = fresh_reports(before, after)
    scores, notes, used = TestScores(), [], []
    for path, counts in await loop.run_in_executor(None, parse_reports, fresh, state.files.as_user):
        if isinstance(counts, Exception):
            notes.append(f"ignored report {path}: {counts}")
            continue
        used.append(str(path.relative_to(root)) if path.is_relative_to(root) else str(path))
        scores.total += counts.total
        scores.passed += counts.passed
        scores.failed += counts.failed
        scores.skipped += counts.skipped
    ok = result.exit_code == 0 and not result.timed_out
    output = "" if ok else _failure_output(result, "test script", req.timeout)
    if not fresh:
        notes.append(f"the test script wrote no report matching {req.report_glob!r} under {root}")
    if notes:
        output = (output + "\n" if output else "") + "\n".join(notes)
    return json_response(TestReport(
        status=Status.SUCCESS if ok else Status.FAILURE, scores=scores, output=output,
        exit_code=result.exit_code, timed_out=result.timed_out, reports=used,
    ))


# -- project, actuator ---------------------------------------------------------------------------


async def reset_project(request: web.Request) -> web.Response:
    req = await read_model(request, ResetRequest)
    state = _state(request)
    started = time.perf_counter()
    assert state.reset_lock is not None
    async with state.reset_lock:
        await state.close_agent()
        killed = await state.supervisor.kill_descendants(min(req.graceful_termination_timeout, 60.0))
        state.sessions.forget()
        if state.project is None:
            return json_response(ResetResult(
                status=Status.FAILURE, output="Can not reset project without an archive!", killed_processes=killed,
            ))
        try:
            restored = await asyncio.get_running_loop().run_in_executor(None, state.project.reset,
                                                                      req.to_fork_point)
        except Exception as exc:  # noqa: BLE001 - reported to the caller, who decides
            log.exception("project reset failed")
            return json_response(ResetResult(
                status=Status.FAILURE, output=f"reset failed: {type(exc).__name__}: {exc}", killed_processes=killed,
            ))
    return json_response(ResetResult(
        status=Status.SUCCESS,
        output=f"Reset project in {time.perf_counter() - started:.3f} seconds.",
        killed_processes=killed,
        restored_entries=restored,
    ))


async def export_files(request: web.Request) -> web.Response:
    """The files of the project the agent may change (``idegym_env.grading`` grades them elsewhere)."""
    req = await read_model(request, ExportRequest)
    state = _state(request)
    pristine = state.project.pristine if state.project is not None else None
    answer = await asyncio.get_running_loop().run_in_executor(None, export_project, state.config.project,
                                                              pristine, req)
    return json_response(answer)


async def grade(request: web.Request) -> web.Response:
    """Install the graded tree and run the check stages (see ``grading/grade.py``)."""
    req = await read_model(request, GradeRequest)
    return json_response(await grade_project(_state(request), req))


async def terminate_processes(request: web.Request) -> web.Response:
    """End every process a tool started, leaving the files alone (e.g. before a check runs, so no
    leftover daemon can touch what the check reads)."""
    req = await read_model(request, TerminateRequest)
    await _state(request).close_agent()
    killed = await _state(request).supervisor.kill_descendants(min(req.graceful_termination_timeout, 60.0))
    _state(request).sessions.forget()
    return json_response(TerminateResult(killed_processes=killed))


# -- agents that bring their own loop (agent_gateway.py) ------------------------------------------


async def agent_start(request: web.Request) -> web.Response:
    """Start a harness with its model endpoint; an earlier one of this sandbox ends first."""
    req = await read_model(request, AgentStartRequest)
    state = _state(request)
    user = state.resolve_user(req.user)
    cwd = state.resolve_cwd(req.cwd)
    if state.agent is not None:
        await state.close_agent()
        await state.supervisor.kill_descendants(min(req.graceful_termination_timeout, 60.0))
    agent = AgentGateway(key=req.key, call_timeout=req.call_timeout, max_output=req.max_output_bytes)
    port = await agent.open()
    base = f"http://127.0.0.1:{port}"
    env = state.env_for(user)
    env.update(req.env or {})
    env.update(IDEGYM_GATEWAY_URL=base, OPENAI_BASE_URL=f"{base}/v1", OPENAI_API_KEY=req.key,
               ANTHROPIC_BASE_URL=base, ANTHROPIC_API_KEY=req.key)
    connected = False
    if req.exchange_socket is not None:
        if req.exchange_secret is None:
            raise Unprocessable.field(["body", "exchange_secret"], "exchange_socket needs exchange_secret", None)
        channel = web.App(client_max_size=state.config.max_body_bytes, on_error=on_error)
        channel[CONFIG], channel[STATE] = request.app[CONFIG], state
        channel.add_route(routes.AGENT_EXCHANGE.method, routes.AGENT_EXCHANGE.path, agent_exchange)
        why = await agent.connect_back(req.exchange_socket, req.exchange_secret, channel)
        connected = why is None
        if why is not None:
            log.warning("agent exchange socket %s: %s (the caller falls back to the control plane)",
                        req.exchange_socket, why)
    agent.run(lambda: state.supervisor.run(
        list(req.command), cwd=cwd, env=env, user=user, timeout=min(req.timeout, state.config.max_timeout),
        grace=min(req.graceful_termination_timeout, 60.0), max_output=req.max_output_bytes))
    state.agent = agent
    return json_response(AgentStartResponse(port=port, base_url=base, exchange_connected=connected))


def _agent(request: web.Request) -> AgentGateway:
    agent = _state(request).agent
    if agent is None:
        raise ApiError.for_status(409, "no agent runs in this sandbox: POST /api/agent/start first (a reset or "
                                       "a terminate ends it)")
    return agent


async def agent_exchange(request: web.Request) -> web.Response:
    req = await read_model(request, AgentExchangeRequest)
    agent = _agent(request)
    if req.reply is not None:
        agent.answer(req.reply)
    call = await agent.next_call(req.wait)
    return json_response(AgentExchangeResponse(call=call, agent=agent.state()))


async def agent_stop(request: web.Request) -> web.Response:
    """End the harness (and every tool process) and close its endpoint; says how it ended."""
    req = await read_model(request, AgentStopRequest)
    state = _state(request)
    agent = state.agent
    await state.close_agent()
    await state.supervisor.kill_descendants(min(req.graceful_termination_timeout, 60.0))
    if agent is not None:
        await agent.ended(5.0)
    return json_response(AgentStopResponse(agent=agent.state() if agent is not None else None))


# -- background processes and terminal sessions (sessions.py) --------------------------------------


async def session_start(request: web.Request) -> web.Response:
    req = await read_model(request, SessionStartRequest)
    state = _state(request)
    user = state.resolve_user(req.user)
    cwd = state.resolve_cwd(req.cwd)
    env = state.env_for(user)
    if req.pty:
        env.update(TERM="xterm-256color", COLUMNS=str(req.cols), LINES=str(req.rows))
    env.update(req.env or {})
    program = {"bash": state.bash, "script": shutil.which("script", path=env.get("PATH")) or "script"}

    def run(argv: list[str], sinks: tuple, stdin_fd: int, on_start: Callable[[int], None]):
        return state.supervisor.run(
            [program.get(argv[0], argv[0]), *argv[1:]], cwd=cwd, env=env, user=user,
            timeout=min(req.timeout, state.config.max_timeout), grace=min(req.graceful_termination_timeout, 60.0),
            max_output=None, sinks=sinks, stdin_fd=stdin_fd, on_start=on_start)

    session = await state.sessions.start(req.command, pty=req.pty, cols=req.cols, rows=req.rows,
                                         max_output=req.max_output_bytes, run=run)
    return json_response(session.info())


async def session_read(request: web.Request) -> web.Response:
    req = await read_model(request, SessionReadRequest)
    sessions = _state(request).sessions
    session = sessions.get(req.id)
    data, begin = await sessions.read(session, req.offset, req.wait, req.max_bytes)
    return json_response(SessionReadResponse(
        session=session.info(), output=data.decode("utf-8", "replace"), offset=begin, next_offset=begin + len(data),
        dropped=max(begin - req.offset, 0),
        screen=session.output.tail_lines(session.rows or 40) if session.pty else None))


async def session_write(request: web.Request) -> web.Response:
    req = await read_model(request, SessionWriteRequest)
    sessions = _state(request).sessions
    session = sessions.get(req.id)
    await sessions.write(session, req.data.encode())
    return json_response(session.info())


async def session_resize(request: web.Request) -> web.Response:
    req = await read_model(request, SessionResizeRequest)
    sessions = _state(request).sessions
    session = sessions.get(req.id)
    await sessions.resize(session, req.cols, req.rows)
    return json_response(session.info())


async def session_end(request: web.Request) -> web.Response:
    req = await read_model(request, SessionEndRequest)
    sessions = _state(request).sessions
    session = sessions.get(req.id)
    await sessions.end(session, min(req.graceful_termination_timeout, 60.0))
    return json_response(session.info())


async def session_list(request: web.Request) -> web.Response:
    return json_response(SessionListResponse(sessions=_state(request).sessions.list()))


async def health(request: web.Request) -> web.Response:
    return json_response(HealthResponse())


async def capabilities(request: web.Request) -> web.Response:
    plugins = list(request.app[CONFIG].plugins)
    if _state(request).runner.isolated:
        plugins.append("isolated-runs")  # the control plane may then send this sandbox many requests' runs
    return json_response(CapabilitiesResponse(plugins=plugins))


async def execute(request: web.Request) -> web.Response:
    req = await read_model(request, ExecuteRequest)
    return json_response(await _state(request).runner.execute(req))


async def languages(request: web.Request) -> web.Response:
    return json_response(LanguagesResponse(languages=await _state(request).runner.languages()))


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


@functools.cache
def openapi_document() -> dict:
    """Built once per process, on first use (a few MiB of schemas that most servers never serve;
    the zygote builds it for every server it forks)."""
    return build_openapi(ROUTES, title="IdeGym sandbox server", version=__version__)

ROUTES: tuple[Route, ...] = (
    Route.of(routes.BASH, bash, "Execute Bash Script", "execute_bash_script_api_tools_bash_post"),
    Route.of(routes.CREATE_FILE, create_file, "Create File", "create_file_api_tools_file_create_post"),
    Route.of(routes.EDIT_FILE, edit_file, "Replace Lines", "replace_lines_api_tools_file_edit_post"),
    Route.of(routes.PATCH_FILE, patch_file, "Patch File", "patch_file_api_tools_file_patch_post"),
    Route.of(routes.UPLOAD_FILE, upload_file, "Upload File Chunk", "upload_file_chunk_api_tools_file_upload_post"),
    Route.of(routes.DOWNLOAD_FILE, download_file, "Download File Chunk",
             "download_file_chunk_api_tools_file_download_post"),
    Route.of(routes.LIST_FILES, list_files, "List Files", "list_files_api_tools_file_list_post"),
    Route.of(routes.COMPILATION_CHECK, compilation_reward, "Compilation Reward",
             "compilation_reward_api_rewards_compilation_post"),
    Route.of(routes.SETUP_CHECK, setup_reward, "Setup Reward", "setup_reward_api_rewards_setup_post"),
    Route.of(routes.TEST_CHECK, test_reward, "Unit Test Reward", "unit_test_reward_api_rewards_test_post"),
    Route.of(routes.RESET_PROJECT, reset_project, "Reset Project", "reset_project_api_project_reset_post"),
    Route.of(routes.EXPORT_FILES, export_files, "Export Editable Files", "export_files_api_project_export_post"),
    Route.of(routes.GRADE, grade, "Grade", "grade_api_grade_post"),
    Route.of(routes.TERMINATE_PROCESSES, terminate_processes, "Terminate Tool Processes",
             "terminate_processes_api_processes_terminate_post"),
    Route.of(routes.HEALTH, health, "Health", "health_api_health_get"),
    Route.of(routes.CAPABILITIES, capabilities, "Capabilities", "capabilities_api_capabilities_get"),
    Route.of(routes.EXECUTE, execute, "Run code in a sandboxed container", "execute"),
    Route.of(routes.LANGUAGES, languages, "Available languages", "languages"),
    Route.of(routes.AGENT_START, agent_start, "Start an Agent Harness", "agent_start_api_agent_start_post"),
    Route.of(routes.AGENT_EXCHANGE, agent_exchange, "Answer and Collect Model Calls",
             "agent_exchange_api_agent_exchange_post"),
    Route.of(routes.AGENT_STOP, agent_stop, "Stop the Agent Harness", "agent_stop_api_agent_stop_post"),
    Route.of(routes.SESSION_START, session_start, "Start a Background Process or Terminal Session",
             "session_start_api_sessions_start_post"),
    Route.of(routes.SESSION_READ, session_read, "Read a Session's Output", "session_read_api_sessions_read_post"),
    Route.of(routes.SESSION_WRITE, session_write, "Write to a Session", "session_write_api_sessions_write_post"),
    Route.of(routes.SESSION_RESIZE, session_resize, "Resize a Terminal Session",
             "session_resize_api_sessions_resize_post"),
    Route.of(routes.SESSION_END, session_end, "End a Session", "session_end_api_sessions_end_post"),
    Route.of(routes.SESSION_LIST, session_list, "List Sessions", "session_list_api_sessions_get"),
)


# -- factory -------------------------------------------------------------------------------------


def _lifecycle(state: SandboxState) -> Callable[[web.App], AsyncIterator[None]]:
    async def ctx(app: web.App) -> AsyncIterator[None]:
        state.supervisor.start()
        state.supervisor.start_spawner(state.user)  # with the sandbox: not a cost of its first call
        state.reset_lock = asyncio.Lock()
        state.project = await asyncio.get_running_loop().run_in_executor(None, _open_project, state.config)
        state.runner.start()
        yield
        await state.close_agent()
        state.sessions.forget()
        await state.runner.stop()
        await state.supervisor.kill_descendants(1.0)
        state.supervisor.stop()
        if isinstance(state.project, OverlayProject):
            state.project.close()
        if state.config.owns_state_dir and state.config.state_dir is not None:
            shutil.rmtree(state.config.state_dir, ignore_errors=True)

    return ctx


def _server_dirs(config: ServerConfig) -> tuple[str, ...]:
    """Directories of the server's own (its socket, cgroup files, the project's layer) that an
    isolated run must not even read."""
    files = (config.unix_socket, config.memory_events)
    dirs = {str(Path(f).absolute().parent) for f in files if f is not None}
    if config.overlay_layer is not None:
        dirs.add(str(config.overlay_layer.absolute()))
    if config.tool_cgroups is not None:
        dirs.add(str(config.tool_cgroups.absolute()))
    return tuple(sorted(d for d in dirs if d != "/"))


def _open_project(config: ServerConfig) -> Project:
    config.project.mkdir(parents=True, exist_ok=True)
    if config.overlay_lower is not None and config.overlay_layer is not None:
        return OverlayProject(config.project, config.overlay_lower, config.overlay_layer)
    if config.state_dir is None:  # a private directory of our own, removed at shutdown
        config.state_dir = Path(tempfile.mkdtemp(prefix="idegym-sandbox-"))
        config.owns_state_dir = True
    pristine, identical = prepare_pristine(config.project_source, config.project, config.state_dir)
    return CopyProject(config.project, pristine, identical)


def create_app(config: ServerConfig) -> web.App:
    """Build the sandbox server. Nothing runs until the app is started (cleanup context)."""
    config.project = config.project.absolute()
    user = UserSpec.lookup(config.tool_user) if config.tool_user else UserSpec.current()
    base_env = config.tool_environment()
    base_env.update(judge_env(base_env.get("PATH", "")))
    groups = ToolCgroups(config.tool_cgroups) if config.tool_cgroups else None
    supervisor = Supervisor(MemoryEvents(config.memory_events), groups, isolated_runs=config.isolated_runs,
                            spawners=config.tool_spawner, run_memory_max=config.run_memory_max,
                            run_spares=config.runner_concurrency,
                            run_template=forked_runs_template(base_env) if config.runner_template else None)
    roots = config.file_roots or [config.project]
    state = SandboxState(
        config=config,
        supervisor=supervisor,
        user=user,
        base_env=base_env,
        files=FileTools(config.project, roots, user),
        runner=CodeRunner(supervisor, user, base_env, config.runner_concurrency, hidden=_server_dirs(config)),
    )
    app = web.App(client_max_size=config.max_body_bytes, on_error=on_error)
    app[CONFIG] = config
    app[STATE] = state
    app.cleanup_ctx.append(_lifecycle(state))
    for route in ROUTES:
        app.add_route(route.method, route.path, route.handler)
    app.add_get(routes.OPENAPI, openapi)
    return app


__all__ = ["create_app", "ROUTES", "SandboxState", "CONFIG", "STATE"]
