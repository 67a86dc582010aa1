"""``ToolCallSpace``: actions are tool calls ``{"tool": name, "arguments": {...}}``.

The tools and their arguments are pydantic models, defined once here and used for three things:
strict validation (:meth:`ToolCallSpace.contains`), parsing what an agent or an LLM produced
(:meth:`ToolCallSpace.parse`), and the JSON Schemas an LLM is given (:meth:`ToolCallSpace.tool_schemas`).

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
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

import numpy as np
from gymnasium.spaces import Space
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

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
        None, description=f"Seconds before the command is killed (at most {MAX_TIMEOUT:g}); "
                          "the environment's default when omitted.")


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


class SandboxRequest(NamedTuple):
    """A sandbox-server request: ``POST path`` with JSON ``body``."""

    path: str
    body: dict[str, Any]


class ToolCall(BaseModel):
    """One validated tool call. Subclasses fix ``tool`` and the ``arguments`` model.

    ``to_action()`` gives the canonical action dict (a member of a ``ToolCallSpace`` that has the
    tool); ``sandbox_request()`` the sandbox-server request that performs it (None for submit).
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    tool: str
    arguments: ToolArguments

    description: ClassVar[str] = ""
    endpoint: ClassVar[str | None] = None

    def to_action(self) -> dict[str, Any]:
        return {"tool": self.tool, "arguments": self.arguments.model_dump(exclude_none=True)}

    def to_json(self) -> str:
        return json.dumps(self.to_action(), ensure_ascii=False)

    def sandbox_request(self) -> SandboxRequest | None:
        return None


class BashCall(ToolCall):
    tool: Literal["bash"] = "bash"
    arguments: BashArguments
    description: ClassVar[str] = (
        "Run a bash script in the project directory and return its stdout, stderr and exit code. "
        "Each call is a fresh shell: cd and variables do not carry over."
    )
    endpoint: ClassVar[str | None] = "/api/tools/bash"

    def sandbox_request(self) -> SandboxRequest:
        body: dict[str, Any] = {"command": self.arguments.command}
        if self.arguments.timeout is not None:
            body["timeout"] = self.arguments.timeout
        return SandboxRequest("/api/tools/bash", body)


class CreateFileCall(ToolCall):
    tool: Literal["create_file"] = "create_file"
    arguments: CreateFileArguments
    description: ClassVar[str] = "Create a file, or overwrite it, with the given content."
    endpoint: ClassVar[str | None] = "/api/tools/file/create"

    def sandbox_request(self) -> SandboxRequest:
        return SandboxRequest("/api/tools/file/create",
                              {"file_path": self.arguments.path, "content": self.arguments.content})


class EditFileCall(ToolCall):
    tool: Literal["edit_file"] = "edit_file"
    arguments: EditFileArguments
    description: ClassVar[str] = (
        "Replace lines start_line..end_line (1-based, inclusive) of a text file with new_content. "
        "end_line = start_line - 1 inserts before start_line; empty new_content deletes the lines."
    )
    endpoint: ClassVar[str | None] = "/api/tools/file/edit"

    def sandbox_request(self) -> SandboxRequest:
        a = self.arguments
        return SandboxRequest("/api/tools/file/edit", {"file_path": a.path, "start_line": a.start_line,
                                                       "end_line": a.end_line, "new_content": a.new_content})


class PatchFileCall(ToolCall):
    tool: Literal["patch_file"] = "patch_file"
    arguments: PatchFileArguments
    description: ClassVar[str] = (
        "Apply a diff-match-patch patch to a text file; fails if a hunk does not apply.")
    endpoint: ClassVar[str | None] = "/api/tools/file/patch"

    def sandbox_request(self) -> SandboxRequest:
        body = {"file_path": self.arguments.path, "patch": self.arguments.patch}
        return SandboxRequest("/api/tools/file/patch", body)


class ReadFileCall(ToolCall):
    tool: Literal["read_file"] = "read_file"
    arguments: ReadFileArguments
    description: ClassVar[str] = "Read a file (or a byte range of it) and return its text."
    endpoint: ClassVar[str | None] = "/api/tools/file/download"

    def sandbox_request(self) -> SandboxRequest:
        """The download request; its response carries base64 ``content_base64`` to decode as UTF-8."""
        body: dict[str, Any] = {"file_path": self.arguments.path, "offset": self.arguments.offset or 0}
        if self.arguments.length is not None:
            body["length"] = self.arguments.length
        return SandboxRequest("/api/tools/file/download", body)


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


