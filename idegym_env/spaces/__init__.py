"""Action and observation spaces: tool calls (actions) and unrestricted text (observations).

    tool_call.py  ToolCallSpace, the Gymnasium space of the tools (``idegym_env/tools/``)
    parsing.py    reading a tool call out of what an agent or an LLM produced
    text.py       UnicodeText, the observation space
    object_batch.py  ObjectBatch, the batched space of text for vector envs
"""

from ..tools import TOOL_NAMES, TOOLS, AnyToolCall, InvalidAction, ToolCall
from .object_batch import ObjectBatch, batched_space, is_numeric_space, object_array
from .text import UnicodeText
from .tool_call import ToolCallSpace

__all__ = [
    "UnicodeText",
    "ObjectBatch", "object_array", "is_numeric_space", "batched_space",
    "ToolCallSpace",
    "ToolCall",
    "AnyToolCall",
    "InvalidAction",
    "TOOLS",
    "TOOL_NAMES",
]
