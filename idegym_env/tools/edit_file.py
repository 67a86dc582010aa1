"""``edit_file``: replace, insert or delete lines of a text file (``POST /api/tools/file/edit``)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from sandbox_server.models import EditFileRequest

from .base import FilePath, Sampler, ToolArguments, ToolCall


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


class EditFileCall(ToolCall):
    tool: Literal["edit_file"] = "edit_file"
    arguments: EditFileArguments
    description: ClassVar[str] = (
        "Replace lines start_line..end_line (1-based, inclusive) of a text file with new_content. "
        "end_line = start_line - 1 inserts before start_line; empty new_content deletes the lines."
    )
    example: ClassVar[dict[str, Any]] = {"path": "src/app.py", "start_line": 3, "end_line": 3,
                                         "new_content": "    return a + b"}
    request = EditFileRequest

    @classmethod
    def sample(cls, sampler: Sampler) -> dict[str, Any]:
        start = int(sampler.rng.integers(1, 4))
        end = start - 1 + int(sampler.rng.integers(0, 2))
        return {"path": sampler.scratch(), "start_line": start, "end_line": end, "new_content": sampler.text()}

    def label(self) -> str:
        return f"edit_file {self.arguments.path}:{self.arguments.start_line}-{self.arguments.end_line}"
