"""Reading one tool call out of what an agent or an LLM produced: the canonical dict, a JSON
string (optionally in a Markdown code fence), the OpenAI and Anthropic tool-call shapes."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import ValidationError

from ..tools import TOOLS, InvalidAction, ToolCall, canonical
from ..tools.schemas import hint

_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n(.*)\n\s*```$", re.S)
CANONICAL_KEYS = {"tool", "arguments"}
_NAME_ENVELOPE = {"name", "arguments", "input", "parameters", "type", "id", "call_id", "index", "status"}
_FUNCTION_ENVELOPE = {"function", "type", "id", "index"}
_TYPES = {"function", "function_call", "tool_use", "tool_call"}


def plain(value: Any) -> Any:
    """numpy scalars become Python scalars (a Dict-space policy may hand those over)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def parse_tool_call(action: Any, tools: tuple[str, ...]) -> ToolCall:
    """``action`` as a validated :class:`ToolCall` of one of ``tools``, or :class:`InvalidAction`
    (the shapes are listed in ``ToolCallSpace.parse``). A tool may be named by an alias."""
    if isinstance(action, ToolCall):
        check_enabled(action.tool, tools)
        return action
    if isinstance(action, bytes):
        try:
            action = action.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidAction("the action bytes are not UTF-8 text", hint=hint(tools)) from None
    if isinstance(action, str):
        text = action.strip()
        if not text:
            raise InvalidAction("the action is empty: expected one tool call as JSON", hint=hint(tools))
        fenced = _FENCE.match(text)
        action = _loads(fenced.group(1) if fenced else text, "the action", hint(tools))
    if isinstance(action, list):
        raise InvalidAction(f"expected exactly one tool call per step, got a list of {len(action)}",
                            hint=hint(tools))
    if not isinstance(action, Mapping):
        raise InvalidAction(f"a tool call is a JSON object, got {type(action).__name__}", hint=hint(tools))
    name, arguments = _unwrap(action, tools)
    name = canonical(name)
    check_enabled(name, tools)
    if arguments is None:
        arguments = {}
    elif isinstance(arguments, str):
        text = arguments.strip()
        arguments = _loads(text, f"the arguments of {name}", hint(tools, name)) if text else {}
    if not isinstance(arguments, Mapping):
        kind = type(arguments).__name__
        raise InvalidAction(f"the arguments of {name} must be a JSON object, got {kind}",
                            tool=name, hint=hint(tools, name))
    try:
        return TOOLS[name].model_validate({"tool": name, "arguments": plain(arguments)})
    except ValidationError as exc:
        raise InvalidAction(f"invalid {name} call: {_describe_errors(exc)}", tool=name,
                            hint=hint(tools, name)) from None


def check_enabled(name: str, tools: tuple[str, ...]) -> None:
    if name in tools:
        return
    if name in TOOLS:
        raise InvalidAction(f"the tool {name!r} is not available here; the available tools are "
                            f"{', '.join(tools)}", tool=name, hint=hint(tools))
    raise InvalidAction(f"unknown tool {name!r}; the available tools are {', '.join(tools)}",
                        tool=name, hint=hint(tools))


def _unwrap(action: Mapping[str, Any], tools: tuple[str, ...]) -> tuple[str, Any]:
    keys = set(action.keys())
    if "tool" in keys:
        if keys - CANONICAL_KEYS:
            extra = sorted(map(str, keys - CANONICAL_KEYS))
            raise InvalidAction(f"unexpected keys {extra} in a tool call; a tool call has only 'tool' "
                                "and 'arguments'", hint=hint(tools))
        name, arguments = action["tool"], action.get("arguments")
    elif "function" in keys:
        _check_envelope(action, _FUNCTION_ENVELOPE, tools)
        function = action["function"]
        if not isinstance(function, Mapping) or "name" not in function:
            raise InvalidAction("'function' must be an object with 'name' and 'arguments'", hint=hint(tools))
        unexpected = set(function.keys()) - {"name", "arguments"}
        if unexpected:
            raise InvalidAction(f"unexpected keys {sorted(map(str, unexpected))} in 'function'", hint=hint(tools))
        name, arguments = function["name"], function.get("arguments")
    elif "name" in keys:
        _check_envelope(action, _NAME_ENVELOPE, tools)
        given = [k for k in ("arguments", "input", "parameters") if k in keys]
        if len(given) > 1:
            raise InvalidAction(f"the arguments are given twice ({' and '.join(given)})", hint=hint(tools))
        name, arguments = action["name"], action[given[0]] if given else None
    else:
        raise InvalidAction("the tool call names no tool: expected a 'tool' key (or 'name', or "
                            "'function')", hint=hint(tools))
    if not isinstance(name, str) or not name:
        raise InvalidAction(f"the tool name must be a non-empty string, got {name!r}", hint=hint(tools))
    return name, arguments


def _check_envelope(action: Mapping[str, Any], allowed: set[str], tools: tuple[str, ...]) -> None:
    extra = set(action.keys()) - allowed
    if extra:
        raise InvalidAction(f"unexpected keys {sorted(map(str, extra))} in the tool call", hint=hint(tools))
    kind = action.get("type")
    if kind is not None and kind not in _TYPES:
        raise InvalidAction(f"'type' is {kind!r}; a tool call has type 'function' (or omits it)",
                            hint=hint(tools))


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


def _loads(text: str, what: str, hint_text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidAction(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                            hint=hint_text) from None