class InvalidAction(ValueError):
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


# -- JSON schemas ----------------------------------------------------------------------------------


def _clean_schema(node: Any) -> Any:
    """Drop pydantic's titles and turn ``X | None = None`` into an optional ``X``."""
    if isinstance(node, list):
        return [_clean_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _clean_schema(v) for k, v in node.items() if not (k == "title" and isinstance(v, str))}
    any_of = out.get("anyOf")
    if isinstance(any_of, list) and len(any_of) == 2 and {"type": "null"} in any_of and "default" in out \
            and out["default"] is None:
        (inner,) = [s for s in any_of if s != {"type": "null"}]
        out.pop("anyOf")
        out.pop("default")
        out = {**inner, **out}
    if "properties" in out:
        out["properties"] = {name: _clean_schema(s) for name, s in node["properties"].items()}
    return out


def arguments_schema(tool: str) -> dict[str, Any]:
    """JSON Schema of one tool's arguments object."""
    schema = _clean_schema(TOOLS[tool].model_fields["arguments"].annotation.model_json_schema())
    schema.setdefault("properties", {})
    schema["additionalProperties"] = False
    return schema


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def signature(tool: str) -> str:
    """One line describing a tool's arguments, e.g. ``read_file(path: string, offset?: integer >= 0)``."""
    schema = arguments_schema(tool)
    required = set(schema.get("required", []))
    parts = []
    for name, prop in schema["properties"].items():
        kind = prop.get("type", "value")
        bounds = [f"{op} {_num(prop[key])}" for key, op in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                                         ("maximum", "<=")) if key in prop]
        bound = " ".join(b for b in bounds if b)
        parts.append(f"{name}{'' if name in required else '?'}: {kind}{' ' + bound if bound else ''}")
    return f"{tool}({', '.join(parts)})"


def example(tool: str) -> str:
    return json.dumps({"tool": tool, "arguments": EXAMPLES[tool]}, ensure_ascii=False)


# -- parsing helpers -------------------------------------------------------------------------------

