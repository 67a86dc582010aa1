"""The sandbox server's API, one line per route: method, path, request model, response model.

The server's route table (``app.ROUTES``) and the client (``idegym_env.client``) both read these,
so a path or a body shape is written once. A request model belongs to exactly one route, so the
route of a request is found from its type (:func:`endpoint_for`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from .models import (
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
    ExecuteResponse,
    FileResult,
    HealthResponse,
    LanguagesResponse,
    PatchFileRequest,
    Request,
    ResetRequest,
    ResetResult,
    SetupRequest,
    TerminateRequest,
    TerminateResult,
    TestReport,
    TestRequest,
    UploadFileChunkRequest,
    UploadFileChunkResponse,
)

Req = TypeVar("Req", bound=Request)
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


BASH = Endpoint("POST", "/api/tools/bash", BashCommandRequest, BashCommandResponse)
CREATE_FILE = Endpoint("POST", "/api/tools/file/create", CreateFileRequest, FileResult)
EDIT_FILE = Endpoint("POST", "/api/tools/file/edit", EditFileRequest, FileResult)
PATCH_FILE = Endpoint("POST", "/api/tools/file/patch", PatchFileRequest, FileResult)
UPLOAD_FILE = Endpoint("POST", "/api/tools/file/upload", UploadFileChunkRequest, UploadFileChunkResponse)
DOWNLOAD_FILE = Endpoint("POST", "/api/tools/file/download", DownloadFileChunkRequest, DownloadFileChunkResponse)
SETUP_CHECK = Endpoint("POST", "/api/rewards/setup", SetupRequest, CheckResult)
COMPILATION_CHECK = Endpoint("POST", "/api/rewards/compilation", CompilationRequest, CheckResult)
TEST_CHECK = Endpoint("POST", "/api/rewards/test", TestRequest, TestReport)
RESET_PROJECT = Endpoint("POST", "/api/project/reset", ResetRequest, ResetResult)
TERMINATE_PROCESSES = Endpoint("POST", "/api/processes/terminate", TerminateRequest, TerminateResult)
HEALTH = Endpoint("GET", "/api/health", None, HealthResponse)
CAPABILITIES = Endpoint("GET", "/api/capabilities", None, CapabilitiesResponse)
EXECUTE = Endpoint("POST", "/execute", ExecuteRequest, ExecuteResponse)
LANGUAGES = Endpoint("GET", "/execute/languages", None, LanguagesResponse)
OPENAPI = "/openapi.json"

ENDPOINTS: tuple[Endpoint[Any, Any], ...] = (
    BASH, CREATE_FILE, EDIT_FILE, PATCH_FILE, UPLOAD_FILE, DOWNLOAD_FILE, SETUP_CHECK, COMPILATION_CHECK,
    TEST_CHECK, RESET_PROJECT, TERMINATE_PROCESSES, HEALTH, CAPABILITIES, EXECUTE, LANGUAGES,
)
_BY_REQUEST: dict[type[Request], Endpoint[Any, Any]] = {e.request: e for e in ENDPOINTS if e.request is not None}


def endpoint_for(request: Req) -> Endpoint[Req, Any]:
    """The route that takes ``request`` (by its model type)."""
    try:
        return _BY_REQUEST[type(request)]
    except KeyError:
        raise TypeError(f"{type(request).__name__} is not the request of any sandbox-server route") from None
