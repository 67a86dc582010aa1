"""Wire shapes of the sandbox server, defined once.

Requests and responses follow ``specs/sandbox-server-api.yaml`` and ``specs/code-runner-api.json``.
Requests ignore unknown keys and accept ``null`` for every
optional field, because the published client sends both.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, field_validator

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DEFAULT_TIMEOUT = 600.0
DEFAULT_GRACE = 2.0
DEFAULT_MAX_OUTPUT = 1_048_576
DEFAULT_CHUNK = 1_048_576


class Status(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    IN_PROGRESS = "in_progress"


class Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _not_negative(value: float) -> float:
    if value < 0:
        raise ValueError("must be zero or more seconds")
    return value


# Checked after parsing, so the published schema stays the plain "number" of ``specs/``.
Seconds = Annotated[float, AfterValidator(_not_negative)]


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain a NUL byte (it cannot be passed to a program)")
    return value


# Strings that become a program's argument, path or user name: a NUL byte is a request error.
Arg = Annotated[str, AfterValidator(_no_nul)]


def _valid_env_names(value: dict[str, str]) -> dict[str, str]:
    for name in value:
        if not ENV_NAME.match(name):
            raise ValueError(f"invalid environment variable name {name!r}: use [A-Za-z_][A-Za-z0-9_]*")
    return value


EnvMap = Annotated[dict[str, Arg], AfterValidator(_valid_env_names)]


class TimedRequest(Request):
    timeout: Seconds = Field(DEFAULT_TIMEOUT, description="Timeout in seconds")
    graceful_termination_timeout: Seconds = Field(
        DEFAULT_GRACE, description="Timeout in seconds for graceful process termination"
    )


# --- tools -----------------------------------------------------------------------------------


class BashCommandRequest(TimedRequest):
    command: Arg = Field(description="Command to execute as a bash script")
    cwd: Arg | None = Field(
        None,
        description="Working directory for the command. Defaults to the server's project directory. "
        "A relative path is resolved against it.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables added to the command's environment, overriding inherited ones.",
    )
    user: Arg | None = Field(None, description="Run the command as this user (the server must run as root).")
    timeout: Seconds = Field(DEFAULT_TIMEOUT, description="Timeout for the command execution in seconds")
    max_output_bytes: Annotated[StrictInt, Field(ge=1)] | None = Field(
        DEFAULT_MAX_OUTPUT,
        description="Maximum retained bytes for each output stream; null retains complete output",
    )
    strip_output: bool = Field(False, description="Trim leading and trailing whitespace from stdout and stderr.")

    @field_validator("env", mode="before")
    @classmethod
    def _env_none_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        _valid_env_names(value)
        for name, val in value.items():
            if "\x00" in val:
                raise ValueError(f"environment variable {name!r} contains a NUL byte")
        return value


class BashCommandResponse(Response):
    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    duration_seconds: float | None = None
    oom_killed: bool = Field(False, description="A process of the sandbox was killed by the out-of-memory killer "
                                                "while the command ran (exit code 137 when it was the command)")


class CreateFileRequest(Request):
    file_path: str
    content: str


class EditFileRequest(Request):
    file_path: str
    start_line: int = Field(ge=0)
    end_line: int = Field(ge=0)
    new_content: str


class PatchFileRequest(Request):
    """Applies a diff-match-patch patch text (``patch_toText(patch_make(old, new))``)."""

    file_path: str
    patch: str


class FileResult(Response):
    status: Status


class UploadFileChunkRequest(Request):
    file_path: str
    content_base64: str = Field(description="Base64-encoded bytes to write at 'offset'")
    offset: int = Field(0, ge=0, description="Byte offset in the file at which to write this chunk")
    truncate: bool = Field(True, description="Cut the file off at the end of this chunk once it is written")


class UploadFileChunkResponse(Response):
    file_path: str
    bytes_written: int
    size: int


class DownloadFileChunkRequest(Request):
    file_path: str
    offset: int = Field(0, ge=0, description="Byte offset in the file to read from")
    length: int = Field(DEFAULT_CHUNK, ge=1, description="Maximum number of raw bytes to read")


class DownloadFileChunkResponse(Response):
    file_path: str
    offset: int
    content_base64: str
    bytes_read: int
    size: int
    eof: bool


MAX_LIST_DEPTH = 10
MAX_LIST_ENTRIES = 10_000


class ListFilesRequest(Request):
    """A directory's entries, and theirs down to ``depth`` levels, sorted by name; symbolic links
    are listed, never followed."""

    file_path: str = Field(".", description="The directory, relative to the project directory (or absolute "
                                            "inside it)")
    depth: int = Field(2, ge=1, le=MAX_LIST_DEPTH, description="Levels listed: 1 is the directory's own entries")
    max_entries: int = Field(1000, ge=1, le=MAX_LIST_ENTRIES,
                             description="The listing stops after this many entries (and says so: truncated)")


class FileEntry(Response):
    path: str = Field(description="Relative to the listed directory, '/'-separated")
    kind: Literal["file", "directory", "symlink", "other"]
    size: int | None = Field(None, description="A file's size in bytes")


class ListFilesResponse(Response):
    file_path: str
    entries: list[FileEntry]
    truncated: bool = Field(description="There were more entries than max_entries: the listing is cut")


# --- rewards ---------------------------------------------------------------------------------


class CheckRequest(TimedRequest):
    keep_processes: bool = Field(
        False, description="IdeGym extension: processes the check starts keep running after it ends (a service "
                           "the next checks use). Otherwise every process the check leaves is ended when it ends")


class SetupRequest(CheckRequest):
    setup_check_script: Arg = "true"
    timeout: Seconds = Field(DEFAULT_TIMEOUT, description="Timeout for the setup in seconds")


class CompilationRequest(CheckRequest):
    compilation_script: Arg = "./gradlew assemble"
    timeout: Seconds = Field(DEFAULT_TIMEOUT, description="Timeout for the compilation in seconds")


class TestRequest(TimedRequest):
    __test__ = False  # not a pytest class
    test_script: Arg = "python -m pytest --junitxml=test-results.xml"
    timeout: Seconds = Field(DEFAULT_TIMEOUT, description="Timeout for the test in seconds")
    report_glob: str = Field(
        "test-*.xml",
        description="Case-insensitive file-name pattern of the JUnit XML reports to read (IdeGym extension)",
    )


class CheckResult(Response):
    """Result of the setup and compilation checks."""

    status: Status
    output: str
    exit_code: int | None = None
    timed_out: bool = False


class TestScores(Response):
    __test__ = False
    total: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0


class TestReport(Response):
    __test__ = False
    status: Status
    scores: TestScores
    output: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    reports: list[str] = Field(default_factory=list)


# --- project, actuator -----------------------------------------------------------------------


class ResetRequest(TimedRequest):
    to_fork_point: bool = Field(False, description="a forked sandbox: back to the project as it was at the fork, "
                                                   "not to the image")


class ResetResult(Response):
    status: Status
    output: str
    killed_processes: int = 0
    restored_entries: int | None = None


class TerminateRequest(Request):
    graceful_termination_timeout: Seconds = Field(DEFAULT_GRACE, description="SIGTERM→SIGKILL grace in seconds")


class TerminateResult(Response):
    killed_processes: int


class CapabilitiesResponse(Response):
    plugins: list[str]


class HealthResponse(Response):
    status: str = "healthy"


# --- code runner -----------------------------------------------------------------------------


class SourceFile(Request):
    path: str
    content: str


class ExecuteRequest(Request):
    language: str = Field(description="the programming language to run (see GET /execute/languages)")
    code: str = Field(description="pure source code only")
    args: list[Arg] = Field(default_factory=list)
    files: list[SourceFile] = Field(default_factory=list)
    stdin: str = Field("", description="text fed to the program's standard input (IdeGym extension)")
    timeout: float = Field(10.0, gt=0, le=300, description="run-time limit in seconds (IdeGym extension)")

    @field_validator("args", "files", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return [] if value is None else value


class ExecuteTimings(BaseModel):
    """Where the runner sandbox's server spent one request's time, in milliseconds."""

    model_config = ConfigDict(populate_by_name=True)

    queued: float = Field(description="waiting for a free run slot (--runner-concurrency)")
    prepare: float = Field(description="the run directory made and the files written")
    compile: float | None = Field(None, description="the compiler's run, for compiled languages")
    start: float | None = Field(None, description="isolated runs: from the hand-over to a waiting init until it "
                                                  "had spawned the program (the run's own mounts, its user, exec)")
    program: float = Field(description="the program, from its spawn (or start) until it ended and its output "
                                       "was read: an interpreter's start is part of it")
    total: float = Field(description="the whole request in the server; the run directory is removed after "
                                     "the answer, outside it")
    program_cpu: float | None = Field(None, alias="programCpu",
                                      description="isolated runs: CPU (user + system) of the program and of every "
                                                  "process of the run that ended before it")
    isolation_cpu: float | None = Field(None, alias="isolationCpu",
                                        description="isolated runs: CPU of the run's own init, from its clone "
                                                    "ahead of demand until the program ended (not its namespaces' "
                                                    "end)")


class ExecuteResponse(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    stdout: str
    stderr: str
    exit_code: int = Field(alias="exitCode")
    timed_out: bool = Field(alias="timedOut")
    stage: str = Field("run", description="'compile' when compilation failed, else 'run'")
    duration_seconds: float = Field(0.0, alias="durationSeconds")
    timings: ExecuteTimings | None = None


class LanguageInfo(Response):
    language: str
    version: str
    aliases: list[str] = Field(default_factory=list)
    compiled: bool


class LanguagesResponse(Response):
    languages: list[LanguageInfo]


# --- errors ----------------------------------------------------------------------------------


class ValidationErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str
    input: Any = None
    ctx: dict[str, Any] | None = None


class HTTPValidationError(BaseModel):
    detail: list[ValidationErrorItem]
    message: str | None = None


class ErrorBody(BaseModel):
    """Body of every non-422 error answered by the sandbox server."""

    error: str
    message: str
    detail: str
    timestamp: str
    details: dict[str, Any] | None = None


# --- agents that bring their own loop (agent_gateway.py) ------------------------------------------

MAX_GATEWAY_WAIT = 3600.0


class AgentStartRequest(TimedRequest):
    """Start an agent harness in the sandbox with its model endpoint: a loopback port of the
    sandbox's own network namespace that answers only ``key``. ``timeout`` bounds the harness's
    whole run; its environment gains ``IDEGYM_GATEWAY_URL``, ``OPENAI_BASE_URL``,
    ``OPENAI_API_KEY``, ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY``."""

    command: list[Arg] = Field(min_length=1, description="argv of the harness")
    key: str = Field(min_length=16, max_length=256, pattern=r"^[A-Za-z0-9_.-]+$",
                     description="the episode's key: a model call without it is refused (401)")
    env: EnvMap | None = Field(None, description="environment on top of the tools' own")
    cwd: Arg | None = Field(None, description="working directory, relative to the project")
    user: Arg | None = None
    call_timeout: Seconds = Field(600.0, description="how long one model call may wait for its reply (then 504)")
    max_output_bytes: int = Field(65_536, ge=0, le=DEFAULT_MAX_OUTPUT, description="kept of each output stream")
    exchange_socket: Arg | None = Field(
        None, description="a Unix socket (its path in the sandbox) the server connects to, says exchange_secret "
                          "on, and then serves POST /api/agent/exchange on: the caller's model calls without the "
                          "control plane's round trip")
    exchange_secret: str | None = Field(None, min_length=16, max_length=256, pattern=r"^[A-Za-z0-9_.-]+$")



class AgentStartResponse(Response):
    port: int
    base_url: str
    exchange_connected: bool = Field(False, description="the server is connected to exchange_socket")


class ModelCall(Response):
    """One HTTP request the agent sent to its model endpoint, as it came."""

    id: str
    method: str
    path: str
    headers: dict[str, str]
    body_base64: str


class ModelReply(Request):
    """The answer to one ``ModelCall``, sent back to the agent as it is."""

    call_id: str
    status: int = Field(200, ge=200, le=599)
    content_type: str = "application/json"
    body_base64: str = ""


class AgentState(Response):
    """The harness process: running, or how it ended (the ends of its output)."""

    running: bool
    exit_code: int | None = None
    timed_out: bool = False
    stdout: str = ""
    stderr: str = ""
    calls: int = Field(0, description="model calls the gateway has received")


class AgentExchangeRequest(Request):
    """Answer the call handed out last (``reply``, if any), then wait up to ``wait`` seconds for
    the agent's next call or its exit."""

    reply: ModelReply | None = None
    wait: Annotated[Seconds, Field(le=MAX_GATEWAY_WAIT)] = 60.0


