"""``list_files``: what a directory of the project holds, a few levels down (``POST /api/tools/file/list``)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from sandbox_server.models import MAX_LIST_DEPTH, ListFilesRequest, ListFilesResponse, Response

from .base import FilePath, Sampler, ToolArguments, ToolCall


class ListFilesArguments(ToolArguments):
    path: FilePath = Field(".", description="The directory to list, relative to the project directory "
                                            "(default: the project directory).")
    depth: int | None = Field(None, ge=1, le=MAX_LIST_DEPTH,
                              description="Levels to list: 1 is the directory's own entries (default 2).")


class ListFilesCall(ToolCall):
    tool: Literal["list_files"] = "list_files"
    arguments: ListFilesArguments
    description: ClassVar[str] = (
        "List the files and directories under a directory, sorted, a few levels down: directories end in /, "
        "symbolic links in @ (never followed), files show their size.")
    example: ClassVar[dict[str, Any]] = {"path": "src", "depth": 1}
    request = ListFilesRequest

    @classmethod
    def sample(cls, sampler: Sampler) -> dict[str, Any]:
        args: dict[str, Any] = {"path": [".", sampler.directory][int(sampler.rng.integers(2))]}
        if sampler.rng.random() < 0.5:
            args["depth"] = int(sampler.rng.integers(1, 4))
        return args

    def observe(self, answer: Response, info: dict[str, Any], limit: float) -> str:
        assert isinstance(answer, ListFilesResponse), answer
        info.update(entries=len(answer.entries), truncated=answer.truncated)
        mark = {"directory": "/", "symlink": "@"}
        lines = [f"{e.path} ({e.size} bytes)" if e.size is not None else e.path + mark.get(e.kind, "")
                 for e in answer.entries]
        if answer.truncated:
            lines.append(f"[... cut at {len(answer.entries)} entries: list a subdirectory, or fewer levels]")
        return "\n".join(lines) if lines else f"{answer.file_path}: an empty directory"