_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n(.*)\n\s*```$", re.S)
_CANONICAL_KEYS = {"tool", "arguments"}
_NAME_ENVELOPE = {"name", "arguments", "input", "parameters", "type", "id", "call_id", "index", "status"}
_FUNCTION_ENVELOPE = {"function", "type", "id", "index"}
_TYPES = {"function", "function_call", "tool_use", "tool_call"}


def _plain(value: Any) -> Any:
    """numpy scalars become Python scalars (a Dict-space policy may hand those over)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _describe_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"]) or "call"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            lines.append(f"{loc}: missing (required)")
        elif err["type"] == "extra_forbidden":
            lines.append(f"{loc}: unexpected argument")
        elif len(err["loc"]) < 2:  # a whole-object check: its message says it all
            lines.append(f"{loc}: {msg}")
        else:
            shown = repr(err.get("input"))
            lines.append(f"{loc}: {msg} (got {shown[:80] + '…' if len(shown) > 80 else shown})")
    return "; ".join(lines)


def _loads(text: str, what: str, hint: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidAction(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                            hint=hint) from None


# -- the space -------------------------------------------------------------------------------------


class ToolCallSpace(Space[dict]):
    """Tool calls ``{"tool": name, "arguments": {...}}`` for a subset of :data:`TOOL_NAMES`.

    Members are exactly the canonical dicts whose ``tool`` is enabled and whose ``arguments``
    validate strictly against the tool's model (unknown keys, missing required keys, wrong types
    and out-of-range numbers all fail; numpy scalars count as their Python values).

    ``parse(action)`` is the lenient entry point for ``env.step``: it also accepts a
    :class:`ToolCall`, a JSON string (optionally in a Markdown code fence) and the OpenAI /
    Anthropic tool-call shapes, and raises :class:`InvalidAction` with an explanation otherwise.

    ``sample()`` returns valid and harmless calls, seeded by the space's ``np_random``: bash
    commands that only print or list, file writes under ``sample_dir``, reads of ``sample_paths``
    (which may not exist; the error becomes an observation) and ``submit``. ``mask`` (int8 array
    over ``tools``) or ``probability`` (float array summing to 1) select the tool.
    """

    def __init__(
        self,
        tools: Iterable[str] | None = None,
        *,
        sample_dir: str = "scratch",
        sample_paths: Sequence[str] = ("README.md", "scratch/notes.txt", "missing.txt"),
        seed: int | np.random.Generator | None = None,
    ) -> None:
        names = tuple(TOOL_NAMES if tools is None else tools)
        unknown = [t for t in names if t not in TOOLS]
        if unknown:
            raise ValueError(f"unknown tools {unknown}; the tools are {list(TOOL_NAMES)}")
        if not names:
            raise ValueError("a ToolCallSpace needs at least one tool")
        if len(set(names)) != len(names):
            raise ValueError(f"tools listed twice: {list(names)}")
        self.tools: tuple[str, ...] = names
        self.sample_dir = sample_dir.strip("/") or "scratch"
        self.sample_paths = tuple(sample_paths)
        super().__init__(shape=None, dtype=None, seed=seed)

    # -- membership and parsing -------------------------------------------------------------------

    def contains(self, x: Any) -> bool:
        """True iff ``x`` is a canonical tool-call dict for an enabled tool with valid arguments."""
        if not isinstance(x, Mapping) or set(x.keys()) != _CANONICAL_KEYS:
            return False
        tool, arguments = x["tool"], x["arguments"]
        if not isinstance(tool, str) or tool not in self.tools or not isinstance(arguments, Mapping):
            return False
        try:
            TOOLS[tool].model_validate({"tool": tool, "arguments": _plain(arguments)})
        except ValidationError:
            return False
        return True

    def parse(self, action: Any) -> ToolCall:
        """Turn an action into a validated :class:`ToolCall`, or raise :class:`InvalidAction`.

        Accepted shapes (as a dict or as a JSON string of one):

        * ``{"tool": "bash", "arguments": {"command": "ls"}}`` (``arguments`` may be omitted for
          ``submit`` and may itself be a JSON string);
        * OpenAI function call ``{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}``, also with
          ``"type": "function_call"`` and ``call_id`` (Responses API);
        * OpenAI chat tool call ``{"type": "function", "id": "call_1", "function": {"name": ...,
          "arguments": ...}}`` or ``{"function": {...}}``;
        * Anthropic ``{"type": "tool_use", "id": ..., "name": ..., "input": {...}}`` and
          ``{"name": ..., "parameters": {...}}``;
        * a :class:`ToolCall` instance.
        """
        if isinstance(action, ToolCall):
            self._check_enabled(action.tool)
            return action
        if isinstance(action, bytes):
            try:
                action = action.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidAction("the action bytes are not UTF-8 text", hint=self._hint()) from None
        if isinstance(action, str):
            text = action.strip()
            if not text:
                raise InvalidAction("the action is empty: expected one tool call as JSON", hint=self._hint())
            fenced = _FENCE.match(text)
            action = _loads(fenced.group(1) if fenced else text, "the action", self._hint())
        if isinstance(action, list):
            raise InvalidAction(f"expected exactly one tool call per step, got a list of {len(action)}",
                                hint=self._hint())
        if not isinstance(action, Mapping):
            raise InvalidAction(f"a tool call is a JSON object, got {type(action).__name__}",
                                hint=self._hint())
        name, arguments = self._unwrap(action)
        self._check_enabled(name)
        if arguments is None:
            arguments = {}
        elif isinstance(arguments, str):
            text = arguments.strip()
            arguments = _loads(text, f"the arguments of {name}", self._hint(name)) if text else {}
        if not isinstance(arguments, Mapping):
            kind = type(arguments).__name__
            raise InvalidAction(f"the arguments of {name} must be a JSON object, got {kind}",
                                tool=name, hint=self._hint(name))
        try:
            return TOOLS[name].model_validate({"tool": name, "arguments": _plain(arguments)})
        except ValidationError as exc:
            raise InvalidAction(f"invalid {name} call: {_describe_errors(exc)}", tool=name,
                                hint=self._hint(name)) from None

    def _unwrap(self, action: Mapping[str, Any]) -> tuple[str, Any]:
        keys = set(action.keys())
        if "tool" in keys:
            if keys - _CANONICAL_KEYS:
                extra = sorted(map(str, keys - _CANONICAL_KEYS))
                raise InvalidAction(f"unexpected keys {extra} in a tool call; a tool call has only 'tool' "
                                    "and 'arguments'", hint=self._hint())
            name, arguments = action["tool"], action.get("arguments")
        elif "function" in keys:
            self._check_envelope(action, _FUNCTION_ENVELOPE)
            function = action["function"]
            if not isinstance(function, Mapping) or "name" not in function:
                raise InvalidAction("'function' must be an object with 'name' and 'arguments'",
                                    hint=self._hint())
            extra = set(function.keys()) - {"name", "arguments"}
            if extra:
                raise InvalidAction(f"unexpected keys {sorted(map(str, extra))} in 'function'",
                                    hint=self._hint())
            name, arguments = function["name"], function.get("arguments")
        elif "name" in keys:
            self._check_envelope(action, _NAME_ENVELOPE)
            given = [k for k in ("arguments", "input", "parameters") if k in keys]
            if len(given) > 1:
                raise InvalidAction(f"the arguments are given twice ({' and '.join(given)})",
                                    hint=self._hint())
            name, arguments = action["name"], action[given[0]] if given else None
        else:
            raise InvalidAction("the tool call names no tool: expected a 'tool' key (or 'name', or "
                                "'function')", hint=self._hint())
        if not isinstance(name, str) or not name:
            raise InvalidAction(f"the tool name must be a non-empty string, got {name!r}", hint=self._hint())
        return name, arguments

    def _check_envelope(self, action: Mapping[str, Any], allowed: set[str]) -> None:
        extra = set(action.keys()) - allowed
        if extra:
            raise InvalidAction(f"unexpected keys {sorted(map(str, extra))} in the tool call",
                                hint=self._hint())
        kind = action.get("type")
        if kind is not None and kind not in _TYPES:
            raise InvalidAction(f"'type' is {kind!r}; a tool call has type 'function' (or omits it)",
                                hint=self._hint())

    def _check_enabled(self, name: str) -> None:
        if name in self.tools:
            return
        if name in TOOLS:
            raise InvalidAction(f"the tool {name!r} is not available here; the available tools are "
                                f"{', '.join(self.tools)}", tool=name, hint=self._hint())
        raise InvalidAction(f"unknown tool {name!r}; the available tools are {', '.join(self.tools)}",
                            tool=name, hint=self._hint())

    def _hint(self, tool: str | None = None) -> str:
        if tool is not None:
            return f"Expected {signature(tool)}, for example: {example(tool)}"
        sigs = "; ".join(signature(t) for t in self.tools)
        return f"A valid call looks like {example(self.tools[0])}. Tools: {sigs}"

    # -- schemas ----------------------------------------------------------------------------------

    def tool_schemas(
        self, style: Literal["openai", "responses", "anthropic"] = "openai"
    ) -> list[dict[str, Any]]:
        """The enabled tools as function definitions an LLM API accepts.

        ``"openai"``: Chat Completions, ``[{"type": "function", "function": {name, description,
        parameters}}]``; ``"responses"``: OpenAI Responses, ``[{"type": "function", name,
        description, parameters}]``; ``"anthropic"``: ``[{name, description, input_schema}]``.
        Every call the model makes back is accepted by :meth:`parse`.
        """
        out: list[dict[str, Any]] = []
        for name in self.tools:
            desc, params = TOOLS[name].description, arguments_schema(name)
            if style == "openai":
                function = {"name": name, "description": desc, "parameters": params}
                out.append({"type": "function", "function": function})
            elif style == "responses":
                out.append({"type": "function", "name": name, "description": desc, "parameters": params})
            elif style == "anthropic":
                out.append({"name": name, "description": desc, "input_schema": params})
            else:
                raise ValueError(f"unknown style {style!r}; use 'openai', 'responses' or 'anthropic'")
        return out

    # -- sampling ---------------------------------------------------------------------------------

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> dict[str, Any]:
        """A valid, harmless tool call; ``mask`` or ``probability`` weight the tools (in ``self.tools``)."""
        rng = self.np_random
        n = len(self.tools)
        if mask is not None and probability is not None:
            raise ValueError("pass either mask or probability, not both")
        if mask is not None:
            weights = np.asarray(mask, dtype=np.float64)
            if weights.shape != (n,) or not np.all((weights == 0) | (weights == 1)) or weights.sum() == 0:
                raise ValueError(f"mask must be {n} zeros/ones over {self.tools} with at least one 1")
            p = weights / weights.sum()
        elif probability is not None:
            p = np.asarray(probability, dtype=np.float64)
            if p.shape != (n,) or np.any(p < 0) or not np.isclose(p.sum(), 1.0):
                raise ValueError(
                    f"probability must be {n} non-negative numbers over {self.tools} summing to 1")
        else:
            p = None
        tool = self.tools[int(rng.choice(n, p=p))]
        return {"tool": tool, "arguments": getattr(self, f"_sample_{tool}")(rng)}

    @staticmethod
    def _word(rng: np.random.Generator) -> str:
        letters = np.array(list(string.ascii_lowercase))
        return "".join(rng.choice(letters, size=int(rng.integers(3, 9))))

    def _text(self, rng: np.random.Generator) -> str:
        return "\n".join(" ".join(self._word(rng) for _ in range(int(rng.integers(1, 6))))
                         for _ in range(int(rng.integers(1, 4)))) + "\n"

    def _scratch(self, rng: np.random.Generator) -> str:
        return f"{self.sample_dir}/{self._word(rng)}.txt"

    def _sample_bash(self, rng: np.random.Generator) -> dict[str, Any]:
        # Only commands that print or list: check_env executes whatever sample() returns.
        word = self._word(rng)
        paths = self.sample_paths or ("README.md",)
        path = paths[int(rng.integers(len(paths)))]
        templates = [f"echo {word}", "pwd", "ls", "ls -la", f"printf '%s\\n' {word}", f"cat {path}",
                     f"wc -l {path}", "true"]
        args: dict[str, Any] = {"command": templates[int(rng.integers(len(templates)))]}
        if rng.random() < 0.5:
            args["timeout"] = float(rng.choice([5.0, 10.0, 30.0]))
        return args

    def _sample_create_file(self, rng: np.random.Generator) -> dict[str, Any]:
        return {"path": self._scratch(rng), "content": self._text(rng)}

    def _sample_edit_file(self, rng: np.random.Generator) -> dict[str, Any]:
        start = int(rng.integers(1, 4))
        end = start - 1 + int(rng.integers(0, 2))
        return {"path": self._scratch(rng), "start_line": start, "end_line": end,
                "new_content": self._text(rng)}

    def _sample_patch_file(self, rng: np.random.Generator) -> dict[str, Any]:
        from diff_match_patch import diff_match_patch

        dmp = diff_match_patch()
        old = self._text(rng)
        new = old.replace(old.split()[0], self._word(rng), 1)
        text = dmp.patch_toText(dmp.patch_make(old, new)) or dmp.patch_toText(dmp.patch_make(old, old + "x"))
        return {"path": self._scratch(rng), "patch": text}

    def _sample_read_file(self, rng: np.random.Generator) -> dict[str, Any]:
        paths = list(self.sample_paths) or [self._scratch(rng)]
        args: dict[str, Any] = {"path": paths[int(rng.integers(len(paths)))]}
        if rng.random() < 0.3:
            args["offset"] = int(rng.integers(0, 100))
        if rng.random() < 0.3:
            args["length"] = int(rng.integers(1, 4097))
        return args

    def _sample_submit(self, rng: np.random.Generator) -> dict[str, Any]:
        return {}

    @property
    def is_np_flattenable(self) -> bool:
        return False

    # -- serialization, comparison ----------------------------------------------------------------

    def to_jsonable(self, sample_n: Iterable[Any]) -> list[Any]:
        """Canonical tool-call dicts (JSON objects); :class:`ToolCall` instances are converted."""
        return [x.to_action() if isinstance(x, ToolCall) else json.loads(json.dumps(_plain(x)))
                for x in sample_n]

    def from_jsonable(self, sample_n: Sequence[Any]) -> list[dict[str, Any]]:
        """Inverse of :meth:`to_jsonable`; raises :class:`InvalidAction` for a non-member."""
        out = []
        for item in sample_n:
            if not self.contains(item):
                self.parse(item)  # raises with the reason
                raise InvalidAction(f"{item!r} is not canonical: use {{'tool': ..., 'arguments': {{...}}}}")
            out.append(dict(item))
        return out

    def __repr__(self) -> str:
        return f"ToolCallSpace(tools={list(self.tools)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ToolCallSpace) and self.tools == other.tools

    def __hash__(self) -> int:
        return hash((ToolCallSpace, self.tools))


__all__ = [
    "ToolCallSpace",
    "ToolCall",
    "AnyToolCall",
    "BashCall",
    "CreateFileCall",
    "EditFileCall",
    "PatchFileCall",
    "ReadFileCall",
    "SubmitCall",
    "ToolArguments",
    "BashArguments",
    "CreateFileArguments",
    "EditFileArguments",
    "PatchFileArguments",
    "ReadFileArguments",
    "SubmitArguments",
    "InvalidAction",
    "SandboxRequest",
    "TOOLS",
    "TOOL_NAMES",
    "arguments_schema",
    "signature",
]
