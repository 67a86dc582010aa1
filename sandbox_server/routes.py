"""The sandbox server's API, one line per route: method, path, request model, response model.

The server's route table (``app.ROUTES``) and the client (``idegym_env.client``) both read these,
so a path or a body shape is written once. A request model belongs to exactly one route, so the
route of a request is found from its type (:func:`endpoint_for`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from . import models as m
from .grading.models import ExportRequest, ExportResponse, GradeRequest, GradeResponse
from .models import Request

Req = TypeVar("Req", bound=BaseModel)  # a route's body: a `Request`, or a strict grading model
Resp = TypeVar("Resp", bound=BaseModel)


@dataclass(frozen=True)
class Endpoint(Generic[Req, Resp]):
    method: str
    path: str  # absolute: "/api/tools/bash"
    request: type[Req] | None  # None: no body (GET)
    response: type[Resp]

    @property
    def relative(self) -> str:
        """The path without its leading slash, to join onto a prefix (a forward URL)."""
        return self.path.lstrip("/")


BASH = Endpoint("POST", "/api/tools/bash", m.BashCommandRequest, m.BashCommandResponse)
CREATE_FILE = Endpoint("POST", "/api/tools/file/create", m.CreateFileRequest, m.FileResult)
EDIT_FILE = Endpoint("POST", "/api/tools/file/edit", m.EditFileRequest, m.FileResult)
PATCH_FILE = Endpoint("POST", "/api/tools/file/patch", m.PatchFileRequest, m.FileResult)
UPLOAD_FILE = Endpoint("POST", "/api/tools/file/upload", m.UploadFileChunkRequest, m.UploadFileChunkResponse)
DOWNLOAD_FILE = Endpoint("POST", "/api/tools/file/download", m.DownloadFileChunkRequest, m.DownloadFileChunkResponse)
LIST_FILES = Endpoint("POST", "/api/tools/file/list", m.ListFilesRequest, m.ListFilesResponse)
SETUP_CHECK = Endpoint("POST", "/api/rewards/setup", m.SetupRequest, m.CheckResult)
COMPILATION_CHECK = Endpoint("POST", "/api/rewards/compilation", m.CompilationRequest, m.CheckResult)
TEST_CHECK = Endpoint("POST", "/api/rewards/test", m.TestRequest, m.TestReport)
RESET_PROJECT = Endpoint("POST", "/api/project/reset", m.ResetRequest, m.ResetResult)
EXPORT_FILES = Endpoint("POST", "/api/project/export", ExportRequest, ExportResponse)
GRADE = Endpoint("POST", "/api/grade", GradeRequest, GradeResponse)
TERMINATE_PROCESSES = Endpoint("POST", "/api/processes/terminate", m.TerminateRequest, m.TerminateResult)
HEALTH: Endpoint[Request, m.HealthResponse] = Endpoint("GET", "/api/health", None, m.HealthResponse)
CAPABILITIES: Endpoint[Request, m.CapabilitiesResponse] = Endpoint("GET", "/api/capabilities", None,
                                                                  m.CapabilitiesResponse)
EXECUTE = Endpoint("POST", "/execute", m.ExecuteRequest, m.ExecuteResponse)
LANGUAGES: Endpoint[Request, m.LanguagesResponse] = Endpoint("GET", "/execute/languages", None, m.LanguagesResponse)
AGENT_START = Endpoint("POST", "/api/agent/start", m.AgentStartRequest, m.AgentStartResponse)
AGENT_EXCHANGE = Endpoint("POST", "/api/agent/exchange", m.AgentExchangeRequest, m.AgentExchangeResponse)
AGENT_STOP = Endpoint("POST", "/api/agent/stop", m.AgentStopRequest, m.AgentStopResponse)
SESSION_START = Endpoint("POST", "/api/sessions/start", m.SessionStartRequest, m.SessionInfo)
SESSION_READ = Endpoint("POST", "/api/sessions/read", m.SessionReadRequest, m.SessionReadResponse)
SESSION_WRITE = Endpoint("POST", "/api/sessions/write", m.SessionWriteRequest, m.SessionInfo)
SESSION_RESIZE = Endpoint("POST", "/api/sessions/resize", m.SessionResizeRequest, m.SessionInfo)
SESSION_END = Endpoint("POST", "/api/sessions/end", m.SessionEndRequest, m.SessionInfo)
SESSION_LIST: Endpoint[Request, m.SessionListResponse] = Endpoint("GET", "/api/sessions", None, m.SessionListResponse)
OPENAPI = "/openapi.json"

ENDPOINTS: tuple[Endpoint[Any, Any], ...] = (
    BASH, CREATE_FILE, EDIT_FILE, PATCH_FILE, UPLOAD_FILE, DOWNLOAD_FILE, SETUP_CHECK, COMPILATION_CHECK,
    TEST_CHECK, RESET_PROJECT, EXPORT_FILES, GRADE, TERMINATE_PROCESSES, HEALTH, CAPABILITIES, EXECUTE, LANGUAGES,
    AGENT_START, AGENT_EXCHANGE, AGENT_STOP, SESSION_START, SESSION_READ, SESSION_WRITE, SESSION_RESIZE,
    SESSION_END, SESSION_LIST, LIST_FILES,
)
_BY_REQUEST: dict[type[BaseModel], Endpoint[Any, Any]] = {e.request: e for e in ENDPOINTS if e.request is not None}


def endpoint_for(request: Req) -> Endpoint[Req, Any]:
    """The route that takes ``request`` (by its model type)."""
    try:
        return _BY_REQUEST[type(request)]
    except KeyError:
        raise TypeError(f"{type(request).__name__} is not the request of any sandbox-server route") from None
