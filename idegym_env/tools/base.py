"""What a tool is: its arguments, its call, and every part of IdeGym that needs it, on one class.

A tool is a :class:`ToolCall` subclass in a module of its own; its class says everything about it:

=================  ==========================================================================
``tool``           its name, the ``Literal`` default of the field (the discriminator)
``arguments``      its arguments' model (a :class:`ToolArguments`: strict, no unknown keys)
``description``    what an LLM is told; ``example``: one valid ``arguments`` object
``aliases``        older names accepted on input (a published wire or stored tasks use them)
``request``        its sandbox-server wire model (the route follows from it); None: no route
``sample``         a valid, harmless ``arguments`` for ``ToolCallSpace.sample``
``to_request``     the wire request that carries a call out
``observe``        the observation text of the route's answer (and the step's ``info``)
``in_task``        the call the env runs for it in a task's episode (``run_checks``: a bash call)
``in_space``       whether the Gymnasium action space has it; ``ends_episode``: it grades
=================  ==========================================================================

The registry (``idegym_env/tools/__init__.py``) lists the classes; the action space, the env,
OpenEnv, MCP, TRL, SkyRL and verl all derive their tools from it.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from sandbox_server.models import DEFAULT_TIMEOUT, Request, Response

from ..errors import IdeGymError

if TYPE_CHECKING:
    from ..tasks import Task


def _path_ok(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain a NUL character")
    return value


def not_blank(value: str) -> str:
    """An ``AfterValidator``: a text that must say something."""
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


class NoArguments(ToolArguments):
    pass  # the arguments of a tool that takes none (a docstring would be its schema's description)


@dataclass
class Sampler:
    """What a tool's ``sample`` draws from: the space's generator, the directory it may write in
    (``directory``) and paths it may read (``paths``, which may not exist)."""

    rng: np.random.Generator
    directory: str
    paths: tuple[str, ...]

    def word(self) -> str:
        letters = np.array(list(string.ascii_lowercase))
        return "".join(self.rng.choice(letters, size=int(self.rng.integers(3, 9))))

    def text(self) -> str:
        return "\n".join(" ".join(self.word() for _ in range(int(self.rng.integers(1, 6))))
                         for _ in range(int(self.rng.integers(1, 4)))) + "\n"

    def scratch(self) -> str:
        """A new file's path under ``directory``."""
        return f"{self.directory}/{self.word()}.txt"

    def path(self) -> str:
        """One of ``paths`` (a scratch path when there are none)."""
        if not self.paths:
            return self.scratch()
        return self.paths[int(self.rng.integers(len(self.paths)))]


class ToolCall(BaseModel):
    """One validated tool call; a subclass per tool is that tool's whole definition (see the
    module docstring).

    ``to_action()`` gives the canonical action dict (a member of a ``ToolCallSpace`` that has the
    tool); ``to_request()`` the sandbox-server request (its wire model) that carries it out, None
    for a tool the env carries out itself. ``Sandbox.run_tool(call)`` sends it.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    tool: str
    arguments: ToolArguments

    name: ClassVar[str] = ""  # the ``tool`` literal, set for each subclass
    description: ClassVar[str] = ""
    example: ClassVar[dict[str, Any]] = {}
    aliases: ClassVar[tuple[str, ...]] = ()
    request: ClassVar[type[Request] | None] = None  # the wire model; its fields are the arguments'
    in_space: ClassVar[bool] = True
    ends_episode: ClassVar[bool] = False

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        default = cls.model_fields["tool"].default
        if isinstance(default, str) and default:
            cls.name = default

    @field_validator("tool", mode="before")
    @classmethod
    def _alias(cls, value: Any) -> Any:
        return cls.name if value in cls.aliases else value

    @classmethod
    def arguments_model(cls) -> type[ToolArguments]:
        """The model of this tool's ``arguments``."""
        annotation = cls.model_fields["arguments"].annotation
        assert isinstance(annotation, type) and issubclass(annotation, ToolArguments), annotation
        return annotation

    @classmethod
    def sample(cls, sampler: Sampler) -> dict[str, Any]:
        """Valid and harmless arguments (``check_env`` executes what ``sample()`` returns)."""
        return dict(cls.example)

    def to_action(self) -> dict[str, Any]:
        return {"tool": self.tool, "arguments": self.arguments.model_dump(exclude_none=True)}

    def to_json(self) -> str:
        return json.dumps(self.to_action(), ensure_ascii=False)

    def to_request(self, limit: float = DEFAULT_TIMEOUT) -> Request | None:
        """The request; ``limit`` is the most seconds a call may run (a bash call's timeout, see
        ``BashCall.to_request``). An argument left out takes the wire model's default; ``path``
        is the wire's ``file_path``."""
        if self.request is None:
            return None
        fields = self.arguments.model_dump(exclude_none=True)
        if "path" in fields:
            fields["file_path"] = fields.pop("path")
        return self.request(**fields)

    def observe(self, answer: Response, info: dict[str, Any], limit: float) -> str:
        """The observation text of the route's ``answer``; puts the step's details in ``info``.
        ``limit`` is what :meth:`to_request` was given."""
        return f"ok: {self.tool} {getattr(self.arguments, 'path', '')}".rstrip()

    def in_task(self, task: Task) -> ToolCall | str:
        """What the env runs for this call in an episode of ``task``: the call itself, another
        call, or (a string) the answer when there is nothing to run."""
        return self

    def describe(self) -> str:
        """The call as a line of the transcript."""
        return f"{self.tool} {json.dumps(self.arguments.model_dump(exclude_none=True))[:300]}"

    def label(self) -> str:
        """A short label, e.g. ``read_file src/app.py`` (``DiscreteActions``)."""
        return f"{self.tool} {getattr(self.arguments, 'path', '')}".rstrip()


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
