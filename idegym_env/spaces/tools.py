"""The tools an agent calls: their argument models and the validated tool calls.

Defined once and used for validation (``ToolCallSpace.contains``), parsing what an agent or an
LLM produced (``parsing.py``), the JSON Schemas an LLM is given (``schemas.py``) and the
sandbox-server request (wire model) that carries each call out.

=============  ======================================================  =============================
tool           arguments                                               sandbox endpoint
=============  ======================================================  =============================
bash           command: str, timeout?: float seconds                   POST /api/tools/bash
create_file    path: str, content: str                                 POST /api/tools/file/create
edit_file      path, start_line >= 1, end_line >= start_line - 1,      POST /api/tools/file/edit
               new_content: str
patch_file     path, patch: diff-match-patch patch text                POST /api/tools/file/patch
read_file      path, offset?: byte offset >= 0, length?: bytes >= 1    POST /api/tools/file/download
submit         (none)                                                  (ends the episode: checks run)
=============  ======================================================  =============================
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from sandbox_server.models import (
    DEFAULT_TIMEOUT,
    BashCommandRequest,
    CreateFileRequest,
    DownloadFileChunkRequest,
    EditFileRequest,
    PatchFileRequest,
    Request,
)

from ..errors import IdeGymError

MAX_TIMEOUT = 3600.0
MAX_READ_LENGTH = 16 << 20  # the sandbox server's largest download chunk


# -- argument models -------------------------------------------------------------------------------


def _path_ok(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain a NUL character")
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty or only whitespace")
    return value


FilePath = Annotated[
    str,
    Field(min_length=1, max_length=4096,
          description="File path, relative to the project directory (or absolute inside it)."),
    AfterValidator(_path_ok),
]


class ToolArguments(BaseModel):
    """Arguments of one tool. Strict: no coercion ("3" is not 3, True is not 1), no unknown keys."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class BashArguments(ToolArguments):
    command: Annotated[str, Field(min_length=1, description="Bash script to run in the project directory, "
                                  "e.g. `ls src` or `grep -n foo src/app.py`."), AfterValidator(_not_blank)]
    timeout: Annotated[float, Field(gt=0, le=MAX_TIMEOUT, allow_inf_nan=False)] | None = Field(
        None, description="Seconds before the command is killed: at most the environment's limit, "
                          "which is also what it gets when omitted.")


class CreateFileArguments(ToolArguments):
    path: FilePath
    content: str = Field(description="The complete new content of the file (UTF-8 text). "
                                     "Creates missing parent directories; overwrites an existing file.")


class EditFileArguments(ToolArguments):
    path: FilePath
    start_line: int = Field(ge=1, description="First line to replace, counting from 1.")
    end_line: int = Field(ge=0, description="Last line to replace (inclusive). Use start_line - 1 to insert "
                                            "before start_line without replacing anything.")
    new_content: str = Field(description="Text that replaces the lines; empty deletes them. "
                                         "A trailing newline is added when missing.")

    @model_validator(mode="after")
    def _range(self) -> EditFileArguments:
        if self.end_line < self.start_line - 1:
            raise ValueError(
                f"end_line ({self.end_line}) is before start_line ({self.start_line}); lines "
                f"start_line..end_line are replaced, and end_line = start_line - 1 inserts"
            )
        return self


class PatchFileArguments(ToolArguments):
    path: FilePath
    patch: Annotated[str, Field(min_length=1, description=(
        "Google diff-match-patch patch text, as produced by patch_toText(patch_make(old, new)): "
        "hunks like '@@ -12,7 +12,7 @@' followed by lines starting with ' ', '-' or '+' "
        "(special characters %-encoded). The call fails if a hunk does not apply."
    )), AfterValidator(_not_blank)]


class ReadFileArguments(ToolArguments):
    path: FilePath
    offset: int | None = Field(None, ge=0, description="Byte offset to start reading at (default 0).")
    length: int | None = Field(
        None, ge=1, le=MAX_READ_LENGTH,
        description="Maximum number of bytes to read (default: the environment's limit).")


class SubmitArguments(ToolArguments):
    pass


# -- tool calls ------------------------------------------------------------------------------------


