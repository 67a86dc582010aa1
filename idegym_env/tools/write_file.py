"""``write_file``: create a file, or overwrite it (``POST /api/tools/file/create``).

Its name until the tools were defined once was ``create_file`` in the Gymnasium action space and
OpenEnv (``write_file`` in MCP, TRL, SkyRL and verl): that name is still accepted on input, for
OpenEnv clients, actions of existing agents and tasks whose ``solution``, ``actions`` or
``tools`` name it."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from sandbox_server.models import CreateFileRequest

from .base import FilePath, Sampler, ToolArguments, ToolCall


class WriteFileArguments(ToolArguments):
    path: FilePath
    content: str = Field(description="The complete new content of the file (UTF-8 text). "
                                     "Creates missing parent directories; overwrites an existing file.")


class WriteFileCall(ToolCall):
    tool: Literal["write_file"] = "write_file"
    arguments: WriteFileArguments
    description: ClassVar[str] = "Create a file, or overwrite it, with the given content."
    example: ClassVar[dict[str, Any]] = {"path": "src/util.py", "content": "def helper():\n    return 1\n"}
    aliases: ClassVar[tuple[str, ...]] = ("create_file",)
    request = CreateFileRequest

    @classmethod
    def sample(cls, sampler: Sampler) -> dict[str, Any]:
        return {"path": sampler.scratch(), "content": sampler.text()}
