"""The tools an agent calls, defined once: a module per tool, and the registry of them here.

=============  ================================================  ==================================
module         tool (arguments)                                  carried out by
=============  ================================================  ==================================
bash.py        bash(command, timeout?)                           POST /api/tools/bash
read_file.py   read_file(path, offset?, length?)                 POST /api/tools/file/download
write_file.py  write_file(path, content); once ``create_file``   POST /api/tools/file/create
edit_file.py   edit_file(path, start_line, end_line, new_content)  POST /api/tools/file/edit
patch_file.py  patch_file(path, patch)                           POST /api/tools/file/patch
list_files.py  list_files(path?, depth?)                         POST /api/tools/file/list
run_checks.py  run_checks()                                      a bash call of the task's tests
submit.py      submit()                                          the env: it grades the episode
=============  ================================================  ==================================

``base.py`` says what a tool's class holds (:class:`ToolCall`); ``schemas.py`` derives the JSON
Schemas, signatures and hints. Everything that offers tools derives them from :data:`TOOLS`:
the action space (``ToolCallSpace``: the tools whose ``in_space`` is set, :data:`TOOL_NAMES`),
and through it the env, OpenEnv and the eval harness's agents; MCP, TRL, SkyRL and verl (every
tool; TRL leaves out the one that ``ends_episode``, as its ``get_reward`` grades).
``tests/test_tools.py`` checks that each exposes exactly these, under these names and schemas.

Adding a tool: a module here with its ``ToolCall`` subclass, its line in :data:`TOOLS`, and, when
no route carries it out yet, the route (``sandbox_server/routes.py``, ``models.py``, ``app.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Discriminator, Tag

from .base import FilePath, InvalidAction, NoArguments, Sampler, ToolArguments, ToolCall
from .bash import BashArguments, BashCall
from .edit_file import EditFileArguments, EditFileCall
from .list_files import ListFilesArguments, ListFilesCall
from .patch_file import PatchFileArguments, PatchFileCall
from .read_file import ReadFileArguments, ReadFileCall
from .run_checks import RunChecksCall
from .submit import SubmitCall
from .write_file import WriteFileArguments, WriteFileCall


def _registry(*tools: type[ToolCall]) -> dict[str, type[ToolCall]]:
    registry: dict[str, type[ToolCall]] = {}
    for tool in tools:
        for name in (tool.name, *tool.aliases):
            if not name or name in registry or any(name in t.aliases for t in registry.values()):
                raise ValueError(f"tool name {name!r} of {tool.__name__} is empty or taken")
        registry[tool.name] = tool
    return registry


TOOLS: dict[str, type[ToolCall]] = _registry(
    BashCall, ReadFileCall, WriteFileCall, EditFileCall, PatchFileCall, ListFilesCall, RunChecksCall, SubmitCall)
"""Every tool, by name, in the order every front end lists them."""

TOOL_NAMES: tuple[str, ...] = tuple(name for name, tool in TOOLS.items() if tool.in_space)
"""The tools of the Gymnasium action space: a ``ToolCallSpace``'s and a task's default."""

ALIASES: dict[str, str] = {alias: tool.name for tool in TOOLS.values() for alias in tool.aliases}
"""An older name -> the tool's name (accepted on input only; see ``write_file.py``)."""


def canonical(name: str) -> str:
    """A tool's name for ``name``, which may be an alias; anything else is returned as it is."""
    return ALIASES.get(name, name)


def _tag(value: Any) -> str | None:
    tool = value.get("tool") if isinstance(value, dict) else getattr(value, "tool", None)
    return canonical(tool) if isinstance(tool, str) else None


if TYPE_CHECKING:  # the union is built at run time from the registry; statically it is a tool call
    AnyToolCall = ToolCall
else:
    AnyToolCall = Annotated[
        Union[tuple(Annotated[tool, Tag(tool.name)] for tool in TOOLS.values() if tool.in_space)],  # noqa: UP007
        Discriminator(_tag),
    ]
"""Pydantic type of a call of the action space's tools (a task's ``solution`` and ``actions``);
a call that names its tool by an alias is read as that tool's."""

__all__ = [
    "TOOLS", "TOOL_NAMES", "ALIASES", "canonical", "AnyToolCall", "ToolCall", "ToolArguments", "NoArguments",
    "InvalidAction", "Sampler", "FilePath",
    "BashCall", "BashArguments", "ReadFileCall", "ReadFileArguments", "WriteFileCall", "WriteFileArguments",
    "EditFileCall", "EditFileArguments", "PatchFileCall", "PatchFileArguments", "ListFilesCall",
    "ListFilesArguments", "RunChecksCall", "SubmitCall",
]
