"""``ToolCallSpace``: the Gymnasium space of tool calls ``{"tool": name, "arguments": {...}}``.

The tools themselves are in ``idegym_env/tools/`` (their JSON Schemas in its ``schemas.py``), how
an LLM's shapes are read in ``parsing.py``; this module is the space: membership, parsing, schemas,
sampling.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Space
from pydantic import ValidationError

from ..tools import TOOL_NAMES, TOOLS, InvalidAction, Sampler, ToolCall, canonical
from ..tools.schemas import Style, tool_schemas
from .parsing import CANONICAL_KEYS, parse_tool_call, plain


class ToolCallSpace(Space[dict]):
    """Tool calls ``{"tool": name, "arguments": {...}}`` for a subset of :data:`TOOL_NAMES`.

    Members are exactly the canonical dicts whose ``tool`` is enabled and whose ``arguments``
    validate strictly against the tool's model (unknown keys, missing required keys, wrong types
    and out-of-range numbers all fail; numpy scalars count as their Python values).

    ``parse(action)`` is the lenient entry point for ``env.step``: it also accepts a
    :class:`ToolCall`, a JSON string (optionally in a Markdown code fence) and the OpenAI /
    Anthropic tool-call shapes, and raises :class:`InvalidAction` with an explanation otherwise.

    ``sample()`` returns valid and harmless calls, seeded by the space's ``np_random``, each from
    its tool's ``sample``: bash commands that only print or list, file writes under
    ``sample_dir``, reads of ``sample_paths`` (which may not exist; the error becomes an
    observation), listings and ``submit``. ``mask`` (int8 array over ``tools``) or
    ``probability`` (float array summing to 1) select the tool. ``tools`` may name a tool by an
    alias (``create_file``).
    """

    def __init__(
        self,
        tools: Iterable[str] | None = None,
        *,
        sample_dir: str = "scratch",
        sample_paths: Sequence[str] = ("README.md", "scratch/notes.txt", "missing.txt"),
        seed: int | np.random.Generator | None = None,
    ) -> None:
        names = tuple(TOOL_NAMES if tools is None else (canonical(t) for t in tools))
        unknown = [t for t in names if t not in TOOL_NAMES]
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
        if not isinstance(x, Mapping) or set(x.keys()) != CANONICAL_KEYS:
            return False
        tool, arguments = x["tool"], x["arguments"]
        if not isinstance(tool, str) or tool not in self.tools or not isinstance(arguments, Mapping):
            return False
        try:
            TOOLS[tool].model_validate({"tool": tool, "arguments": plain(arguments)})
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
        return parse_tool_call(action, self.tools)

    # -- schemas ----------------------------------------------------------------------------------

    def tool_schemas(self, style: Style = "openai") -> list[dict[str, Any]]:
        """The enabled tools as function definitions an LLM API accepts.

        ``"openai"``: Chat Completions, ``[{"type": "function", "function": {name, description,
        parameters}}]``; ``"responses"``: OpenAI Responses, ``[{"type": "function", name,
        description, parameters}]``; ``"anthropic"``: ``[{name, description, input_schema}]``.
        Every call the model makes back is accepted by :meth:`parse`.
        """
        return tool_schemas(self.tools, style)

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
        return {"tool": tool, "arguments": TOOLS[tool].sample(Sampler(rng, self.sample_dir, self.sample_paths))}

    @property
    def is_np_flattenable(self) -> bool:
        return False

    # -- serialization, comparison ----------------------------------------------------------------

    def to_jsonable(self, sample_n: Iterable[Any]) -> list[Any]:
        """Canonical tool-call dicts (JSON objects); :class:`ToolCall` instances are converted."""
        return [x.to_action() if isinstance(x, ToolCall) else json.loads(json.dumps(plain(x)))
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


__all__ = ["ToolCallSpace"]