class ToolCall(BaseModel):
    """One validated tool call. Subclasses fix ``tool`` and the ``arguments`` model.

    ``to_action()`` gives the canonical action dict (a member of a ``ToolCallSpace`` that has the
    tool); ``to_request()`` the sandbox-server request (its wire model) that carries it out, None
    for submit. ``Sandbox.run_tool(call)`` sends it.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    tool: str
    arguments: ToolArguments

    description: ClassVar[str] = ""
    request: ClassVar[type[Request] | None] = None  # the wire model; its fields are the arguments'

    def to_action(self) -> dict[str, Any]:
        return {"tool": self.tool, "arguments": self.arguments.model_dump(exclude_none=True)}

    def to_json(self) -> str:
        return json.dumps(self.to_action(), ensure_ascii=False)

    def to_request(self, bash_timeout: float = DEFAULT_TIMEOUT) -> Request | None:
        """The request; ``bash_timeout`` is a bash call's limit (see :meth:`BashCall.to_request`).
        An argument left out takes the wire model's default; ``path`` is the wire's ``file_path``."""
        if self.request is None:
            return None
        fields = self.arguments.model_dump(exclude_none=True)
        if "path" in fields:
            fields["file_path"] = fields.pop("path")
        return self.request(**fields)


class BashCall(ToolCall):
    tool: Literal["bash"] = "bash"
    arguments: BashArguments
    description: ClassVar[str] = (
        "Run a bash script in the project directory and return its stdout, stderr and exit code. "
        "Each call is a fresh shell: cd and variables do not carry over."
    )
    request = BashCommandRequest

    def to_request(self, bash_timeout: float = DEFAULT_TIMEOUT) -> BashCommandRequest:
        """``bash_timeout`` is the call's limit: its timeout when it names none, and the most it may
        name (the agent does not choose how long it may hold the sandbox). Every path that carries
        an agent's call out (the env, and through it MCP, TRL, SkyRL, OpenEnv) builds it here."""
        return BashCommandRequest(command=self.arguments.command, timeout=self.timeout_within(bash_timeout))

    def timeout_within(self, limit: float) -> float:
        """The timeout this call gets under ``limit``."""
        asked = self.arguments.timeout
        return limit if asked is None else min(asked, limit)

    def capped(self, limit: float) -> bool:
        """Whether the call named a longer timeout than ``limit`` allows."""
        return self.arguments.timeout is not None and self.arguments.timeout > limit


class CreateFileCall(ToolCall):
    tool: Literal["create_file"] = "create_file"
    arguments: CreateFileArguments
    description: ClassVar[str] = "Create a file, or overwrite it, with the given content."
    request = CreateFileRequest


class EditFileCall(ToolCall):
    tool: Literal["edit_file"] = "edit_file"
    arguments: EditFileArguments
    description: ClassVar[str] = (
        "Replace lines start_line..end_line (1-based, inclusive) of a text file with new_content. "
        "end_line = start_line - 1 inserts before start_line; empty new_content deletes the lines."
    )
    request = EditFileRequest


class PatchFileCall(ToolCall):
    tool: Literal["patch_file"] = "patch_file"
    arguments: PatchFileArguments
    description: ClassVar[str] = (
        "Apply a diff-match-patch patch to a text file; fails if a hunk does not apply.")
    request = PatchFileRequest


class ReadFileCall(ToolCall):
    tool: Literal["read_file"] = "read_file"
    arguments: ReadFileArguments
    description: ClassVar[str] = "Read a file (or a byte range of it) and return its text."
    request = DownloadFileChunkRequest


class SubmitCall(ToolCall):
    tool: Literal["submit"] = "submit"
    arguments: SubmitArguments = SubmitArguments()
    description: ClassVar[str] = (
        "Declare the task done: the task's checks run and the episode ends with the reward.")


AnyToolCall = Annotated[
    BashCall | CreateFileCall | EditFileCall | PatchFileCall | ReadFileCall | SubmitCall,
    Field(discriminator="tool"),
]
"""Pydantic type of any tool call (for models that hold tool calls, e.g. a task's solution)."""

TOOLS: dict[str, type[ToolCall]] = {
    cls.model_fields["tool"].default: cls
    for cls in (BashCall, CreateFileCall, EditFileCall, PatchFileCall, ReadFileCall, SubmitCall)
}
TOOL_NAMES: tuple[str, ...] = tuple(TOOLS)

EXAMPLES: dict[str, dict[str, Any]] = {
    "bash": {"command": "ls -la"},
    "create_file": {"path": "src/util.py", "content": "def helper():\n    return 1\n"},
    "edit_file": {"path": "src/app.py", "start_line": 3, "end_line": 3, "new_content": "    return a + b"},
    "patch_file": {"path": "src/app.py", "patch": "@@ -25,8 +25,8 @@\n n a \n--\n++\n  b%0A\n"},
    "read_file": {"path": "README.md"},
    "submit": {},
}


class InvalidAction(IdeGymError, ValueError):
    """An action that is not a valid tool call. ``str(exc)`` says what is wrong and what a valid
    call looks like, so it can be shown to the agent as the observation."""

    def __init__(self, reason: str, *, tool: str | None = None, hint: str = "") -> None:
        self.reason = reason
        self.tool = tool
        self.hint = hint
        super().__init__(f"{reason}\n{hint}" if hint else reason)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep reason/tool/hint across pickling (Ray ships exceptions between processes).
        return (_invalid_action, (self.reason, self.tool, self.hint))


def _invalid_action(reason: str, tool: str | None, hint: str) -> InvalidAction:
    return InvalidAction(reason, tool=tool, hint=hint)
