"""The tools as others read them: JSON Schemas (as the LLM APIs take them), one-line signatures and
the hints shown to an agent, the tool list of a prompt. All of it from the tools' own classes."""

from __future__ import annotations

import functools
import json
from typing import Any, Literal

from . import TOOLS

Style = Literal["openai", "responses", "anthropic"]


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
    schema: dict[str, Any] = _clean_schema(TOOLS[tool].arguments_model().model_json_schema())
    schema.setdefault("properties", {})
    schema["additionalProperties"] = False
    return schema


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@functools.cache  # from the tool's class, which never changes: a JSON Schema is ~0.3 ms to make
def signature(tool: str) -> str:
    """One line describing a tool's arguments, e.g. ``read_file(path: string, offset?: integer >= 0)``.
    Every invalid action's message lists them all."""
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


def short_signature(tool: str) -> str:
    """The arguments' names only, e.g. ``read_file(path, offset?, length?)``."""
    schema = arguments_schema(tool)
    required = set(schema.get("required", []))
    return f"{tool}({', '.join(n + ('' if n in required else '?') for n in schema['properties'])})"


def tool_guide(tools: tuple[str, ...]) -> str:
    """``tools`` as a list, for the prompts of text-only frameworks."""
    return "Tools:\n" + "\n".join(f"- {short_signature(t)}: {TOOLS[t].description}" for t in tools)


def example(tool: str) -> str:
    return json.dumps({"tool": tool, "arguments": TOOLS[tool].example}, ensure_ascii=False)


def hint(tools: tuple[str, ...], tool: str | None = None) -> str:
    """What a valid call looks like: of ``tool``, or of any of ``tools``."""
    if tool is not None:
        return f"Expected {signature(tool)}, for example: {example(tool)}"
    sigs = "; ".join(signature(t) for t in tools)
    return f"A valid call looks like {example(tools[0])}. Tools: {sigs}"


def tool_schemas(tools: tuple[str, ...], style: Style = "openai") -> list[dict[str, Any]]:
    """``tools`` as function definitions an LLM API accepts (see ``ToolCallSpace.tool_schemas``)."""
    out: list[dict[str, Any]] = []
    for name in tools:
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