class AgentExchangeResponse(Response):
    call: ModelCall | None = Field(None, description="the agent's next call; none when it exited or the wait ran out")
    agent: AgentState


class AgentStopRequest(Request):
    graceful_termination_timeout: Seconds = DEFAULT_GRACE


class AgentStopResponse(Response):
    agent: AgentState | None = None


# --- background processes and terminal sessions (sessions.py) ----------------------------------

MAX_SESSION_WAIT = 300.0


class SessionStartRequest(TimedRequest):
    """A background process (``command`` run by bash, its output kept as it comes) or, with
    ``pty``, an interactive terminal session (``command`` in a pseudo-terminal, keys written to it)."""

    command: Arg = Field(min_length=1, description="bash script; with pty, what runs in the terminal")
    cwd: Arg | None = None
    env: EnvMap | None = None
    user: Arg | None = None
    pty: bool = False
    cols: int = Field(120, ge=10, le=1000)
    rows: int = Field(40, ge=2, le=500)
    max_output_bytes: int = Field(1 << 20, ge=1024, le=16 << 20, description="the latest output kept (stdout and "
                                                                           "stderr together)")



class SessionInfo(Response):
    id: str
    pid: int
    pty: bool
    command: str
    running: bool
    exit_code: int | None = None
    timed_out: bool = False
    output_bytes: int = Field(0, description="bytes of output so far (the offset a read starts from to see new ones)")
    cols: int | None = None
    rows: int | None = None


