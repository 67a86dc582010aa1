"""Action and observation spaces: tool calls (actions) and unrestricted text (observations).

    tools.py      the tools: argument models, validated tool calls, the wire request of each
    parsing.py    reading a tool call out of what an agent or an LLM produced
    schemas.py    JSON Schemas of the tools for LLM APIs, hints for the agent
    tool_call.py  ToolCallSpace, the Gymnasium space
    text.py       UnicodeText, the observation space
    object_batch.py  ObjectBatch, the batched space of text for vector envs
"""

from .object_batch import ObjectBatch, batched_space, is_numeric_space, object_array
from .text import UnicodeText
from .tool_call import ToolCallSpace
from .tools import (
    TOOL_NAMES,
    TOOLS,
    AnyToolCall,
    BashCall,
    CreateFileCall,
    EditFileCall,
    InvalidAction,
    PatchFileCall,
    ReadFileCall,
    SubmitCall,
    ToolCall,
)

__all__ = [
    "UnicodeText",
    "ObjectBatch", "object_array", "is_numeric_space", "batched_space",
    "ToolCallSpace",
    "ToolCall",
    "AnyToolCall",
    "BashCall",
    "CreateFileCall",
    "EditFileCall",
    "PatchFileCall",
    "ReadFileCall",
    "SubmitCall",
    "InvalidAction",
    "TOOLS",
    "TOOL_NAMES",
]
