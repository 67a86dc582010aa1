"""``patch_file``: apply a diff-match-patch patch to a text file (``POST /api/tools/file/patch``)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field

from sandbox_server.models import PatchFileRequest

from .base import FilePath, Sampler, ToolArguments, ToolCall, not_blank


class PatchFileArguments(ToolArguments):
    path: FilePath
    patch: Annotated[str, Field(min_length=1, description=(
        "Google diff-match-patch patch text, as produced by patch_toText(patch_make(old, new)): "
        "hunks like '@@ -12,7 +12,7 @@' followed by lines starting with ' ', '-' or '+' "
        "(special characters %-encoded). The call fails if a hunk does not apply."
    )), AfterValidator(not_blank)]


class PatchFileCall(ToolCall):
    tool: Literal["patch_file"] = "patch_file"
    arguments: PatchFileArguments
    description: ClassVar[str] = (
        "Apply a diff-match-patch patch to a text file; fails if a hunk does not apply.")
    example: ClassVar[dict[str, Any]] = {"path": "src/app.py",
                                         "patch": "@@ -25,8 +25,8 @@\n n a \n--\n++\n  b%0A\n"}
    request = PatchFileRequest

    @classmethod
    def sample(cls, sampler: Sampler) -> dict[str, Any]:
        from diff_match_patch import diff_match_patch

        dmp = diff_match_patch()
        old = sampler.text()
        new = old.replace(old.split()[0], sampler.word(), 1)
        text = dmp.patch_toText(dmp.patch_make(old, new)) or dmp.patch_toText(dmp.patch_make(old, old + "x"))
        return {"path": sampler.scratch(), "patch": text}
