"""``read_file``: a file's text, or a byte range of it (``POST /api/tools/file/download``)."""

from __future__ import annotations

import base64
from typing import Any, ClassVar, Literal

from pydantic import Field

from sandbox_server.models import DownloadFileChunkRequest, DownloadFileChunkResponse, Response

from .base import FilePath, Sampler, ToolArguments, ToolCall

MAX_READ_LENGTH = 16 << 20  # the sandbox server's largest download chunk


class ReadFileArguments(ToolArguments):
    path: FilePath
    offset: int | None = Field(None, ge=0, description="Byte offset to start reading at (default 0).")
    length: int | None = Field(
        None, ge=1, le=MAX_READ_LENGTH,
        description="Maximum number of bytes to read (default: the environment's limit).")


class ReadFileCall(ToolCall):
    tool: Literal["read_file"] = "read_file"
    arguments: ReadFileArguments
    description: ClassVar[str] = "Read a file (or a byte range of it) and return its text."
    example: ClassVar[dict[str, Any]] = {"path": "README.md"}
    request = DownloadFileChunkRequest

    @classmethod
    def sample(cls, sampler: Sampler) -> dict[str, Any]:
        rng = sampler.rng
        args: dict[str, Any] = {"path": sampler.path()}
        if rng.random() < 0.3:
            args["offset"] = int(rng.integers(0, 100))
        if rng.random() < 0.3:
            args["length"] = int(rng.integers(1, 4097))
        return args

    def observe(self, answer: Response, info: dict[str, Any], limit: float) -> str:
        assert isinstance(answer, DownloadFileChunkResponse), answer
        info.update(bytes_read=answer.bytes_read, size=answer.size, eof=answer.eof)
        text = base64.b64decode(answer.content_base64).decode("utf-8", errors="replace")
        return text if answer.eof else text + f"\n[... file continues: {answer.size} bytes in all]"
