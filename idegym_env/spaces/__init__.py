"""Action and observation spaces: tool calls (actions) and unrestricted text (observations)."""

from .object_batch import ObjectBatch, batched_space, is_numeric_space, object_array
from .text import UnicodeText
from .tool_call import (
    TOOL_NAMES,
    TOOLS,
    AnyToolCall,
    BashCall,
    CreateFileCall,
    EditFileCall,
    InvalidAction,
    PatchFileCall,
    ReadFileCall,
    SandboxRequest,
    SubmitCall,
    ToolCall,
    ToolCallSpace,
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
    "SandboxRequest",
    "TOOLS",
    "TOOL_NAMES",
]