class SessionRef(Request):
    id: str = Field(min_length=1, max_length=64)


class SessionReadRequest(SessionRef):
    offset: int = Field(0, ge=0, description="the first byte wanted (a read's next_offset)")
    wait: Annotated[Seconds, Field(le=MAX_SESSION_WAIT)] = Field(0.0, description="wait this long for new output "
                                                                                  "or the end")
    max_bytes: int = Field(65_536, ge=1, le=1 << 20)


class SessionReadResponse(Response):
    session: SessionInfo
    output: str = Field(description="output from offset (UTF-8, undecodable bytes replaced)")
    offset: int = Field(description="where output starts: later than asked when older output was dropped")
    next_offset: int
    dropped: int = Field(0, description="bytes asked for that are no longer kept")
    screen: str | None = Field(None, description="pty: the terminal's latest lines, escape sequences removed")


class SessionWriteRequest(SessionRef):
    data: str = Field(max_length=65_536, description="keys for the terminal (or text for the process's stdin)")


class SessionResizeRequest(SessionRef):
    cols: int = Field(ge=10, le=1000)
    rows: int = Field(ge=2, le=500)


class SessionEndRequest(SessionRef):
    graceful_termination_timeout: Seconds = DEFAULT_GRACE


class SessionListResponse(Response):
    sessions: list[SessionInfo]
